"""The state store under many stores per process and many processes at once.

Reproduces the corruption seen in CI: a second `StateStore` opened and closed in a process used to
open and close a descriptor of the database file, which drops every POSIX lock the process holds on
it (the first store's SQLite locks included), so concurrent writers from other processes corrupted
the file or died with "disk I/O error".
"""

from __future__ import annotations

import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

from rlboost.cli.state import StateStore

WRITERS = 3
EVENTS_PER_WRITER = 600

# Each writer keeps one store for its writes and opens (and closes) a second one every 5 writes,
# as the controller, `status` and `gc` do when they run side by side.
_WRITER = textwrap.dedent(
    """
    import sys
    from rlboost.cli.state import StateStore

    path, job_id, writer, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    store = StateStore(__import__("pathlib").Path(path))
    for i in range(n):
        store.add_event(job_id, "stress", detail=f"{writer}:{i}")
        if i % 5 == 0:
            other = StateStore(__import__("pathlib").Path(path))
            other.list_jobs()
            other.close()
    store.close()
    """
)


def test_many_stores_and_processes_lose_nothing_and_keep_the_file_intact(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with StateStore(path) as store:
        job_id = store.create_job("stress", "name: stress\n", "local")

    writers = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), str(job_id), f"w{k}", str(EVENTS_PER_WRITER)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(WRITERS)
    ]
    # Meanwhile this process opens and closes stores in a loop (reads, as `rlboost status` does),
    # while one long-lived store of its own keeps writing.
    mine = 0
    with StateStore(path) as keeper:
        while any(w.poll() is None for w in writers):
            reader = StateStore(path)
            reader.events(job_id)
            reader.close()
            keeper.add_event(job_id, "stress", detail=f"main:{mine}")
            mine += 1

    errors = [w.stderr.read() for w in writers if w.wait() != 0]
    assert not errors, errors

    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        details = [r[0] for r in db.execute("SELECT detail FROM events WHERE type = 'stress'")]
    finally:
        db.close()
    expected = {f"w{k}:{i}" for k in range(WRITERS) for i in range(EVENTS_PER_WRITER)}
    expected |= {f"main:{i}" for i in range(mine)}
    assert len(details) == len(expected)
    assert set(details) == expected
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
