from __future__ import annotations

import errno

import numpy as np
import pytest
import torch

from rlboost.trainer import checkpoint


def test_round_trip_and_keep(tmp_path):
    rng = np.random.default_rng(5)
    rng.random(3)
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, step, {"w": torch.full((2,), float(step)), "rng": rng.bit_generator.state})
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ckpt-00000002.pt", "ckpt-00000003.pt"]
    ck = checkpoint.load_latest(tmp_path)
    assert ck is not None and ck.next_step == 3 and torch.equal(ck.payload["w"], torch.full((2,), 3.0))
    r2 = np.random.default_rng()
    r2.bit_generator.state = ck.payload["rng"]
    assert r2.random() == rng.random()  # the sampler continues exactly where it was


def test_torn_newest_falls_back(tmp_path):
    checkpoint.save(tmp_path, 1, {"a": 1})
    (tmp_path / "ckpt-00000002.pt").write_bytes(b"\x00garbage")
    ck = checkpoint.load_latest(tmp_path)
    assert ck is not None and ck.next_step == 1


def test_empty_dir(tmp_path):
    assert checkpoint.load_latest(tmp_path / "none") is None


class _DiskFull:
    """A payload whose writing fails part-way, as on a full disk (torch.save has opened the file)."""

    def __reduce__(self):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_write_that_fails_leaves_no_temp_file_and_the_previous_checkpoint(tmp_path):
    checkpoint.save(tmp_path, 1, {"a": 1})
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(tmp_path, 2, {"w": torch.zeros(4096), "then": _DiskFull()})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000001.pt"]
    ck = checkpoint.load_latest(tmp_path)
    assert ck is not None and ck.next_step == 1
