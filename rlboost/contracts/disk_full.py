"""A full disk, told the same way on this machine and on a trainer node.

A write that meets a full disk (or an exceeded quota) raises OSError(ENOSPC/EDQUOT), or a library's
own error raised while handling one (torch.save: a RuntimeError over it). A job that meets one ends
as disk full at once: relaunching its trainer would only fill the same disk again.
"""

from __future__ import annotations

import errno

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def full_disk_error(e: BaseException | None) -> OSError | None:
    """The full-disk OSError `e` is, or was raised from or while handling (None: not a full disk)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in FULL_ERRNOS:
            return e
        e = e.__cause__ or e.__context__
    return None
