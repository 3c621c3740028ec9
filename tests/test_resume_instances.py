"""`launch --resume` after a controller kill -9, for the instances that changed while no controller
watched: one that exited is billed until it stopped (its last heartbeat), not until the resume; the
workers of a trainer that died with the controller are replaced, not adopted (they would dial the
dead trainer's endpoint and hold fleet slots). Real local processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlboost.cli.state import StateStore
from tests.chaos import kill_instance, wait_until_step
from tests.conftest import rlboost_pids, run_cli
from tests.test_faults_recovery import job_yaml

pytestmark = pytest.mark.faults


def _start(tmp: Path, home: Path, name: str) -> subprocess.Popen:
    job = job_yaml(tmp, name, 1, checkpoint_every=2)
    env = {**os.environ, "RLBOOST_HOME": str(home), "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "rlboost.cli.main", "launch", str(job)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _running_worker(home: Path, name: str, timeout_s: float = 120) -> str:
    """A spot worker the store has seen running and that has beaten its heartbeat file."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with StateStore(home / "state.db") as store:
            job = store.get_job(name)
            for i in store.live_instances(job.id):
                beat = home / "jobs" / f"{name}-{job.id}" / "instances" / i.id / "heartbeat"
                if i.role == "worker" and i.state == "running" and beat.exists():
                    return i.id
        time.sleep(0.05)
    raise AssertionError(f"{name}: no spot worker came up")


def _run_then_kill_the_controller(tmp: Path, home: Path, name: str, step: int) -> str:
    """Launch the job, let it reach `step` with a spot worker up, kill -9 its controller; the worker."""
    ctl = _start(tmp, home, name)
    wait_until_step(home, name, step)
    worker = _running_worker(home, name)
    os.kill(ctl.pid, signal.SIGKILL)
    ctl.wait(10)
    return worker


def _market_clock(home: Path, name: str, job_id: int, wall: float) -> float:
    """The local provider's billing clock at wall time `wall` (these jobs replay at time_scale 1)."""
    t0 = float((home / "jobs" / f"{name}-{job_id}" / "market-t0").read_text())
    return wall - t0


def test_an_instance_that_exits_while_the_controller_is_down_is_billed_until_it_stopped(tmp_path):
    home, name = tmp_path / "home", "billgap"
    worker = _run_then_kill_the_controller(tmp_path, home, name, 2)
    assert kill_instance(worker) > 0
    killed = time.time()
    # the controller stays away a while: the old rule billed the worker for all of it
    gap_s = 8.0
    time.sleep(gap_s)  # the gap being measured, not a wait for an event
    resumed = time.time()
    proc = run_cli("launch", "--resume", name, home=home, timeout=540)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    store = StateStore(home / "state.db")
    job = store.get_job(name)
    rec = store.instance(worker)
    assert rec.state == "exited" and "gone while the controller was down" in rec.detail, rec
    kill_clock = _market_clock(home, name, job.id, killed)
    # its last heartbeat came at most ~1 s (plus a loaded machine's delay) before the kill
    assert kill_clock - 3.0 <= rec.ended_clock <= kill_clock + 0.5, (rec.ended_clock, kill_clock)
    assert rec.ended_clock < _market_clock(home, name, job.id, resumed) - gap_s + 3.0
    assert rlboost_pids(f"RLBOOST_RUN_DIR={home}") == []


def test_a_resume_that_relaunches_the_trainer_replaces_the_old_workers(tmp_path):
    home, name = tmp_path / "home", "newtrainer"
    worker = _run_then_kill_the_controller(tmp_path, home, name, 3)
    with StateStore(home / "state.db") as store:
        job = store.get_job(name)
        trainer = [i.id for i in store.instances(job.id) if i.role == "trainer"][-1]
    assert kill_instance(trainer) > 0
    proc = run_cli("launch", "--resume", name, home=home, timeout=540)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    store = StateStore(home / "state.db")
    job = store.get_job(name)
    assert job.status == "succeeded"
    replaced = [e for e in store.events(job.id) if e.type == "worker-replaced"]
    assert [e.instance_id for e in replaced] == [worker]
    assert store.instance(worker).state == "terminated"
    trainers = [i for i in store.instances(job.id) if i.role == "trainer"]
    assert [t.id for t in trainers] == [trainer, f"{name}-{job.id}-trainer-r1"]
    # the old worker ended before the new trainer served: it held no fleet slot while dialling the dead one
    assert store.instance(worker).ended_clock <= trainers[-1].started_clock
    assert rlboost_pids(f"RLBOOST_RUN_DIR={home}") == []
