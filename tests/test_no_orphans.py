"""Never leak a paid instance: SIGKILL `rlboost launch` at random points while it launches, then
restart (`rlboost launch` again, or `rlboost gc`) and show that nothing is left running or untracked.

Runs on the local provider, whose instances are real processes in their own sessions: they outlive
the killed controller exactly as cloud instances would.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlboost.cli.state import StateStore
from tests.conftest import ROOT, rlboost_pids, run_cli

pytestmark = pytest.mark.integration

JOB = {
    "name": "leak-check",
    "provider": "local",
    "algorithm": {"steps": 40, "prompts_per_step": 4, "group_size": 2, "warm_start_steps": 5},
    "trainer": {"cloud": "local", "accelerators": "A100:8", "hourly_price": 32.77},
    "rollout": {
        "max_workers": 2,
        "candidates": [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.44, "on_demand_price": 3.67}],
    },
    "local": {"time_scale": 60, "notice_fraction": 0.0},
}


def start(job_file: Path, home: Path) -> subprocess.Popen:
    env = {**os.environ, "RLBOOST_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "rlboost.cli.main", "launch", str(job_file)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def assert_nothing_left(home: Path) -> None:
    marker = f"RLBOOST_INSTANCE_ID={JOB['name']}-"
    deadline = time.monotonic() + 10
    while rlboost_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rlboost_pids(marker) == [], "a process of the job survived"
    store = StateStore(home / "state.db")
    try:
        live = [(i.id, i.state) for i in store.all_instances() if not i.terminal]
        assert live == [], f"instances the store still calls live: {live}"
        assert not [j for j in store.list_jobs() if j.active], "a job is left 'running' with no controller"
    finally:
        store.close()


def _instances(home: Path, role: str | None = None) -> int:
    """How many instances (of `role`) the state store has recorded, over all jobs."""
    if not (home / "state.db").exists():
        return 0
    with StateStore(home / "state.db") as store:
        return sum(1 for i in store.all_instances() if role is None or i.role == role)


def _wait_for_new(home: Path, role: str | None, before: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while _instances(home, role) <= before:
        if time.monotonic() > deadline:
            raise AssertionError(f"no new {role or 'instance'} was recorded in {timeout_s} s")
        time.sleep(0.05)


def test_sigkill_during_launches_leaves_nothing_running_or_untracked(tmp_path, home):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(JOB))
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    # early (whatever was recorded by then), mid (the trainer's launch recorded, so it is starting),
    # late (a worker's launch recorded): the two later points wait on the state store, not on wall
    # time, so on a loaded machine they still land during launches.
    points = [(None, rng.uniform(0.2, 1.5)), ("trainer", rng.uniform(0.0, 0.5)), ("worker", rng.uniform(0.0, 1.0))]
    print(f"seed {seed}: SIGKILL at {[(role or 'start', round(t, 2)) for role, t in points]}")
    for n, (role, t) in enumerate(points):
        before = _instances(home, role)
        proc = start(job_file, home)
        if role is not None:
            _wait_for_new(home, role, before)
        time.sleep(t)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        if n % 2 == 0:
            # restart: a new launch of the same name reconciles its dead predecessor first...
            again = start(job_file, home)
            time.sleep(1.0)
            again.send_signal(signal.SIGKILL)  # ...and is itself killed
            again.wait(timeout=30)
        out = run_cli("gc", "--wait", "30", home=home, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert_nothing_left(home)
    store = StateStore(home / "state.db")
    jobs = store.list_jobs()
    assert len(jobs) >= len(points) - 1  # (a launch killed during start-up may not have recorded its job)
    insts = [i for j in jobs for i in store.instances(j.id)]
    for i in insts:
        print(f"  {i.id}: {i.state} ({i.detail})")
    assert any(i.role == "worker" for i in insts), "the last kill waits for a worker's launch"


def test_down_all_finds_orphans_of_a_killed_controller(tmp_path, home):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({**JOB, "name": "leak-down"}))
    proc = start(job_file, home)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not rlboost_pids("RLBOOST_INSTANCE_ID=leak-down-"):
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert rlboost_pids("RLBOOST_INSTANCE_ID=leak-down-"), "the trainer outlives its controller"
    out = run_cli("down", "--all", home=home, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    deadline = time.monotonic() + 10
    while rlboost_pids("RLBOOST_INSTANCE_ID=leak-down-") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rlboost_pids("RLBOOST_INSTANCE_ID=leak-down-") == []
    store = StateStore(home / "state.db")
    assert all(i.terminal for i in store.all_instances())
    assert not any(j.active for j in store.list_jobs())
    assert "orphan" in run_cli("gc", home=home).stdout  # nothing left: says so


def test_examples_are_real_job_files():
    from rlboost.contracts.spec import load_spec

    for f in (ROOT / "examples").glob("*.yaml"):
        load_spec(f)
