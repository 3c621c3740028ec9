"""`controller: trainer` on SkyPilot (the default there): the job's controller runs on the trainer
cluster's head, runs the trainer as a process beside itself and bids for spot workers with the
credentials SkyPilot gives that cluster.

What runs here: the node's task against SkyPilot's own schema and a fake `sky` SDK (the cloud
boundary), the launching machine's start/cut-off of the node, the node's public address from a
metadata server on localhost, and the node's controller for real (`rlboost _node-controller`, the
task's run command) with the trainer as its local process. What cannot run here: a real cluster.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

import tests.sky_fake  # noqa: F401  (offline SkyPilot first)
from rlboost.cli.node_client import NodeClient
from rlboost.cli.node_control import ControlServer
from rlboost.cli.node_host import NodeStartError, SkyTrainerNode, trainer_node
from rlboost.cli.state import StateStore
from rlboost.contracts.spec import SpecError, parse_spec, spec_to_yaml
from rlboost.providers.base import CapacityError, InstanceKind, LaunchRequest, Owner, Role
from rlboost.providers.bootstrap import CONTROL_PORT, TRAINER_PORT
from rlboost.providers.node_address import NoPublicAddress, public_host
from rlboost.providers.skypilot import NODE_AUTOSTOP_MIN, SkyPilotProvider
from rlboost.providers.trainer_here import public_endpoint
from tests.conftest import ROOT, rlboost_pids
from tests.sky_fake import FakeSky
from tests.test_operate import wait_for

PY = sys.executable


def sky_job(name: str = "sky-node", *, steps: int = 2, **extra) -> dict:
    return {
        "name": name,
        "provider": "skypilot",
        "model": {"kind": "tiny-gpt", "n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32},
        "algorithm": {"steps": steps, "prompts_per_step": 4, "group_size": 2, "max_new_tokens": 6},
        "task": {"name": "reverse", "max_len": 4},
        "trainer": {"cloud": "aws", "region": "us-east-1", "accelerators": "A100:8"},
        "rollout": {"max_workers": 0},
        **extra,
    }


def node_request(iid: str = "sky-node-7-trainer") -> LaunchRequest:
    return LaunchRequest(
        instance_id=iid,
        owner=Owner("sky-node", 1, "uid-sky-node"),
        role=Role.TRAINER,
        kind=InstanceKind.ON_DEMAND,
        cloud="aws",
        region="us-east-1",
        accelerator="A100:8",
        hourly_price=32.77,
        env={"RLBOOST_JOB_TOKEN": "s3cret-token", "RLBOOST_ENGINE": "torch"},
    )


@pytest.fixture
def prov(tmp_path) -> Iterator[SkyPilotProvider]:
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.yaml").write_text(spec_to_yaml(parse_spec(sky_job(), source="t")))
    p = SkyPilotProvider(run, sdk=FakeSky(), sync_workdir=False)
    yield p
    p.close()


# ---- the job file ------------------------------------------------------------------------------
def test_the_controller_runs_on_the_trainer_node_by_default_on_skypilot_only():
    assert parse_spec(sky_job(), source="t").controller == "trainer"
    assert parse_spec(sky_job(controller="launcher"), source="t").controller == "launcher"
    assert parse_spec({"name": "loc", "rollout": {"max_workers": 0}}, source="t").controller == "launcher"
    azure = sky_job(trainer={"cloud": "azure", "accelerators": "A100:8"})
    assert parse_spec(azure, source="t").controller == "launcher"  # no metadata address there
    with pytest.raises(SpecError, match="metadata service of aws or gcp"):
        parse_spec({**azure, "controller": "trainer"}, source="t")


# ---- the node's task, against SkyPilot's schema ---------------------------------------------------
def test_the_node_task_runs_the_controller_opens_both_ports_and_keeps_the_token_secret(prov):
    fake: FakeSky = prov.sdk
    fake.endpoint = "198.51.100.4:8788"
    url = prov.start_node(node_request(), job_id=7, resume=False)
    assert url == "http://198.51.100.4:8788"
    ((name, cfg, identity, kw),) = [args for what, args in fake.calls if what == "launch"]
    assert name == "sky-node-7-trainer"
    assert "_node-controller" in cfg["run"] and '"$RLBOOST_JOB_ID"' in cfg["run"]
    assert sorted(int(p) for p in cfg["resources"]["ports"]) == [TRAINER_PORT, CONTROL_PORT]
    assert cfg["resources"]["use_spot"] is False
    assert cfg["envs"]["RLBOOST_JOB_ID"] == "7" and cfg["envs"]["RLBOOST_RESUME_FLAG"] == ""
    assert "skypilot" in cfg["envs"]["RLBOOST_PIP_SPEC"]  # the node launches workers itself
    assert "s3cret-token" not in yaml.safe_dump(cfg["envs"])  # the token only as a SkyPilot secret
    assert identity == "LOCAL_CREDENTIALS"  # the node gets credentials to bid with; workers never do
    assert kw["down"] is True and kw["idle_minutes_to_autostop"] == NODE_AUTOSTOP_MIN
    assert ("endpoints", (name, CONTROL_PORT)) in fake.calls

    prov.start_node(node_request(), job_id=7, resume=True)  # the same cluster runs its task again
    *_, (_, again, _, _) = [args for what, args in fake.calls if what == "launch"]
    assert again["envs"]["RLBOOST_RESUME_FLAG"] == "--resume"


def test_no_capacity_for_the_node_is_a_capacity_error(prov):
    prov.sdk.refuse(cloud="aws")
    with pytest.raises(CapacityError, match="Failed to acquire"):
        prov.start_node(node_request(), job_id=7, resume=False)


# ---- the launching machine's side ---------------------------------------------------------------
@pytest.fixture
def laptop_job(home, tmp_path):
    """A skypilot job as `launch` records it on the launching machine (row, run dir, token)."""
    store = StateStore()
    spec_yaml = spec_to_yaml(parse_spec(sky_job(), source="t"))
    job_id = store.create_job("sky-node", spec_yaml, "skypilot")
    run_dir = home / "jobs" / f"sky-node-{job_id}"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(spec_yaml)
    (run_dir / "token").write_text("tok")
    yield store, store.job_by_id(job_id), run_dir
    store.close()


def test_the_launching_machine_starts_the_node_reaches_its_controller_and_cuts_it_off(laptop_job, tmp_path):
    _, job, run_dir = laptop_job
    assert isinstance(trainer_node(job), SkyTrainerNode)
    # the node's control endpoint, served for real (here instead of on the cluster's head)
    node_run = tmp_path / "node-run"
    node_run.mkdir()
    server = ControlServer(job.id, node_run, "tok")
    server.start()
    try:
        fake = FakeSky(endpoint=server.url.removeprefix("http://"))
        node = SkyTrainerNode(job, SkyPilotProvider(run_dir, sdk=fake, sync_workdir=False))
        addr = node.start(job.spec_yaml, "tok", resume=False, record_rollouts=False, timeout_s=30)
        assert addr.url == server.url
        assert fake.live() == [f"sky-node-{job.id}-trainer"]
        (_, cfg, _, _) = next(args for what, args in fake.calls if what == "launch")
        assert cfg["resources"]["accelerators"] == "A100:8" and cfg["resources"]["region"] == "us-east-1"
        assert not node.lost()  # up: `gc` leaves it alone even when its controller does not answer
        node.stop_controller()  # `--resume`: the old controller's job is cancelled, the node kept
        assert ("cancel", (f"sky-node-{job.id}-trainer", True)) in fake.calls
        assert fake.live() == [f"sky-node-{job.id}-trainer"]
        assert node.cut_off() and fake.live() == []  # a node that does not answer is terminated
        assert node.lost()
        node.stop_controller()  # gone: nothing to cancel
        node.cut_off()  # already gone: fine
    finally:
        server.stop()


def test_a_node_whose_controller_never_answers_is_a_clear_error(laptop_job):
    _, job, run_dir = laptop_job
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    node = SkyTrainerNode(job, SkyPilotProvider(run_dir, sdk=FakeSky(endpoint=dead), sync_workdir=False))
    with pytest.raises(NodeStartError, match=r"did not answer .* `rlboost down"):
        node.start(job.spec_yaml, "tok", resume=False, record_rollouts=False, timeout_s=0.5)


def test_the_node_installs_what_its_trainer_needs_besides_skypilot(home, monkeypatch):
    """An hf job on parquet: the node's controller launches workers (`skypilot`) and its trainer runs
    there too (`hf`, `data`)."""
    monkeypatch.delenv("RLBOOST_PIP_SPEC", raising=False)
    store = StateStore()
    spec = sky_job("sky-hf", model={"kind": "hf", "path": "org/model"}, task={"name": "jsonl", "path": "t.parquet"})
    spec_yaml = spec_to_yaml(parse_spec(spec, source="t"))
    job = store.job_by_id(store.create_job("sky-hf", spec_yaml, "skypilot"))
    run_dir = home / "jobs" / f"sky-hf-{job.id}"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(spec_yaml)
    with socket.socket() as s:  # no controller answers: the launch is what this test reads
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    fake = FakeSky(endpoint=dead)
    node = SkyTrainerNode(job, SkyPilotProvider(run_dir, sdk=fake, sync_workdir=True))
    with pytest.raises(NodeStartError):
        node.start(spec_yaml, "tok", resume=False, record_rollouts=False, timeout_s=0.2)
    (_, cfg, _, _) = next(args for what, args in fake.calls if what == "launch")
    assert cfg["envs"]["RLBOOST_PIP_SPEC"] == ".[local,hf,data,skypilot]"
    store.close()


# ---- the node's public address ----------------------------------------------------------------
class Metadata(BaseHTTPRequestHandler):
    """EC2 IMDSv2 (token PUT, then GET with it) and GCE metadata (Metadata-Flavor header)."""

    def do_PUT(self) -> None:
        ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self._send(200 if ok else 400, "tkn")

    def do_GET(self) -> None:
        if self.path == "/latest/meta-data/public-ipv4":
            ok = self.headers.get("X-aws-ec2-metadata-token") == "tkn"
            self._send(200 if ok else 401, "54.1.2.3")
        elif self.path.endswith("/network-interfaces/0/access-configs/0/external-ip"):
            self._send(200 if self.headers.get("Metadata-Flavor") == "Google" else 403, "34.5.6.7\n")
        else:
            self._send(404, "")

    def _send(self, code: int, body: str) -> None:
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *a) -> None:
        pass


@pytest.fixture
def metadata() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_the_node_finds_its_public_address_from_its_clouds_metadata(metadata):
    assert public_host("aws", {"RLBOOST_METADATA_URL": metadata}) == "54.1.2.3"
    assert public_host("gcp", {"RLBOOST_METADATA_URL": metadata}) == "34.5.6.7"
    assert public_host("azure", {"RLBOOST_PUBLIC_HOST": "lb.example"}) == "lb.example"
    with pytest.raises(NoPublicAddress, match="set RLBOOST_PUBLIC_HOST"):
        public_host("azure", {})
    with pytest.raises(NoPublicAddress, match="aws metadata service gave no public IP"):
        public_host("aws", {"RLBOOST_METADATA_URL": metadata + "/nothing-here"})
    assert public_endpoint("https://127.0.0.1:8787", "54.1.2.3") == "https://54.1.2.3:8787"


# ---- the node's controller, for real ------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
def test_the_node_controller_trains_with_the_trainer_beside_it_and_answers_on_its_port(tmp_path):
    """The task's run command on a node: it records the job on the node, runs the trainer as its own
    process (announced at the node's public address), and serves status until released."""
    spot = {"accelerator": "V100", "clouds": ["aws"], "regions": ["us-east-1"]}
    rollout = {"max_workers": 1, "min_workers": 1, "candidates": [spot]}
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_to_yaml(parse_spec(sky_job(rollout=rollout), source="t")))
    home, cport, tport = tmp_path / "node-home", free_port(), free_port()
    env = {
        **os.environ,
        "RLBOOST_HOME": str(home),
        "RLBOOST_JOB_TOKEN": "tok",
        "RLBOOST_PUBLIC_HOST": "127.0.0.1",  # what the cloud's metadata service would say
        "RLBOOST_TRAINER_PORT": str(tport),
        "RLBOOST_SKY_SDK": "tests.sky_fake:SDK",  # the cloud it would bid on for workers
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "node.log"
    with open(log, "wb") as out:
        run = ["_node-controller", "7", "sky-node", str(spec), "--control-port", str(cport)]  # the task's run
        proc = subprocess.Popen(
            [PY, "-m", "rlboost.cli.main", *run],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    client = NodeClient(f"http://127.0.0.1:{cport}", "tok")
    try:
        wait_for(lambda: client.ping() or proc.poll() is not None, "the control endpoint", 120)
        wait_for(lambda: not client.state().job.active or proc.poll() is not None, "the job to end", 300)
        got = client.state()
        assert got.job.status == "succeeded", log.read_text()[-3000:]
        assert (got.job.id, got.job.step) == (7, 2)
        (trainer,) = [i for i in got.instances if i.role == "trainer"]
        assert (trainer.role, trainer.cloud, trainer.accelerator) == ("trainer", "aws", "A100:8")
        # the node bid for its spot worker itself, through SkyPilot (a fake cloud here), and downed it
        (worker,) = [i for i in got.instances if i.role == "worker"]
        assert (worker.kind, worker.cloud, worker.provider) == ("spot", "aws", "skypilot")
        assert worker.state == "terminated"
        assert trainer.hourly_price > 0 and trainer.started_clock is not None
        assert f"127.0.0.1:{tport}" in log.read_text()  # announced at the public address and port
        assert (home / "jobs" / "sky-node-7" / "instances" / trainer.instance_id / "log").is_file()
        client.release()
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert not rlboost_pids(f"RLBOOST_RUN_DIR={home}")
