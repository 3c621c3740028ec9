"""What a job file's local path may be: a regular file or a directory of them, never a device, a FIFO,
a socket or a file of /proc or /sys, each of which a copy or a read cannot finish (/dev/zero fills the
disk, a FIFO blocks its reader, /proc/self never ends). Told with stat alone: nothing is opened."""

from __future__ import annotations

import os
import stat
from pathlib import Path

# pseudo-filesystems whose files are made up as they are read: sizes lie, some reads never end
PSEUDO_ROOTS = (Path("/proc"), Path("/sys"))
# entries a directory's check looks at; past that it trusts the rest (a dataset of many small files)
MAX_WALK = 100_000


def _kind(mode: int) -> str | None:
    """The name of a file type rlboost cannot copy or read, or None for a file or a directory."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _pseudo(path: Path) -> Path | None:
    try:
        real = path.resolve()
    except (OSError, RuntimeError):  # a link loop: stat reports it below
        return None
    return next((root for root in PSEUDO_ROOTS if real == root or root in real.parents), None)


def file_kind_problem(path: Path, *, walk: bool = False) -> str | None:
    """Why `path` is no regular file or directory rlboost can read or copy, or None; `walk`: also every
    entry below a directory (at most MAX_WALK of them), as a copy of it reads them all."""
    problem = _one(path, path)
    if problem is not None or not walk or not path.is_dir():
        return problem
    seen = 0
    stack = [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError as e:
            return f"{path}: cannot list {e.filename} ({e.strerror}); fix its permissions"
        for entry in entries:
            seen += 1
            if seen > MAX_WALK:
                return None
            # below a real directory only a link can lead into /proc or /sys
            found = _one(Path(entry.path), path, linked=entry.is_symlink())
            if found is not None:
                return found
            if entry.is_dir(follow_symlinks=False):  # a linked directory is checked, not walked (no loops)
                stack.append(Path(entry.path))
    return None


def _one(path: Path, top: Path, linked: bool = True) -> str | None:
    where = str(path) if path == top else f"{path} (in {top})"
    root = _pseudo(path) if linked else None
    if root is not None:
        return f"{where} is in {root}, whose files the kernel makes up as they are read; give a real file"
    try:
        mode = os.stat(path).st_mode  # follows links, opens nothing (a FIFO would block an open)
    except OSError as e:
        return f"{where}: {e.strerror.lower() if e.strerror else e}; fix or remove it"
    kind = _kind(mode)
    return None if kind is None else f"{where} is {kind}, not a regular file or directory; give a real file"
