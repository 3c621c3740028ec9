"""The SkyPilot provider against a fake `sky` SDK (request ids, scripted statuses, real exceptions),
its task YAMLs against SkyPilot's own schema, prices from SkyPilot's catalog under SKY_RUNTIME_DIR,
and a whole controller run: capacity backoff, preemption, replacement, teardown."""

from __future__ import annotations

import io
import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

import tests.sky_fake  # noqa: F401  (offline SkyPilot first)
from rlboost.contracts.status import TrainerStatus
from rlboost.providers.base import InstanceKind, InstanceState, LaunchRequest, Owner, Role
from rlboost.providers.skypilot import SkyPilotProvider
from tests.cloud_worlds import write_spec
from tests.sky_fake import FakeSky, sky  # `sky` as imported after the offline environment was set


def req(iid: str, role: Role = Role.WORKER, cloud: str = "gcp", acc: str = "A100", region: str | None = None):
    trainer = role is Role.TRAINER
    return LaunchRequest(
        instance_id=iid,
        owner=Owner("demo", 1, "uid-demo"),
        role=role,
        kind=InstanceKind.ON_DEMAND if trainer else InstanceKind.SPOT,
        cloud=cloud,
        region=region,
        accelerator=acc,
        hourly_price=1.0,
        env={
            "RLBOOST_JOB_TOKEN": "s3cret-token",
            "RLBOOST_ENGINE": "vllm",
            "RLBOOST_TRAINER_URL": "http://1.2.3.4:8787",
            "RLBOOST_WORKER_ID": iid,
            "RLBOOST_WORKER_KIND": "spot",
        },
        command=["ignored", "on", "clouds"],
    )


@pytest.fixture
def fake() -> FakeSky:
    return FakeSky()


@pytest.fixture
def prov(tmp_path, fake):
    run = tmp_path / "run"
    write_spec(run, "demo")
    spec = yaml.safe_load((run / "spec.yaml").read_text())
    spec["trainer"]["nodes"] = 2
    spec["local"] = {"catalog": str(tmp_path / "local-only.csv")}
    (run / "spec.yaml").write_text(yaml.safe_dump(spec))
    p = SkyPilotProvider(run, sdk=fake, status_every_s=0.05, redown_after_s=0.05)
    yield p
    p.close()


def drain(p: SkyPilotProvider, until, timeout: float = 10.0) -> list:
    seen: list = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen.extend(p.poll())
        if until(seen):
            return seen
        time.sleep(0.02)
    raise AssertionError(f"not reached; events {seen}")


def launches(fake: FakeSky) -> dict[str, tuple]:
    return {c[1][0]: c[1] for c in fake.calls if c[0] == "launch"}


def test_every_generated_task_yaml_passes_skypilots_schema(prov, fake):
    prov.launch(req("demo-1-trainer", Role.TRAINER, cloud="aws", acc="A100:8", region="us-east-1"))
    prov.launch(req("demo-1-w001", cloud="gcp", acc="A100", region="us-central1"))
    prov.launch(req("demo-1-w002", cloud="aws", acc="V100"))
    from sky.utils import common_utils, schemas

    got = launches(fake)
    assert set(got) == {"demo-1-trainer", "demo-1-w001", "demo-1-w002"}
    for _name, cfg, _identity, _kw in got.values():
        common_utils.validate_schema(cfg, schemas.get_task_schema(), "Invalid task YAML: ")
        sky.Task.from_yaml_config(cfg)  # and SkyPilot builds a task from it


def test_trainer_task(prov, fake, tmp_path):
    prov.launch(req("demo-1-trainer", Role.TRAINER, cloud="aws", acc="A100:8", region="us-east-1"))
    _, cfg, identity, kw = launches(fake)["demo-1-trainer"]
    res = cfg["resources"]
    assert res["cloud"] == "aws" and res["region"] == "us-east-1" and res["accelerators"] == "A100:8"
    assert res["use_spot"] is False and res["ports"] == [8787]
    assert res["autostop"] == {"idle_minutes": 30, "down": True}  # the safety net if the controller dies
    assert kw["down"] is True and kw["idle_minutes_to_autostop"] == 30
    assert cfg["num_nodes"] == 2
    assert res["labels"]["rlboost-job"] == "demo" and res["labels"]["rlboost-job-uid"] == "uid-demo"
    assert '--port "$RLBOOST_TRAINER_PORT"' in cfg["run"] and cfg["envs"]["RLBOOST_TRAINER_PORT"] == "8787"
    # the job file travels without local-only paths (the trainer validates it again on the node)
    mounted = Path(cfg["file_mounts"]["~/.rlboost/spec.yaml"])
    assert yaml.safe_load(mounted.read_text())["local"]["catalog"] is None
    assert identity is None  # the trainer keeps SkyPilot's default identity (it autostops itself)


def test_worker_task_gets_bootstrap_env_but_no_credentials_and_a_secret_token(prov, fake):
    prov.launch(req("demo-1-w001", cloud="aws", acc="V100", region="us-east-2"))
    _, cfg, identity, kw = launches(fake)["demo-1-w001"]
    assert cfg["resources"]["use_spot"] is True and cfg["resources"]["region"] == "us-east-2"
    env = cfg["envs"]
    assert env["RLBOOST_TRAINER_URL"] == "http://1.2.3.4:8787" and env["RLBOOST_WORKER_ID"] == "demo-1-w001"
    assert env["RLBOOST_NOTICE"] == "ec2-imds" and env["RLBOOST_ENGINE"] == "vllm"
    assert env["RLBOOST_PIP_SPEC"].startswith(".[vllm]") or "rlboost" in env["RLBOOST_PIP_SPEC"]
    assert "RLBOOST_JOB_TOKEN" not in env and cfg["secrets"] == {"RLBOOST_JOB_TOKEN": "s3cret-token"}
    assert not any(k.startswith(("AWS_", "GOOGLE_")) for k in env)
    assert identity == "NO_UPLOAD"  # no cloud credentials on worker nodes
    assert kw["down"] is False and kw["idle_minutes_to_autostop"] is None
    assert "s3cret-token" not in prov.tasks["demo-1-w001"]  # what rlboost keeps is redacted


def test_launch_only_submits_and_many_are_in_flight(prov, fake):
    # each request takes 3 s: waiting for even one would take that long, and for all 12 in turn 36 s, so
    # the bounds below tell the behaviours apart however busy the machine is (12 submissions took 1.2 s
    # on a loaded CI run, over the 1.0 s bound this test had)
    fake.launch_latency_s = 3.0
    t0 = time.monotonic()
    for i in range(12):
        prov.launch(req(f"demo-1-w{i:03d}"))
    assert time.monotonic() - t0 < 3.0, "launch must only submit the request"
    t1 = time.monotonic()
    prov.poll()
    assert time.monotonic() - t1 < 3.0, "poll must not wait for requests"
    evs = drain(prov, lambda e: sum(x.state is InstanceState.RUNNING for x in e) == 12, timeout=30)
    assert time.monotonic() - t0 < 30.0, "the 12 launches ran concurrently"
    assert {e.instance_id for e in evs if e.state is InstanceState.RUNNING} == {f"demo-1-w{i:03d}" for i in range(12)}


def test_capacity_error_is_flagged_and_the_half_made_cluster_downed(prov, fake):
    fake.refuse(accelerator="A100")
    prov.launch(req("demo-1-w001"))
    evs = drain(prov, lambda e: any(x.state is InstanceState.FAILED for x in e))
    failed = next(x for x in evs if x.state is InstanceState.FAILED)
    assert failed.capacity and "Failed to acquire resources" in failed.detail
    drain(prov, lambda e: not fake.live())
    assert ("down", "demo-1-w001") in fake.calls


@pytest.mark.parametrize("how", ["INIT", "STOPPED", None])
def test_status_refresh_gone_init_or_stopped_means_preempted(prov, fake, how):
    prov.launch(req("demo-1-w001"))
    prov.launch(req("demo-1-w002"))
    drain(prov, lambda e: sum(x.state is InstanceState.RUNNING for x in e) == 2)
    fake.status_script["demo-1-w001"] = ["UP", "UP", how]
    evs = drain(prov, lambda e: any(x.state is InstanceState.PREEMPTED for x in e))
    assert [x.instance_id for x in evs if x.state is InstanceState.PREEMPTED] == ["demo-1-w001"]
    drain(prov, lambda e: fake.live() == ["demo-1-w002"])  # downed, always
    refreshes = [c for c in fake.calls if c[0] == "status" and c[1][1] == sky.StatusRefreshMode.FORCE]
    assert refreshes, "preemption is detected with sky.status(refresh=FORCE)"


def test_a_failing_down_is_retried_until_the_cluster_is_gone(prov, fake):
    prov.launch(req("demo-1-w001"))
    drain(prov, lambda e: any(x.state is InstanceState.RUNNING for x in e))
    fake.failing_downs["demo-1-w001"] = 2
    prov.terminate("demo-1-w001")
    drain(prov, lambda e: any(x.state is InstanceState.TERMINATED for x in e))
    assert fake.live() == [] and [c for c in fake.calls if c == ("down", "demo-1-w001")].__len__() == 3


def test_terminate_while_launching_cancels_and_downs(prov, fake):
    fake.launch_latency_s = 0.5
    prov.launch(req("demo-1-w001"))
    prov.terminate("demo-1-w001")
    evs = drain(prov, lambda e: any(x.state is InstanceState.TERMINATED for x in e))
    assert not any(x.state is InstanceState.RUNNING for x in evs)
    # the launch's latency ends: a launch that went through anyway is downed (wait on that, not a time)
    deadline = time.monotonic() + 30
    while fake.live() and time.monotonic() < deadline:
        prov.poll()
        time.sleep(0.02)
    assert fake.live() == []


def test_list_owned_goes_by_the_jobs_uid_label(prov, fake):
    demo = req("demo-1-w001").owner
    prov.launch(req("demo-1-w001"))
    drain(prov, lambda e: any(x.state is InstanceState.RUNNING for x in e))
    other = SkyPilotProvider(prov.run_dir, sdk=fake)
    demo2 = Owner("demo-2", 3, "uid-demo-2")  # job "demo-2", not "demo"
    other.launch(replace(req("demo-2-3-w001"), owner=demo2))
    drain(other, lambda e: any(x.state is InstanceState.RUNNING for x in e))
    assert prov.list_owned(demo) == ["demo-1-w001"]
    assert prov.list_owned(demo2) == ["demo-2-3-w001"]
    # a later run of "demo" (another uid) never claims the first run's cluster
    assert prov.list_owned(Owner("demo", 1, "uid-of-another-run")) == []
    other.close()


# ---- prices ---------------------------------------------------------------------------------
def test_prices_come_from_skypilots_catalog_under_sky_runtime_dir():
    from rlboost.providers.prices import CloudPrices, sky_catalog_present

    assert sky_catalog_present("aws") and sky_catalog_present("gcp")
    prices = CloudPrices()
    assert prices("V100", "aws", "us-east-1", True) == pytest.approx(0.5197)  # cheapest AZ, p3.2xlarge
    assert prices("V100:1", "aws", "us-east-1", False) == pytest.approx(3.06)
    assert prices("A100", "gcp", "us-central1", True) == pytest.approx(0.29576 + 1.1472)  # host + GPU
    assert prices("A100:8", "aws", "us-east-1", False) == pytest.approx(32.7726)  # p4d.24xlarge
    assert prices("A100", "aws", None, True) is None  # AWS sells A100s only by 8
    assert prices.sources == {"aws": "SkyPilot catalog", "gcp": "SkyPilot catalog"}


def test_prices_fall_back_to_the_bundled_snapshot_without_skypilots_catalog(monkeypatch):
    import rlboost.providers.prices as pp

    monkeypatch.setattr(pp, "sky_catalog_present", lambda cloud: False)
    prices = pp.CloudPrices()
    assert prices("V100", "aws", "us-east-1", True) == pytest.approx(0.5197)
    assert prices.sources["aws"].startswith("bundled")


# ---- a whole controller run on the fake -----------------------------------------------------
def status_doc(phase: str) -> str:
    """A trainer's status document (rlboost/contracts/status.py) in `phase`, with nothing done yet."""
    zero = dict.fromkeys(
        ("step", "tokens_total", "responses_total", "migrated", "redispatched", "rejected_frames", "offloads"), 0
    )
    doc = TrainerStatus(
        phase=phase,
        steps=1,
        version=-1,
        reward=None,
        reward_errors={},
        tail_migrations=0,
        workers=[],
        weights={},
        history=[],
        evals=[],
        eval=None,
        **zero,
    )
    return doc.model_dump_json()


class TrainerStub:
    """The trainer's /v1/status as the controller reads it: running until `done_when()` holds, then
    done. A predicate on state, not a clock: on a busy machine the controller may reach its first poll
    late, and a stub that is done after N seconds can end the job before anything was bid for."""

    def __init__(self, done_when: Callable[[], bool]) -> None:
        self.done_when = done_when
        stub = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                done = stub.done_when()
                body = status_doc("done" if done else "rollout").encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def sky_controller(tmp_path: Path, spec, fake: FakeSky, stub: TrainerStub, **provider_kw):
    """A job recorded in a fresh state db, its run dir, the SkyPilot provider on `fake` and the
    Controller that runs it against `stub` (the trainer's status)."""
    from rich.console import Console

    from rlboost.cli.controller import Controller
    from rlboost.cli.state import StateStore
    from rlboost.contracts.spec import spec_to_yaml
    from rlboost.providers.prices import CloudPrices
    from rlboost.providers.pricing import spot_offers, trainer_offer

    fake.endpoint = stub.addr
    store = StateStore(tmp_path / "state.db")
    job_id = store.create_job(spec.name, spec_to_yaml(spec), spec.provider)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.yaml").write_text(spec_to_yaml(spec))
    provider = SkyPilotProvider(run_dir, sdk=fake, status_every_s=0.1, redown_after_s=0.1, **provider_kw)
    prices = CloudPrices()
    ctl = Controller(
        spec=spec, store=store, job_id=job_id, run_dir=run_dir, provider=provider, token="tok",
        trainer_offer=trainer_offer(spec, prices), spot_offers=spot_offers(spec, prices),
        console=Console(file=io.StringIO()), poll_s=0.05, teardown_wait_s=10.0,
    )  # fmt: skip
    return ctl, store, job_id, provider


def test_controller_bids_backs_off_replaces_preempted_and_tears_everything_down(tmp_path, fake):
    from rlboost.contracts.spec import parse_spec
    from rlboost.providers.prices import CloudPrices
    from rlboost.providers.pricing import spot_offers

    spec = parse_spec(
        {
            "name": "sky-demo",
            "provider": "skypilot",
            # the stub trainer speaks plain HTTP (TLS wiring: tests/test_tls_wiring.py)
            "trainer": {"cloud": "aws", "region": "us-east-1", "accelerators": "A100:8", "tls": "off"},
            "rollout": {
                "max_workers": 3,
                "candidates": [
                    {"accelerator": "A100", "clouds": ["gcp"], "regions": ["us-central1"], "throughput": 1.0},
                    {"accelerator": "V100", "clouds": ["aws"], "regions": ["us-east-1"], "throughput": 0.2},
                ],
            },
        }
    )
    offers = spot_offers(spec, CloudPrices())
    assert [o.accelerator for o in offers] == ["A100", "V100"]  # A100 is cheaper per token
    fake.refuse(accelerator="A100")  # ...but has no capacity
    preempted: list[str] = []

    def v100_launches() -> int:
        return sum(1 for _, cfg, *_r in launches(fake).values() if "V100" in str(cfg.get("resources")))

    def done() -> bool:
        """Preempt the first V100 worker once it is up, and end once one more V100 was launched than
        the fleet holds (its replacement): events the assertions need, whatever the machine's load."""
        if not preempted:
            up = sorted(c for c, st in fake.snapshot().items() if "-w" in c and st == "UP")
            if up:
                fake.preempt(up[0])
                preempted.append(up[0])
            return False
        return v100_launches() >= 4

    stub = TrainerStub(done_when=done)
    ctl, store, job_id, provider = sky_controller(tmp_path, spec, fake, stub)
    started = time.monotonic()
    try:
        status = ctl.run()
    finally:
        stub.close()
        provider.close()
    elapsed = time.monotonic() - started
    assert status == "succeeded", store.job_by_id(job_id).error
    insts = store.instances(job_id)
    assert all(i.terminal for i in insts), [(i.id, i.state) for i in insts]
    assert fake.live() == [], "teardown downs every cluster"
    by_acc = {}
    for i in insts:
        by_acc.setdefault(i.accelerator, []).append(i)
    assert all(i.state == "failed" for i in by_acc["A100"])  # refused, and backed off (few attempts):
    # the k-th retry waits at least 0.5 * 2^(k-1) s, so n attempts take at least 0.5 * (2^(n-1) - 1) s
    # (a busy machine only spaces them further)
    assert 1 <= len(by_acc["A100"]) <= 1 + math.log2(2 * elapsed + 1), (len(by_acc["A100"]), elapsed)
    assert any(i.state == "preempted" for i in by_acc["V100"]), "a preempted worker is recorded as such"
    assert len(by_acc["V100"]) >= 4, "and replaced"
    kinds = {e.type for e in store.events(job_id)}
    assert "capacity-unavailable" in kinds


def test_a_worker_draining_on_its_notice_is_marked_notice_so_a_replacement_starts_early(tmp_path, fake):
    from rich.console import Console

    from rlboost.cli.controller import Controller
    from rlboost.cli.state import StateStore
    from rlboost.contracts.spec import parse_spec, spec_to_yaml
    from rlboost.providers.prices import CloudPrices
    from rlboost.providers.pricing import spot_offers, trainer_offer

    spec = parse_spec(
        {
            "name": "drain",
            "provider": "skypilot",
            # the stub trainer speaks plain HTTP (TLS wiring: tests/test_tls_wiring.py)
            "trainer": {"cloud": "aws", "region": "us-east-1", "accelerators": "A100:8", "tls": "off"},
            "rollout": {"max_workers": 1, "candidates": [{"accelerator": "V100", "clouds": ["aws"]}]},
        }
    )
    store = StateStore(tmp_path / "state.db")
    job_id = store.create_job(spec.name, spec_to_yaml(spec), spec.provider)
    write_spec(tmp_path / "run", "drain")
    provider = SkyPilotProvider(tmp_path / "run", sdk=fake)
    prices = CloudPrices()
    ctl = Controller(
        spec=spec,
        store=store,
        job_id=job_id,
        run_dir=tmp_path / "run",
        provider=provider,
        token="tok",
        trainer_offer=trainer_offer(spec, prices),
        spot_offers=spot_offers(spec, prices),
        console=Console(file=io.StringIO()),
    )
    store.record_launch(job_id, req("drain-1-w001", cloud="aws", acc="V100"), "skypilot", 3.06)
    store.update_instance("drain-1-w001", InstanceState.RUNNING, 1.0)
    ctl._note_draining([{"worker_id": "drain-1-w001", "state": "draining"}, {"worker_id": "x", "state": "ready"}])
    assert store.instance("drain-1-w001").state == "notice"
    assert ctl._live_workers() and all(i.state == "notice" for i in ctl._live_workers())  # not counted as live
    provider.close()


def test_the_controller_asks_each_node_for_the_extras_the_job_needs(tmp_path, fake, monkeypatch):
    """An hf job on parquet: the trainer's node installs `hf` and `data`, a spot worker's `hf` only."""
    from rlboost.contracts.spec import parse_spec

    monkeypatch.delenv("RLBOOST_PIP_SPEC", raising=False)
    spec = parse_spec(
        {
            "name": "sky-hf",
            "provider": "skypilot",
            "model": {"kind": "hf", "path": "org/model"},
            "task": {"name": "jsonl", "path": "train.parquet"},
            "trainer": {"cloud": "aws", "region": "us-east-1", "accelerators": "A100:8", "tls": "off"},
            "rollout": {"max_workers": 1, "candidates": [{"accelerator": "V100", "clouds": ["aws"]}]},
        }
    )
    # done once a worker was launched: the assertions read the worker's launch
    stub = TrainerStub(done_when=lambda: any("-w" in name for name in launches(fake)))
    ctl, store, job_id, provider = sky_controller(tmp_path, spec, fake, stub, sync_workdir=True)
    try:
        assert ctl.run() == "succeeded", store.job_by_id(job_id).error
    finally:
        stub.close()
        provider.close()
    pips = {name: cfg["envs"]["RLBOOST_PIP_SPEC"] for what, (name, cfg, *_) in fake.calls if what == "launch"}
    assert pips[f"sky-hf-{job_id}-trainer"] == ".[local,hf,data]"
    workers = [p for name, p in pips.items() if "-w" in name]
    assert workers and set(workers) == {".[local,hf]"}
