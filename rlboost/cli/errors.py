"""What the CLI prints for an error it did not expect in a command: the state store or the disk under
it (unusable, full, read-only, not ours to write), as one line that names the thing and the fix.

The CLI's entry point (rlboost/cli/main.py) calls `user_message` for any exception a command lets
out; an exception it gives no message for is a bug, and keeps its traceback. RLBOOST_DEBUG=1 shows
the traceback of every one.
"""

from __future__ import annotations

import errno
import os
import sqlite3

from rlboost.cli.disk import disk_full
from rlboost.cli.state import StateError
from rlboost.contracts.env_names import Env

_READ_ONLY = {errno.EROFS}
_DENIED = {errno.EACCES, errno.EPERM}


def debug() -> bool:
    return os.environ.get(Env.DEBUG, "") not in ("", "0")


def user_message(e: BaseException) -> str | None:
    """One line for an error of the state store or the disk; None for anything else."""
    home = _home()
    if disk_full(e):
        where = f" writing {e.filename}" if isinstance(e, OSError) and e.filename else ""
        return (
            f"disk full{where} (RLBOOST_HOME is {home}): free space there and run the command again; "
            "a job it stopped continues with `rlboost launch --resume ID`"
        )
    if isinstance(e, StateError):
        cause = e.__cause__ or e.__context__  # opening it failed: say what to do about the file
        return _store_message(str(cause), home) if isinstance(cause, sqlite3.DatabaseError) else str(e)
    if isinstance(e, OSError) and e.errno in _READ_ONLY | _DENIED:
        what = e.filename or home
        if e.errno in _READ_ONLY:
            return f"{what} is on a read-only file system: point RLBOOST_HOME at a writable directory"
        return (
            f"permission denied: {what} ({e.strerror}): rlboost needs to read and write RLBOOST_HOME ({home}); "
            "run as its owner or point RLBOOST_HOME elsewhere"
        )
    if isinstance(e, sqlite3.DatabaseError):
        return _store_message(str(e), home)
    if isinstance(e, OSError) and e.errno == errno.EIO:
        return f"I/O error on {e.filename or home}: the disk may be failing or was removed; check it and run again"
    return None


def _store_message(msg: str, home: str) -> str:
    db = os.path.join(home, "state.db")
    low = msg.lower()
    if "readonly" in low or "read-only" in low:
        return f"{db} cannot be written ({msg}): check its owner and mode and RLBOOST_HOME's"
    if "unable to open" in low:
        return f"{db} cannot be opened ({msg}): check that RLBOOST_HOME ({home}) exists and is yours"
    if "malformed" in low or "not a database" in low or "corrupt" in low:
        return (
            f"{db} is damaged ({msg}), e.g. by a copy or write that was cut short: keep it aside "
            "(mv state.db state.db.bad) and check your cloud consoles for instances of jobs it listed"
        )
    if "disk i/o error" in low:
        return f"{db}: disk I/O error: the disk may be full, failing or removed; check it and run again"
    if "locked" in low:
        return f"{db} is locked by another process for too long ({msg}): run the command again"
    return f"{db}: {msg}"


def _home() -> str:
    return os.environ.get(Env.HOME) or os.path.expanduser("~/.rlboost")
