"""A disk that fills up under a running job: the job ends `failed: disk full` with every instance
terminated and recorded, no temp file is left, and every command says so in one line.

Where the test can mount a filesystem (root), RLBOOST_HOME is a small tmpfs and the test fills it
while the job trains: every write of the job (state store, metrics.jsonl, the trainer's logs and
checkpoints) meets the real ENOSPC. Elsewhere the full disk is injected into the CLI's processes
(tests/disk_full_hook/sitecustomize.py: store writes and metrics appends fail until the job's disk
reserve is deleted, as on a real disk); the test prints which it did.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from rlboost.cli.disk import RESERVE_FILE
from rlboost.cli.state import StateStore
from tests.chaos import wait_until_step
from tests.conftest import ROOT, rlboost_pids, run_cli
from tests.test_operate import env, job_file, wait_for

HOOK = Path(__file__).parent / "disk_full_hook"


def _mount_tmpfs(where: Path, size: str) -> bool:
    if os.geteuid() != 0:
        return False
    where.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], check=False)
    return done.returncode == 0


class SmallDisk:
    """RLBOOST_HOME on a disk the test can fill: a real tmpfs, or the injected full disk."""

    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "disk"
        self.real = _mount_tmpfs(self.root, "32m")
        if not self.real:
            self.root.mkdir(parents=True, exist_ok=True)
        self.home = self.root / "home"
        self.trigger = tmp / "disk-is-full"
        self.env = {"RLBOOST_HOME": str(self.home)}
        if not self.real:
            self.env["RLBOOST_TEST_DISK_FULL"] = str(self.trigger)
            self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOK), os.environ.get("PYTHONPATH")) if p)
        print(f"full disk: {'a real 32 MB tmpfs, filled' if self.real else 'injected (cannot mount a tmpfs here)'}")

    def fill(self) -> None:
        if not self.real:
            self.trigger.touch()
            return
        fd = os.open(self.root / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for size in (1 << 20, 4096):  # to the last page
                with contextlib.suppress(OSError):
                    while os.write(fd, b"\0" * size):
                        pass
        finally:
            os.close(fd)
        with pytest.raises(OSError) as e:
            (self.root / f"probe-{uuid.uuid4().hex}").write_bytes(b"\0" * 4096)
        assert e.value.errno == errno.ENOSPC

    def close(self) -> None:
        if self.real:
            subprocess.run(["umount", "-l", str(self.root)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    disk = SmallDisk(tmp_path)
    yield disk
    disk.close()


def cli(disk: SmallDisk, *args: str) -> subprocess.CompletedProcess:
    return run_cli(*args, home=disk.home, env=disk.env, timeout=180)


@pytest.mark.faults  # a real job to its first steps, then four commands on the full disk: ~25 s
def test_a_full_disk_fails_the_job_cleanly_and_every_command_says_so_in_one_line(tmp_path, small_disk):
    name = "disk-full"
    jf = job_file(tmp_path, name)
    out = tmp_path / "launch.out"
    with open(out, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlboost.cli.main", "launch", str(jf)],
            env={**env(small_disk.home), **small_disk.env},
            cwd=ROOT,
            stdout=f,
            stderr=f,
        )
    try:
        wait_until_step(small_disk.home, name, 1)
        assert (small_disk.home / "jobs" / f"{name}-1" / RESERVE_FILE).stat().st_size > 0
        small_disk.fill()
        rc = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = out.read_text(errors="replace")
    assert rc == 1, said
    assert "Traceback" not in said, said
    assert f"error: job {name} failed: disk full" in said, said
    with StateStore(small_disk.home / "state.db") as store:
        job = store.job_by_id(1)
        assert job.status == "failed" and (job.error or "").startswith("disk full"), (job.status, job.error)
        assert "rlboost launch --resume 1" in job.error
        insts = store.instances(1)
        assert insts and [(i.id, i.state) for i in insts if not i.terminal or i.ended_clock is None] == []
    wait_for(lambda: not rlboost_pids(f"RLBOOST_INSTANCE_ID={name}-1-"), "every process of the job to exit", 60)
    assert sorted(str(p) for p in small_disk.home.rglob("*.tmp")) == []  # no half-written checkpoint
    assert not (small_disk.home / "jobs" / f"{name}-1" / RESERVE_FILE).exists()  # used for the last records

    # the disk is still full: each command reads what it can, or says so in one line
    status = cli(small_disk, "status", "1")
    assert status.returncode == 0 and "disk full" in status.stdout, status.stdout + status.stderr
    for args in (["gc"], ["down", "1"]):
        done = cli(small_disk, *args)
        assert "Traceback" not in done.stdout + done.stderr, (args, done.stdout, done.stderr)
        assert done.returncode == 0 or done.stderr.startswith("error: disk full"), (args, done.stdout, done.stderr)
    resumed = cli(small_disk, "launch", "--resume", "1")  # refused before anything is launched
    assert resumed.returncode == 1 and "Traceback" not in resumed.stdout + resumed.stderr, resumed.stderr
    (line,) = resumed.stderr.strip().splitlines()
    assert line.startswith(f"error: job {name} failed: disk full"), line
    with StateStore(small_disk.home / "state.db") as store:
        assert store.job_by_id(1).status == "failed" and store.instances(1) == insts
    assert not rlboost_pids(f"RLBOOST_INSTANCE_ID={name}-1-")


@pytest.mark.faults  # a real job to its first checkpoint: ~15 s
def test_a_full_disk_at_a_checkpoint_ends_the_job_as_disk_full_at_once(tmp_path, home):
    """A checkpoint larger than the room left: the trainer's write meets ENOSPC (torch.save's own error
    over it, injected: tests/disk_full_hook), while the small writes of the controller still fit. The
    job ends `failed: disk full` with its instances terminated, never relaunching the trainer (it used
    to be taken for a lost trainer: relaunched from step 1 until max_restarts)."""
    name = "ckpt-full"
    # the trainer's own engine alone: no spot worker to be preempted before the first checkpoint
    jf = job_file(tmp_path, name, max_workers=0)
    job = yaml.safe_load(jf.read_text())
    job["trainer"]["checkpoint_every"] = 2
    jf.write_text(yaml.safe_dump(job))
    hook = {
        "RLBOOST_TEST_CHECKPOINT_FULL": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, (str(HOOK), os.environ.get("PYTHONPATH")))),
    }
    done = run_cli("launch", str(jf), home=home, env=hook, timeout=240)
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in said, said
    assert f"job {name} failed: disk full on the trainer" in said, said
    with StateStore(home / "state.db") as store:
        row = store.job_by_id(1)
        assert row.status == "failed" and (row.error or "").startswith("disk full on the trainer"), row.error
        assert [e.detail for e in store.events(1) if e.type == "trainer-lost"] == []
        insts = store.instances(1)
        assert [i.id for i in insts if i.role == "trainer"] == [f"{name}-1-trainer"]  # never relaunched
        assert [(i.id, i.state) for i in insts if not i.terminal or i.ended_clock is None] == []
    wait_for(lambda: not rlboost_pids(f"RLBOOST_INSTANCE_ID={name}-1-"), "every process of the job to exit", 60)
