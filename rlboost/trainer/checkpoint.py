"""Trainer checkpoints: everything needed to continue with nothing repeated or skipped.

A checkpoint taken after step k's update holds the model and optimizer, the next step (k+1), the
prompt sampler's RNG state and the per-step history. Writes are atomic (temp file + rename, then
fsync of the directory), so a kill at any moment leaves the previous checkpoint intact. A full disk
is raised as the OSError(ENOSPC) it is, whatever torch wrapped it in: it ends the job
(rlboost/trainer/runtime.py), where a crash would relaunch the trainer to fill the disk again.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlboost.contracts.disk_full import full_disk_error

_NAME = re.compile(r"^ckpt-(\d{8})\.pt$")


@dataclass
class Checkpoint:
    next_step: int
    payload: dict[str, Any]
    path: Path


def save(directory: Path, next_step: int, payload: dict[str, Any], keep: int = 2) -> Path:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    final = directory / f"ckpt-{next_step:08d}.pt"
    tmp = directory / f".ckpt-{next_step:08d}.pt.tmp"
    try:
        with open(tmp, "wb") as f:
            torch.save({"next_step": next_step, "payload": payload}, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, final)
    except BaseException as e:  # a full disk, a signal: a half-written checkpoint only takes room
        tmp.unlink(missing_ok=True)
        full = full_disk_error(e)
        if full is not None and full is not e:  # torch.save's own error over it: said as the full disk it is
            raise OSError(full.errno, full.strerror, str(final)) from e
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    for old in _listed(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def load_latest(directory: Path) -> Checkpoint | None:
    """The newest readable checkpoint, or None. A torn file (impossible with rename, but a disk
    can lie) is skipped in favour of the previous one."""
    for path in reversed(_listed(directory)):
        try:
            data = torch.load(path, map_location="cpu", weights_only=False)
        except Exception:
            continue
        return Checkpoint(int(data["next_step"]), data["payload"], path)
    return None


def _listed(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.match(p.name))
