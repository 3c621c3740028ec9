"""A state store or a disk rlboost cannot use: every command says so in one line (what, and what to
do), exits 1, prints no traceback; RLBOOST_DEBUG=1 shows the traceback."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from rlboost.cli.detach import controller_log
from rlboost.cli.errors import user_message
from rlboost.cli.state import SCHEMA_VERSION, StateStore
from tests.conftest import ROOT, run_cli

JOB_FILE = str(ROOT / "examples" / "local.yaml")
COMMANDS = [["status", "--json"], ["gc"], ["down", "--all"], ["launch", "--resume", "1"], ["launch", JOB_FILE]]


def assert_one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and all(n in line for n in needles), line
    return line


def newer_store(home: Path, version: str = "9.9.0", schema: int = 99) -> None:
    StateStore(home / "state.db").close()
    db = sqlite3.connect(home / "state.db")
    db.execute("UPDATE meta SET value = ? WHERE key = 'written_by'", (version,))
    db.execute(f"PRAGMA user_version = {schema}")
    db.commit()
    db.close()


def _id(cmd: list[str]) -> str:
    return " ".join(a if a != JOB_FILE else "JOB" for a in cmd)


@pytest.mark.integration
@pytest.mark.parametrize("cmd", COMMANDS, ids=_id)
def test_a_store_of_a_newer_rlboost_names_the_version_and_the_fix(home, cmd):
    newer_store(home)
    assert_one_line(run_cli(*cmd, home=home), "written by rlboost 9.9.0", "schema 99", "upgrade rlboost")


@pytest.mark.integration
def test_a_newer_store_without_a_version_record_still_says_newer(home):
    StateStore(home / "state.db").close()
    db = sqlite3.connect(home / "state.db")
    db.execute("DROP TABLE meta")  # as a schema after 5 might have changed it
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    assert_one_line(run_cli("status", home=home), "written by a newer rlboost", f"schema {SCHEMA_VERSION + 1}")


@pytest.mark.integration
def test_rlboost_debug_shows_the_traceback(home):
    newer_store(home)
    proc = run_cli("status", home=home, env={"RLBOOST_DEBUG": "1"})
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "StateError" in proc.stderr, proc.stderr


@pytest.mark.integration
@pytest.mark.parametrize("cmd", [["status"], ["launch", "--resume", "1"]], ids=_id)
def test_a_file_that_is_not_a_store(home, cmd):
    home.mkdir(mode=0o700)
    (home / "state.db").write_bytes(os.urandom(8192))
    assert_one_line(run_cli(*cmd, home=home), "state.db is damaged", "not a database")


@pytest.mark.integration
def test_a_store_cut_short_by_an_interrupted_write_or_copy(home):
    store = StateStore(home / "state.db")
    for i in range(100):
        store.update_job(store.create_job(f"job-{i}", "x" * 2000, "local"), status="failed")
    store.close()
    with open(home / "state.db", "r+b") as f:
        f.truncate(os.path.getsize(home / "state.db") // 2)
    assert_one_line(run_cli("status", home=home), "state.db is damaged", "malformed", "cut short")


def _a_job_ended(home: Path) -> None:
    """A store with one ended job, its events and its run directory, as a run leaves them."""
    store = StateStore(home / "state.db")
    jid = store.create_job("ro-job", "name: ro-job\n", "local")
    store.add_event(jid, "trainer-up", "http://127.0.0.1:1")
    store.update_job(jid, status="stopped", ended_at=time.time())
    store.close()
    run_dir = home / "jobs" / f"ro-job-{jid}"
    run_dir.mkdir(parents=True)
    controller_log(run_dir).write_text("controller: trainer-up\n")


def damage_events(home: Path) -> None:
    """A store whose events lost a page (a write or copy cut short mid-file) while its job rows read
    fine: only an integrity check finds it, until a command reaches that page."""
    store = StateStore(home / "state.db")
    jid = store.create_job("old", "name: old\n", "local")
    store.update_job(jid, status="stopped", ended_at=time.time())
    for _ in range(200):
        store.add_event(jid, "note", "x" * 500)
    store.close()
    db = sqlite3.connect(home / "state.db")
    (page,) = db.execute("SELECT MAX(pageno) FROM dbstat WHERE name = 'events' AND pagetype = 'internal'").fetchone()
    page = (
        page or db.execute("SELECT MIN(pageno) FROM dbstat WHERE name = 'events' AND pagetype = 'leaf'").fetchone()[0]
    )
    (size,) = db.execute("PRAGMA page_size").fetchone()
    db.close()
    with open(home / "state.db", "r+b") as f:
        f.seek((page - 1) * size)
        f.write(b"\xa5" * size)


@pytest.mark.integration
@pytest.mark.parametrize(
    "cmd",
    [["status"], ["status", "1"], ["cost-report"], ["logs", "1"], ["rm", "1", "--yes"], ["gc"], *COMMANDS[2:]],
    ids=_id,
)
def test_a_store_with_a_damaged_page_is_refused_by_every_command(home, cmd):
    """`status` and `launch` alike (a launch used to run a whole job into it), in the same one line."""
    damage_events(home)
    assert_one_line(run_cli(*cmd, home=home), "state.db is damaged", "malformed")


def test_a_missing_or_empty_store_beside_old_run_directories_continues_their_ids(home):
    """A store deleted (or left empty) beside `jobs/`: new ids go past every run directory there, so
    a launch never finds its new job's directory taken."""
    store = StateStore(home / "state.db")
    for name in ("a", "b-2"):
        jid = store.create_job(name, f"name: {name}\n", "local")
        store.update_job(jid, status="stopped")
        (home / "jobs" / f"{name}-{jid}").mkdir(parents=True)
    store.close()
    (home / "state.db").unlink()
    store = StateStore(home / "state.db")
    assert store.create_job("a", "name: a\n", "local") == 3
    store.close()
    for suffix in ("", "-wal", "-shm"):
        (home / f"state.db{suffix}").unlink(missing_ok=True)
    (home / "state.db").write_bytes(b"")  # empty: SQLite reads it as a new store
    store = StateStore(home / "state.db")
    assert store.create_job("a", "name: a\n", "local") == 3  # its run dir is not there: 3 is free
    store.close()


@pytest.fixture
def unwritable_home(tmp_path):
    """An RLBOOST_HOME rlboost may not write, with one ended job in it: a read-only filesystem (as
    root, which any mode lets write) or, for anyone else, a directory without write permission."""
    home = tmp_path / "ro-home"
    home.mkdir()
    _a_job_ended(home)
    if os.geteuid() != 0:
        home.chmod(0o500)
        yield home, "permission denied"
        home.chmod(0o700)
        return
    ro = subprocess.run(["mount", "--bind", "-o", "ro", str(home), str(home)], check=False)
    if ro.returncode != 0:
        pytest.skip("root, but cannot mount a read-only filesystem here")
    # a bind mount is read-only only after a remount on some kernels
    subprocess.run(["mount", "-o", "remount,bind,ro", str(home)], check=False)
    try:
        yield home, "read-only"
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)


@pytest.mark.integration
@pytest.mark.parametrize("cmd", [["launch", JOB_FILE], ["rm", "1", "--yes"]], ids=_id)
def test_a_home_rlboost_cannot_write(unwritable_home, cmd):
    home, needle = unwritable_home
    line = assert_one_line(run_cli(*cmd, home=home), str(home))
    assert needle in line or "cannot be written" in line or "cannot be opened" in line, line


@pytest.mark.integration
@pytest.mark.parametrize("cmd", [["status"], ["status", "1"], ["logs", "1"], ["cost-report"]], ids=_id)
def test_read_only_commands_read_a_home_rlboost_cannot_write(unwritable_home, cmd):
    home, _ = unwritable_home
    out = run_cli(*cmd, home=home)
    assert out.returncode == 0 and "error" not in out.stderr, (out.stdout, out.stderr)
    assert "ro-job" in out.stdout or "trainer-up" in out.stdout or "$" in out.stdout, out.stdout


def test_an_unwritable_store_is_opened_read_only(tmp_path, monkeypatch):
    """The path taken where the store may not be written (as root on a writable disk too, where the
    fixture above needs a mount): it reads, and a write fails as a read-only database, not silently."""
    from rlboost.cli import state

    _a_job_ended(tmp_path)
    monkeypatch.setattr(state, "writable", lambda path: False)
    store = StateStore(tmp_path / "state.db")
    assert store.read_only and [j.name for j in store.list_jobs()] == ["ro-job"]
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        store.update_job(1, status="failed")
    assert store.job_by_id(1).status == "stopped"
    store.close()


@pytest.mark.parametrize(
    "err, needles",
    [
        (OSError(errno.ENOSPC, "No space left on device", "/h/jobs/x/metrics.jsonl"), ["disk full writing", "metrics"]),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), ["disk full", "free space"]),
        (sqlite3.OperationalError("database or disk is full"), ["disk full", "free space"]),
        (OSError(errno.EACCES, "Permission denied", "/h/state.db"), ["permission denied: /h/state.db", "owner"]),
        (OSError(errno.EROFS, "Read-only file system", "/h/jobs"), ["/h/jobs is on a read-only file system"]),
        (sqlite3.OperationalError("attempt to write a readonly database"), ["cannot be written", "mode"]),
        (sqlite3.OperationalError("disk I/O error"), ["disk I/O error"]),
        (OSError(errno.EIO, "Input/output error", "/h/state.db"), ["I/O error on /h/state.db"]),
    ],
)
def test_each_store_or_disk_error_has_its_line(monkeypatch, err, needles):
    monkeypatch.setenv("RLBOOST_HOME", "/h")
    msg = user_message(err)
    assert msg is not None and "\n" not in msg and all(n in msg for n in needles), msg


def test_an_error_that_is_a_bug_keeps_its_traceback():
    assert user_message(ValueError("a bug")) is None
    assert user_message(OSError(errno.ECONNREFUSED, "refused")) is None
