"""`launch --resume` wastes nothing (issue 56): a controller killed (kill -9) at any moment of the
trainer's launch and enrolment is resumed by one that enrols the trainer already booting, never a
second one; and the launch options (`--record-rollouts`) come back with the job.

Each kill lands at a pause point the controller honours (RLBOOST_TEST_PAUSE_AT, rlboost/cli/pause_points.py),
and a trainer held "booting" is held by a gate file it waits on before Python runs anything of ours:
no kill depends on timing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlboost.cli.pause_points import TRAINER_ENROLLED, TRAINER_ENROLLING, TRAINER_LAUNCHED
from rlboost.cli.state import StateStore
from tests.chaos import instance_pids, signal_groups, wait_until_step
from tests.conftest import rlboost_pids, run_cli
from tests.test_local_job import check_rollouts, load_rollouts, trainer_dir, write_job

pytestmark = pytest.mark.faults

STEPS = 6
# a trainer process runs this before anything of ours while the gate file exists: it is booting
GATE = """
import os, time
if os.environ.get("RLBOOST_INSTANCE_ID", "").endswith("-trainer"):
    while os.path.exists(os.environ["TEST_TRAINER_GATE"]):
        time.sleep(0.02)
"""


def small_job(tmp: Path, name: str) -> Path:
    path = write_job(tmp, name, max_workers=0)  # the trainer's own engine alone: the trainer is the subject
    spec = yaml.safe_load(path.read_text())
    spec["algorithm"]["steps"] = STEPS
    spec["trainer"]["checkpoint_every"] = 2
    path.write_text(yaml.safe_dump(spec))
    return path


def cli_env(home: Path, **more: str) -> dict[str, str]:
    return {**os.environ, "RLBOOST_HOME": str(home), "COLUMNS": "200", "PYTHONUNBUFFERED": "1", **more}


def wait_for(what: str, done, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    """Until `done()`, while `proc` runs (its end first is the failure: what it never reached)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert proc.poll() is None, f"the controller ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.05)


def events(home: Path, name: str) -> list[str]:
    with StateStore(home / "state.db") as store:
        return [e.type for e in store.events(store.get_job(name).id)]


@pytest.mark.parametrize(
    "phase,pause",
    [
        ("launched", TRAINER_LAUNCHED),
        ("booting", TRAINER_LAUNCHED),  # killed there with the trainer held booting until the resume reattached
        ("waiting for enrolment", TRAINER_ENROLLING),
        ("enrolled", TRAINER_ENROLLED),
    ],
)
def test_a_controller_killed_while_its_trainer_starts_resumes_with_that_trainer(tmp_path, phase, pause):
    home = tmp_path / "home"
    name = "enrolkill"
    run_dir = home / "jobs" / f"{name}-1"
    gate = tmp_path / "gate"
    more = {"RLBOOST_TEST_PAUSE_AT": pause}
    if phase == "booting":
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / "sitecustomize.py").write_text(GATE)
        gate.write_text("closed")
        path = os.pathsep.join(p for p in (str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")) if p)
        more |= {"PYTHONPATH": path, "TEST_TRAINER_GATE": str(gate)}
    cmd = [sys.executable, "-m", "rlboost.cli.main", "launch", str(small_job(tmp_path, name)), "--record-rollouts"]
    ctl = subprocess.Popen(cmd, env=cli_env(home, **more), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(f"it paused at {pause}", (run_dir / f"paused-{pause}").exists, ctl)
        trainer = run_dir / "instances" / f"{name}-1-trainer"
        if phase == "booting":
            assert instance_pids(f"{name}-1-trainer") and not (trainer / "endpoint").exists()
        os.kill(ctl.pid, signal.SIGKILL)
        ctl.wait(10)
    finally:
        if ctl.poll() is None:
            ctl.kill()
    resume = subprocess.Popen(
        [sys.executable, "-m", "rlboost.cli.main", "launch", "--resume", name],
        env=cli_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        if phase == "booting":  # the resumed controller found it booting: it may go on now
            wait_for("the resume reattached", lambda: "reattached" in events(home, name), resume)
            assert not (trainer / "endpoint").exists()
            gate.unlink()
        out, _ = resume.communicate(timeout=540)
    finally:
        if resume.poll() is None:
            resume.kill()
    assert resume.returncode == 0, out
    with StateStore(home / "state.db") as store:
        job = store.get_job(name)
        assert job.status == "succeeded", job.error
        trainers = [i.id for i in store.instances(job.id) if i.role == "trainer"]
        assert trainers == [f"{name}-1-trainer"], trainers  # launched once, and that one trained the job
        assert "trainer-lost" not in events(home, name)
        assert all(i.terminal for i in store.instances(job.id))
        assert f"trainer {name}-1-trainer is still running: it carries on where it is, no step runs again" in out
        check_rollouts(load_rollouts(trainer_dir(home, name, job.id)), yaml.safe_load(job.spec_yaml))
    assert not list((run_dir / "tls" / "enrol").glob("*.key"))  # the key went once the trainer served
    assert rlboost_pids(f"RLBOOST_RUN_DIR={home}") == []


def test_resume_keeps_record_rollouts_for_a_relaunched_trainer(tmp_path):
    """Launched with --record-rollouts, resumed without it after the controller and its trainer both
    died: the relaunched trainer records too, so rollouts.jsonl has every step (issue 56: it stopped)."""
    home = tmp_path / "home"
    name = "keepopts"
    cmd = [sys.executable, "-m", "rlboost.cli.main", "launch", str(small_job(tmp_path, name)), "--record-rollouts"]
    ctl = subprocess.Popen(cmd, env=cli_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_step(home, name, 3)  # past the checkpoint after step 2
        pids = instance_pids(f"{name}-1-trainer")
        assert pids and signal_groups(pids, signal.SIGSTOP)  # frozen: it cannot finish the job meanwhile
        os.kill(ctl.pid, signal.SIGKILL)
        ctl.wait(10)
        signal_groups(pids, signal.SIGKILL)
    finally:
        if ctl.poll() is None:
            ctl.kill()
    proc = run_cli("launch", "--resume", name, home=home, timeout=540)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with StateStore(home / "state.db") as store:
        job = store.get_job(name)
        assert job.status == "succeeded", job.error
        trainers = [i.id for i in store.instances(job.id) if i.role == "trainer"]
        assert trainers == [f"{name}-1-trainer", f"{name}-1-trainer-r1"]  # the resume relaunched it
        records = trainer_dir(home, name, job.id)
        check_rollouts(load_rollouts(records), yaml.safe_load(job.spec_yaml))
    assert (records / "final.safetensors").exists()
    assert "(recording rollouts, as launched)" in proc.stdout
