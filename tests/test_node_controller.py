"""`controller: trainer`: the job's controller runs on its trainer node and is operated from here.

The local provider stands in for the trainer node (a directory with its own RLBOOST_HOME and a
controller process in its own session). Tests force the event (a signal, `down`, a SIGKILL of the
node's controller, the node's directory removed) and wait on state; none sleeps for an outcome.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from rlboost.cli import control_api as api
from rlboost.cli.node_client import NodeClient, node_run_dir, read_address, sync
from rlboost.cli.node_control import ControlServer
from rlboost.cli.pids import controller_alive
from rlboost.cli.state import StateStore, StepMetrics
from rlboost.contracts.spec import SpecError, parse_spec
from tests.conftest import ROOT, rlboost_pids, run_cli, run_json
from tests.test_operate import PY, Lines, env, job_file, terminal_signals, wait_for

# ---- the endpoint and the copy, in one process ---------------------------------------------------


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A node store with one job (id 7, as the launching machine numbered it) and its endpoint."""
    home = tmp_path / "node-home"
    monkeypatch.setenv("RLBOOST_HOME", str(home))
    store = StateStore()
    job_id = store.create_job("nodey", "name: nodey\ncontroller: trainer\n", "local", job_id=7)
    run_dir = home / "jobs" / "nodey-7"
    run_dir.mkdir(parents=True)
    (run_dir / "controller.log").write_text("controller pid 1\n[local] a line with [brackets]\n")
    server = ControlServer(job_id, run_dir, "tok")
    server.start()
    yield store, server, run_dir
    server.stop()
    store.close()


def test_the_endpoint_wants_the_job_token_and_serves_only_its_logs(node):
    _, server, run_dir = node
    assert read_address(run_dir).url == server.url  # where the launching machine finds it
    for token in ("x", "wrong"):
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{server.url}{api.PREFIX}/state", headers=auth).status_code == 401
    assert httpx.post(f"{server.url}{api.PREFIX}/down").status_code == 401  # no token: no stop
    client = NodeClient(server.url, "tok")
    assert [r.label for r in client.logs()] == ["controller"]
    assert client.read_log("controller.log", 0).startswith(b"controller pid 1")
    assert client.read_log("controller.log", 15) == b"1\n[local] a line with [brackets]\n"
    for name in ("../../state.db", "/etc/passwd", "node-home/state.db"):
        assert client.read_log(name, 0) == b""  # outside the run dir: 404, nothing read
    r = httpx.get(f"{server.url}{api.PREFIX}/log", params={"name": "controller.log", "offset": "x"},
                  headers={"Authorization": "Bearer tok"})
    assert r.status_code == 400


def test_a_copy_of_the_node_records_is_whole_and_replaces_the_last(node, tmp_path):
    store, server, _ = node
    store.update_job(7, status="running", step=2, snapshot={"phase": "train", "step": 2})
    for step in (1, 2):
        store.record_step(7, StepMetrics(step, step, 0.5, 100, 8, 1, 0.2, 60.0 * step, spot_tokens=40))
    store.add_event(7, "fleet-size", "0 -> 1")
    here = StateStore(tmp_path / "here.db")
    local_id = here.create_job("nodey", "name: nodey\n", "local", job_id=7)
    here.update_job(local_id, controller_url=server.url)
    got = NodeClient(server.url, "tok").state()
    here.copy_from_node(7, got.job, got.instances, got.events, got.steps)
    job = here.job_by_id(7)
    assert (job.status, job.step, job.controller_url) == ("running", 2, server.url)
    assert job.snapshot == {"phase": "train", "step": 2}
    assert job.synced_at is not None
    assert [(s.step, s.spot_tokens) for s in here.steps(7)] == [(1, 40), (2, 40)]
    assert [e.type for e in here.events(7)] == [e.type for e in store.events(7)]
    store.update_job(7, status="succeeded", step=3)  # the next copy replaces, never appends
    got = NodeClient(server.url, "tok").state()
    here.copy_from_node(7, got.job, got.instances, got.events, got.steps)
    assert (here.job_by_id(7).status, len(here.events(7))) == ("succeeded", len(store.events(7)))
    here.close()


def test_a_copy_asked_for_before_a_newer_one_or_before_the_job_ended_here_changes_nothing(node, tmp_path):
    """`logs -f` and `down` copy the node's records at once: a "running" copy that arrives after `down`
    recorded the end must not bring the job back to life (nor its instances)."""
    store, server, _ = node
    store.update_job(7, status="running", step=2)
    here = StateStore(tmp_path / "here.db")
    here.create_job("nodey", "name: nodey\n", "local", job_id=7)
    here.update_job(7, controller_url=server.url)
    running = NodeClient(server.url, "tok").state()  # asked for at t=100, arrives late
    store.update_job(7, status="stopped", step=3, ended_at=105.0)
    ended = NodeClient(server.url, "tok").state()
    assert here.copy_from_node(7, ended.job, ended.instances, ended.events, ended.steps, as_of=110.0)
    assert not here.copy_from_node(7, running.job, running.instances, running.events, running.steps, as_of=100.0)
    assert (here.job_by_id(7).status, here.job_by_id(7).step, here.job_by_id(7).synced_at) == ("stopped", 3, 110.0)

    here.update_job(7, status="stopped", ended_at=120.0, error="stopped by `rlboost down`")  # ended here
    assert not here.copy_from_node(7, running.job, running.instances, running.events, running.steps, as_of=115.0)
    assert here.job_by_id(7).status == "stopped"
    # `launch --resume` later: the node runs it again, and a copy asked for since is the truth
    assert here.copy_from_node(7, running.job, running.instances, running.events, running.steps, as_of=130.0)
    assert (here.job_by_id(7).status, here.job_by_id(7).step) == ("running", 2)
    here.close()


def test_controller_trainer_is_refused_where_it_cannot_run():
    doc = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    assert parse_spec({**doc, "controller": "trainer"}).controller == "trainer"
    with pytest.raises(SpecError, match="controller: trainer is not available with provider 'aws'"):
        parse_spec({**doc, "provider": "aws", "controller": "trainer", "rollout": {"max_workers": 0},
                    "trainer": {"cloud": "aws", "accelerators": "A100:8"}})


# ---- real jobs -----------------------------------------------------------------------------------


def node_job(tmp: Path, name: str) -> Path:
    path = job_file(tmp, name)
    doc = yaml.safe_load(path.read_text())
    doc["rollout"]["min_workers"] = 1  # a worker that stays long enough to write its log
    path.write_text(yaml.safe_dump({**doc, "controller": "trainer"}))
    return path


def node_pids(home: Path) -> list[int]:
    """Every process of the stand-in nodes: their controllers and what those launched."""
    return rlboost_pids(f"RLBOOST_HOME={home}/jobs/", exact=False)


def node_controller(home: Path, job_id: int) -> int:
    return read_address(node_run_dir(copied(home, job_id))).pid


@pytest.fixture
def nothing_left(home):
    yield
    if (home / "state.db").exists():
        run_cli("down", "--all", home=home, timeout=300)
    for pid in node_pids(home):  # a test that failed early: its node controller
        os.kill(pid, signal.SIGKILL)


def copied(home: Path, job_id: int):
    """Copy the node's records here, as every command does, and return the job row."""
    with StateStore(home / "state.db") as store:
        sync(store, store.job_by_id(job_id))
        return store.job_by_id(job_id)


def wait_copied_step(home: Path, job_id: int, step: int, timeout_s: float = 180) -> None:
    wait_for(lambda: (copied(home, job_id).step or 0) >= step, f"job {job_id} at step {step} (node copy)", timeout_s)


def assert_node_job_gone(home: Path, name: str, job_id: int, status: str = "stopped") -> None:
    wait_for(lambda: not rlboost_pids(f"RLBOOST_INSTANCE_ID={name}-{job_id}-"), "every instance process to exit", 60)
    wait_for(lambda: not node_pids(home), "the node's controller to exit", 60)
    with StateStore(home / "state.db") as store:
        job = store.job_by_id(job_id)
        assert job.status == status, (job.status, job.error)
        insts = store.instances(job_id)
        assert insts and [(i.id, i.state) for i in insts if not i.terminal or i.ended_clock is None] == []


def wait_or_dump_stacks(proc: subprocess.Popen, timeout_s: float, also: list[int]) -> None:
    """Wait for `proc` to exit; if it does not, every thread's stack of it and of `also` (SIGUSR1:
    faulthandler, rlboost/cli/main.py) goes into the failure, so a hang says where it hangs."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *also]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(2)  # faulthandler writes at once; give the pipes a moment
        proc.kill()
        _, stderr = proc.communicate(timeout=30)
        raise AssertionError(f"pid {proc.pid} still running after {timeout_s}s; its stacks:\n{stderr}") from None


def detached(jf: Path, home: Path) -> tuple[int, str]:
    r = run_cli("launch", "-d", str(jf), home=home, timeout=120, check=True)
    m = re.search(r"job id (\d+): controller running on the trainer node \((http://[^)]+)\)", r.stdout)
    assert m, r.stdout + r.stderr
    return int(m.group(1)), m.group(2)


@pytest.mark.integration
@pytest.mark.slow  # a whole job: .ci/run's slow tier
def test_detached_job_on_its_node_is_operated_from_here_and_outlives_the_node(tmp_path, home, nothing_left):
    name = "node-detach"
    job_id, url = detached(node_job(tmp_path, name), home)
    with StateStore(home / "state.db") as store:
        row = store.job_by_id(job_id)
        assert (row.controller_url, row.controller_pid) == (url, None)  # nothing of it runs here
        assert not (home / "jobs" / f"{name}-{job_id}" / "instances").exists()
    wait_copied_step(home, job_id, 2)
    st = run_json("status", str(job_id), home=home)["jobs"][0]
    assert (st["controller"], st["controller_alive"], st["status"]) == ("trainer-node", True, "running")
    assert st["step"] >= 2 and st["workers"]
    assert run_json("cost-report", str(job_id), home=home)["dollars"] > 0
    logs = run_cli("logs", str(job_id), "-n", "5", home=home, check=True).stdout
    assert "==> controller" in logs and f"{name}-{job_id}-trainer" in logs
    client = NodeClient.for_job(copied(home, job_id))
    worker_log: dict[str, bytes] = {}

    def a_worker_has_logged() -> bool:
        copied(home, job_id)
        with StateStore(home / "state.db") as store:
            workers = [i.instance_id for i in store.instances(job_id) if i.role == "worker"]
        for iid in workers:
            if got := client.read_log(f"instances/{iid}/log", 0):
                worker_log[iid] = got
                return True
        return False

    wait_for(a_worker_has_logged, "a spot worker to write to its log on the node")

    follower = subprocess.Popen(
        [PY, "-m", "rlboost.cli.main", "logs", str(job_id), "-f", "-n", "1"],
        env=env(home), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines = Lines(follower.stdout)
    lines.next()  # it has started following
    down = run_cli("down", str(job_id), home=home, timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"{name} (id {job_id}): stopped" in down.stdout
    wait_or_dump_stacks(follower, 120, also=node_pids(home))
    assert follower.returncode == 0, follower.stderr.read()
    assert "stopped" in follower.stderr.read()
    assert "stopped by `rlboost down`" in lines.rest()  # the controller's last words, through the node
    assert_node_job_gone(home, name, job_id)
    assert "stopped by `rlboost down`" in (copied(home, job_id).error or "")

    # the node is gone for good (a cloud terminates it): everything still answers from the copy here
    shutil.rmtree(node_run_dir(copied(home, job_id)).parents[2])
    st = run_json("status", str(job_id), home=home)["jobs"][0]
    assert (st["status"], st["controller_alive"]) == ("stopped", None)
    assert run_json("cost-report", str(job_id), home=home)["dollars"] > 0
    logs = run_cli("logs", str(job_id), "-n", "1000000", home=home, check=True).stdout
    assert "controller pid" in logs and "node-logs" in logs
    ((worker, seen),) = worker_log.items()  # every instance's log came along, this worker's too
    shown = run_cli("logs", str(job_id), "--instance", worker, "-n", "1000000", home=home, check=True).stdout
    assert seen.decode(errors="replace").splitlines()[0] in shown


@pytest.mark.integration
@pytest.mark.slow  # a whole job: .ci/run's slow tier
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT])
def test_closing_the_terminal_of_an_attached_launch_leaves_the_node_job_running(tmp_path, home, sig, nothing_left):
    name = f"node-{sig.name.lower()}"
    out = tmp_path / "launch.out"
    with open(out, "wb") as f:
        proc = subprocess.Popen(
            [PY, "-m", "rlboost.cli.main", "launch", str(node_job(tmp_path, name))],
            env=env(home), cwd=ROOT, stdout=f, stderr=f, preexec_fn=terminal_signals,
        )
    try:
        wait_for(lambda: (home / "state.db").exists() and "controller running on the trainer node" in out.read_text(),
                 "the node controller to start")
        wait_copied_step(home, 1, 1)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0, out.read_text()  # it only stopped following
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "keeps running on its trainer node" in out.read_text()
    step = copied(home, 1).step or 0
    wait_copied_step(home, 1, step + 2)  # trains on with the launching terminal gone
    assert copied(home, 1).status == "running"
    run_cli("down", name, home=home, timeout=180, check=True)
    assert_node_job_gone(home, name, 1)


@pytest.mark.faults
def test_a_dead_node_controller_is_shown_and_resume_or_gc_takes_the_job_over(tmp_path, home, nothing_left):
    name = "node-dead"
    job_id, _ = detached(node_job(tmp_path, name), home)
    wait_copied_step(home, job_id, 1)
    pid = node_controller(home, job_id)
    os.kill(pid, signal.SIGKILL)  # the node's controller dies; its trainer and workers run on
    wait_for(lambda: not controller_alive(pid), "the node controller to die", 30)
    st = run_json("status", str(job_id), home=home)["jobs"][0]
    assert st["controller_alive"] is False and "does not answer" in st["status_text"], st
    assert "node unreachable" in run_cli("status", home=home, check=True).stdout

    r = run_cli("launch", "--resume", str(job_id), "-d", home=home, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    step = copied(home, job_id).step or 0
    wait_copied_step(home, job_id, step + 2)  # a new node controller reattached and trains on
    assert run_json("status", str(job_id), home=home)["jobs"][0]["controller_alive"] is True

    pid = node_controller(home, job_id)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not controller_alive(pid), "the node controller to die", 30)
    gc = run_cli("gc", "--wait", "60", home=home, timeout=180)
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert_node_job_gone(home, name, job_id, status="failed")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # nothing relaunches what gc terminated
        assert not rlboost_pids(f"RLBOOST_INSTANCE_ID={name}-{job_id}-")
        time.sleep(0.5)
