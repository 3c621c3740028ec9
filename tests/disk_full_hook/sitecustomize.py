"""Test-only, for machines where the test cannot mount a small filesystem (not root): a full disk
injected into the rlboost processes that have this directory on PYTHONPATH (tests/test_disk_full.py).

Once the file named by RLBOOST_TEST_DISK_FULL exists, the disk is "full" for as long as a job's disk
reserve (rlboost/cli/disk.py) is still there, as it would be: every state-store write fails as SQLite
fails on a full disk, and so do metrics.jsonl appends and new reserves. Deleting the reserve is what
makes room, as on a real disk. With RLBOOST_TEST_CHECKPOINT_FULL set, only the trainer's checkpoint
writes fail, as torch.save fails on a full disk (a checkpoint larger than the room left).
"""

from __future__ import annotations

import errno
import os
import sqlite3
import sys
from contextlib import contextmanager
from pathlib import Path

_TRIGGER = os.environ.get("RLBOOST_TEST_DISK_FULL")


def _full() -> bool:
    if not _TRIGGER or not os.path.exists(_TRIGGER):
        return False
    return any(Path(os.environ["RLBOOST_HOME"]).glob("jobs/*/.disk-reserve"))


def _install() -> None:
    from rlboost.cli import disk, metrics_sinks, state

    tx = state.StateStore._tx

    @contextmanager
    def full_tx(self):  # type: ignore[no-untyped-def]
        if _full():
            raise sqlite3.OperationalError("database or disk is full")
        with tx(self) as db:
            yield db

    write = metrics_sinks.JsonlSink.write

    def full_write(self, row):  # type: ignore[no-untyped-def]
        if _full():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        write(self, row)

    reserve = disk.reserve_room

    def full_reserve(run_dir):  # type: ignore[no-untyped-def]
        if _TRIGGER and os.path.exists(_TRIGGER):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run_dir / disk.RESERVE_FILE))
        reserve(run_dir)

    state.StateStore._tx = full_tx  # type: ignore[method-assign]
    metrics_sinks.JsonlSink.write = full_write  # type: ignore[method-assign]
    disk.reserve_room = full_reserve


def _install_checkpoint_full() -> None:
    """The trainer's checkpoint writes meet a full disk as torch.save meets one: its own error, raised
    while handling the OSError (RLBOOST_TEST_CHECKPOINT_FULL; nothing else of the job is full)."""
    import torch

    def full_save(obj, f, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 768 vs 662") from None

    torch.save = full_save


if _TRIGGER and "rlboost.cli.main" in getattr(sys, "orig_argv", []):  # the CLI only, not its nodes
    _install()
if os.environ.get("RLBOOST_TEST_CHECKPOINT_FULL") and "rlboost.trainer" in getattr(sys, "orig_argv", []):
    _install_checkpoint_full()
