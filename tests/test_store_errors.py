"""A state store or a disk rlboost cannot use: every command says so in one line (what, and what to
do), exits 1, prints no traceback; RLBOOST_DEBUG=1 shows the traceback."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

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


@pytest.fixture
def unwritable_home(tmp_path):
    """An RLBOOST_HOME rlboost may not write: a read-only filesystem (as root, which any mode lets
    write) or, for anyone else, a directory without write permission."""
    home = tmp_path / "ro-home"
    home.mkdir()
    StateStore(home / "state.db").close()
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
@pytest.mark.parametrize("cmd", [["status"], ["launch", JOB_FILE]], ids=_id)
def test_a_home_rlboost_cannot_write(unwritable_home, cmd):
    home, needle = unwritable_home
    line = assert_one_line(run_cli(*cmd, home=home), str(home))
    assert needle in line or "cannot be written" in line or "cannot be opened" in line, line


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
