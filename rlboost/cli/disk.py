"""A full disk: how to tell, and room kept for a job's last records.

SQLite cannot write a byte on a full disk, so a controller that meets one could neither close its
instance records nor mark the job ended. Each running controller therefore holds a small reserve
file in its run directory (on RLBOOST_HOME's disk, beside the state store); on a full disk it
terminates the job's instances first (nothing of the job writes any more), then deletes the reserve
and writes its final records into the room it leaves.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
from pathlib import Path

from rlboost.contracts.disk_full import full_disk_error

RESERVE_FILE = ".disk-reserve"
# Room for the last records: a write appends ~4 pages (16 KiB) to the store's WAL; one per instance
# closed and event added, with margin for a large fleet.
RESERVE_BYTES = 1024 * 1024


def disk_full(e: BaseException | None) -> bool:
    """Is `e` (or an error it was raised from, or while handling) a full disk or an exceeded quota?"""
    if full_disk_error(e) is not None:
        return True
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, sqlite3.OperationalError) and (
            getattr(e, "sqlite_errorcode", None) == getattr(sqlite3, "SQLITE_FULL", 13)
            or "database or disk is full" in str(e)
        ):
            return True
        e = e.__cause__ or e.__context__
    return False


def no_room(path: Path) -> bool:
    """Is the disk that holds `path` full (less than a page left to this user)?"""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 4096


def reserve_room(run_dir: Path) -> None:
    """Keep RESERVE_BYTES in `run_dir` for the job's last records (kept if already there). Raises
    OSError(ENOSPC) unless as much again stays free beside it: a job started that near a full disk
    would only launch instances to fail at once. Random bytes: a compressing filesystem would store
    zeros in no space."""
    path = run_dir / RESERVE_FILE
    with contextlib.suppress(OSError):
        if path.stat().st_size >= RESERVE_BYTES:
            return
    st = os.statvfs(run_dir)
    free = st.f_bavail * st.f_frsize
    if free < 2 * RESERVE_BYTES:
        raise OSError(
            errno.ENOSPC,
            f"{free / 2**20:.1f} MiB free where {run_dir} is; a job needs at least {2 * RESERVE_BYTES >> 20} MiB "
            f"(rlboost keeps {RESERVE_BYTES >> 20} MiB of it to record the job's end on a full disk)",
        )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(os.urandom(RESERVE_BYTES))
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        path.unlink(missing_ok=True)  # half a reserve holds space and helps no one
        raise


def release_room(run_dir: Path) -> bool:
    """Delete the reserve, making its room free; False when there was none."""
    try:
        (run_dir / RESERVE_FILE).unlink()
    except FileNotFoundError:
        return False
    return True
