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


def _torch_on_a_full_disk(obj, f, *args, **kwargs):
    """torch.save on a full disk: its own RuntimeError, raised while handling the OSError (as measured
    on a full tmpfs: "[enforce fail at inline_container.cc:672] . unexpected pos ...")."""
    f.write(b"PK\x03\x04")
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 768 vs 662")  # noqa: B904


def test_a_full_disk_under_torch_save_is_raised_as_the_full_disk_it_is(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint.torch, "save", _torch_on_a_full_disk)
    with pytest.raises(OSError) as e:
        checkpoint.save(tmp_path, 3, {"w": torch.zeros(4)})
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "ckpt-00000003.pt")
    assert list(tmp_path.iterdir()) == []  # no half-written temp file


@pytest.mark.parametrize(
    "err, ends",
    [
        (OSError(errno.ENOSPC, "No space left on device", "/run/ckpt-00000003.pt"), True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
        (ValueError("a bug"), False),
        (OSError(errno.ECONNRESET, "reset"), False),
    ],
)
def test_a_full_disk_anywhere_in_the_trainer_ends_the_job_a_crash_relaunches_it(err, ends):
    """The trainer's verdict the controller reads (phase failed): a full disk ends the job as disk full
    at once (a relaunch would fill it again); a crash is left to relaunch the trainer."""
    from rlboost.trainer.job_end import ends_the_job

    why = ends_the_job(err)
    assert (why is not None) == ends
    if ends:
        assert why.startswith("disk full on the trainer") and "launch --resume" in why, why
