"""How the state store's file is opened: created private, read-only where it may not be written,
checked for damage; and the run directories beside it (rlboost/cli/state.py)."""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path


def private_file(path: Path) -> None:
    """Create `path` as 0600 before SQLite opens it (SQLite gives -wal/-shm the same mode).

    An existing file is never opened here: closing *any* descriptor of a file releases every POSIX
    lock this process holds on it, so an open-and-close beside a live connection would silently drop
    that connection's SQLite locks and let another process corrupt the database (SQLite's "How To
    Corrupt" §2.2). O_EXCL makes creation the only case that opens a descriptor, and a file that did
    not exist cannot be locked by anyone yet.
    """
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except FileExistsError:
        pass
    else:
        os.close(fd)
    os.chmod(path, 0o600)


def open_db(path: Path, *, read_only: bool) -> sqlite3.Connection:
    """The store's connection (WAL; read-only: as it lies), after SQLite's cheap integrity check."""
    if not read_only:
        private_file(path)
    db = connect_read_only(path) if read_only else connect(str(path))
    db.row_factory = sqlite3.Row
    quick_check(db)
    if not read_only:
        for pragma in ("journal_mode=WAL", "foreign_keys=ON", "synchronous=NORMAL"):
            db.execute(f"PRAGMA {pragma}")
    return db


def writable(path: Path) -> bool:
    """May this process write the store: its directory (SQLite makes -wal and -shm beside it) and the
    file? `os.access` says no on a read-only file system, to root too."""
    if not os.access(path.parent, os.W_OK):
        return False
    return not path.exists() or os.access(path, os.W_OK)


def connect(where: str, *, uri: bool = False) -> sqlite3.Connection:
    return sqlite3.connect(where, uri=uri, timeout=30.0, isolation_level=None, check_same_thread=False)


def connect_read_only(path: Path) -> sqlite3.Connection:
    """The store opened for reading only (`status`, `logs`, `cost-report` on a home rlboost may not
    write). A WAL store closed cleanly has no -shm file, which a read-only open needs made unless the
    file is taken as unchanging (`immutable`): nothing can change it where nobody may write."""
    uri = f"{path.resolve().as_uri()}?mode=ro"
    db = connect(uri, uri=True)
    try:
        db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError:
        db.close()
        db = connect(f"{uri}&immutable=1", uri=True)
    return db


def quick_check(db: sqlite3.Connection) -> None:
    """Raise the damage SQLite's own cheap check finds (pages cut off, broken b-trees): a store cut
    short reads as fine until a command reaches a lost page, and loses what it writes there."""
    rows = [str(r[0]) for r in db.execute("PRAGMA quick_check(3)").fetchall() if r[0] != "ok"]
    # one line: a row may hold several ("*** in database main ***" first)
    problems = [ln.strip() for r in rows for ln in r.splitlines() if ln.strip() and not ln.startswith("***")]
    if rows:
        raise sqlite3.DatabaseError("; ".join(["database disk image is malformed", *problems[:2]]))


_RUN_ID = re.compile(r"-(\d+)$")


def highest_run_id(jobs_dir: Path) -> int:
    """The highest job id a run directory in `jobs_dir` (`NAME-ID`) carries (0: none)."""
    try:
        names = os.listdir(jobs_dir)
    except OSError:
        return 0
    return max((int(m.group(1)) for n in names if (m := _RUN_ID.search(n))), default=0)
