"""A full disk: how to tell."""

from __future__ import annotations

import errno
import sqlite3

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


def disk_full(e: BaseException | None) -> bool:
    """Is `e` (or an error it was raised from, or while handling) a full disk or an exceeded quota?"""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return True
        if isinstance(e, sqlite3.OperationalError) and (
            getattr(e, "sqlite_errorcode", None) == getattr(sqlite3, "SQLITE_FULL", 13)
            or "database or disk is full" in str(e)
        ):
            return True
        e = e.__cause__ or e.__context__
    return False
