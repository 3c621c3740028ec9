"""One "world" per provider for the contract suite: the provider plus the cloud behind it.

- local: real processes, a scripted spot market.
- skypilot: SkyPilotProvider over FakeSky (the `sky` SDK boundary: request ids, real exceptions).
- aws: AwsProvider over moto (EC2 emulated in-process); capacity errors injected as real botocore
  ClientErrors through botocore's own `before-call` event.
- gcp: GcpProvider over the real google-cloud-compute client talking REST to FakeGce.

A world can: make a (fresh) provider, build requests, refuse capacity, preempt an instance, and
let the cloud make progress (`settle`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import tests.sky_fake  # noqa: F401  (offline SkyPilot environment before anything imports sky)
from rlboost.providers.base import InstanceEvent, InstanceKind, LaunchRequest, Owner, Provider, Role

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]
TRAINER = [
    sys.executable,
    "-c",
    "import os, time; open(os.environ['RLBOOST_RUN_DIR'] + '/endpoint', 'w').write('http://127.0.0.1:9'); "
    "time.sleep(120)",
]


@dataclass
class World:
    name: str
    job: str
    region: str | None
    make: Callable[[], Provider]
    refuse: Callable[[], None]
    preempt: Callable[[str], None]
    settle: Callable[[], None] = lambda: None
    providers: list[Provider] = field(default_factory=list)
    cloud: str = "local"
    accelerator: str = "A100"

    @property
    def owner(self) -> Owner:
        """The job by identity (its uid is derived from its name: one job a world)."""
        return Owner(self.job, 1, f"uid-{self.job}", "store-test")

    def provider(self) -> Provider:
        p = self.make()
        self.providers.append(p)
        return p

    def request(self, n: int | str, role: Role = Role.WORKER) -> LaunchRequest:
        trainer = role is Role.TRAINER
        iid = f"{self.job}-1-trainer" if trainer else f"{self.job}-1-w{int(n):03d}"
        return LaunchRequest(
            instance_id=iid,
            owner=self.owner,
            role=role,
            kind=InstanceKind.ON_DEMAND if trainer else InstanceKind.SPOT,
            cloud=self.cloud,
            region=self.region,
            accelerator=("A100:8" if trainer else self.accelerator),
            hourly_price=1.0,
            # what the controller gives (no token: nodes enrol for it, rlboost/contracts/enrolment.py)
            env={"RLBOOST_ENGINE": "torch", "RLBOOST_TRAINER_URL": "http://t:1"}
            | (
                {"RLBOOST_ENROL_COMMITMENT": "c0"}
                if trainer
                else {"RLBOOST_WORKER_ID": iid, "RLBOOST_WORKER_KIND": "spot", "RLBOOST_ENROL": f"{iid}.1.n.m"}
            ),
            command=TRAINER if trainer else SLEEP,
        )

    def wait(
        self, p: Provider, done: Callable[[list[InstanceEvent]], bool], timeout: float = 15.0
    ) -> list[InstanceEvent]:
        """Poll (letting the cloud progress) until `done(all events so far)`; returns the events."""
        seen: list[InstanceEvent] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.settle()
            seen.extend(p.poll())
            if done(seen):
                return seen
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: condition not reached in {timeout}s; events: {seen}")

    def wait_unlisted(self, p: Provider, iid: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while iid in p.list_owned(self.owner):
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: {iid} still listed after {timeout}s")
            self.settle()
            p.poll()
            time.sleep(0.05)


def write_spec(run_dir: Path, job: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.yaml").write_text(f"name: {job}\ntrainer:\n  nodes: 1\n")


class ScriptedMarket:
    """The local provider's market, driven by the test: capacity and victims on demand."""

    def __init__(self) -> None:
        self.cap = 100
        self.victims: list[tuple[str, bool]] = []

    def capacity(self, t: float) -> int:
        return self.cap

    def choose_victims(self, t: float, running: list[str]) -> list[tuple[str, bool]]:
        out = [(i, n) for i, n in self.victims if i in running]
        self.victims = [v for v in self.victims if v[0] not in running]
        return out


@contextmanager
def local_world(tmp: Path, job: str) -> Iterator[World]:
    from rlboost.providers.local import LocalProvider

    market = ScriptedMarket()
    run_dir = tmp / "run"
    write_spec(run_dir, job)

    def refuse() -> None:
        market.cap = 0

    def preempt(iid: str) -> None:
        market.victims.append((iid, False))

    w = World("local", job, None, lambda: LocalProvider(run_dir, market, term_grace_s=1.0), refuse, preempt)
    try:
        yield w
    finally:
        for p in w.providers:
            for iid in p.list_owned(w.owner):
                p.terminate(iid)


@contextmanager
def _sky_world(tmp: Path, job: str, node: Callable[[Path, Provider], Provider] | None = None) -> Iterator[World]:
    """Workers as SkyPilot clusters on a fake `sky` SDK; `node` wraps that provider (the trainer node's
    controller), whose own processes are real and are terminated at the end."""
    from rlboost.providers.skypilot import SkyPilotProvider
    from tests.sky_fake import FakeSky

    fake = FakeSky()
    run_dir = tmp / "run"
    write_spec(run_dir, job)

    def make() -> Provider:
        sky = SkyPilotProvider(run_dir, sdk=fake, status_every_s=0.05, redown_after_s=0.05)
        return sky if node is None else node(run_dir, sky)

    w = World("skypilot", job, None, make, lambda: fake.refuse(), lambda iid: fake.preempt(iid), cloud="gcp")
    w.fake = fake  # type: ignore[attr-defined]
    try:
        yield w
    finally:
        for p in w.providers:
            if node is not None:
                for iid in p.list_owned(w.owner):
                    p.terminate(iid)
            p.close()


@contextmanager
def skypilot_world(tmp: Path, job: str) -> Iterator[World]:
    with _sky_world(tmp, job) as w:
        yield w


@contextmanager
def skypilot_node_world(tmp: Path, job: str) -> Iterator[World]:
    """A controller on the trainer node: the trainer a process here, workers SkyPilot clusters."""
    from rlboost.providers.trainer_here import TrainerHere

    def on_node(run_dir: Path, sky: Provider) -> Provider:
        return TrainerHere(run_dir, sky, public_host="203.0.113.7", port=8787)  # type: ignore[arg-type]

    with _sky_world(tmp, job, on_node) as w:
        yield w


AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def client_error(code: str, message: str) -> Callable[..., Any]:
    """A botocore `before-call` handler: the call fails with this error code, as the real API would."""

    def handler(**kwargs: Any) -> tuple[Any, dict[str, Any]]:
        return SimpleNamespace(status_code=500), {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {}}

    return handler


def _restore_env(old: dict[str, str | None]) -> None:
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextmanager
def aws_world(tmp: Path, job: str) -> Iterator[World]:
    import boto3
    from moto import mock_aws
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.instances import StateReason

    from rlboost.providers.aws import AwsProvider

    run_dir = tmp / "run"
    write_spec(run_dir, job)
    with ExitStack() as stack:
        old = {k: os.environ.get(k) for k in AWS_ENV}
        os.environ.update(AWS_ENV)
        stack.callback(_restore_env, old)
        stack.enter_context(mock_aws())
        session = boto3.Session(region_name="us-east-1")
        ami = session.client("ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        state = {"refuse": False}

        def maybe_refuse(**kwargs: Any) -> Any:
            if state["refuse"]:
                return client_error("InsufficientInstanceCapacity", "We currently do not have sufficient capacity")()
            return None

        session.events.register("before-call.ec2.RunInstances", maybe_refuse)

        def preempt(iid: str) -> None:
            """EC2 reclaims the spot instance (as AWS reports it: Server.SpotInstanceTermination)."""
            flt = [{"Name": "tag:rlboost-instance", "Values": [iid]}]
            res = session.client("ec2").describe_instances(Filters=flt)["Reservations"]
            backend = ec2_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
            for r in res:
                for i in r["Instances"]:
                    inst = backend.get_instance(i["InstanceId"])
                    inst.terminate()
                    code = "Server.SpotInstanceTermination"
                    inst.state_reason = StateReason(f"{code}: Spot instance termination", code)

        owner = Owner(job, 1, f"uid-{job}", "store-test")

        def make() -> AwsProvider:
            return AwsProvider(run_dir, owner, ["us-east-1"], session=session, ami=ami, describe_every_s=0)

        w = World(
            "aws", job, "us-east-1", make, lambda: state.update(refuse=True), preempt, cloud="aws", accelerator="V100"
        )
        w.session = session  # type: ignore[attr-defined]
        yield w


@contextmanager
def gcp_world(tmp: Path, job: str) -> Iterator[World]:
    from google.auth.credentials import AnonymousCredentials

    from rlboost.providers.gcp import GcpOptions, GcpProvider
    from tests.gce_fake import FakeGce

    fake = FakeGce()
    run_dir = tmp / "run"
    write_spec(run_dir, job)

    def make() -> GcpProvider:
        return GcpProvider(
            run_dir,
            Owner(job, 1, f"uid-{job}", "store-test"),
            "proj",
            credentials=AnonymousCredentials(),
            api_endpoint=fake.endpoint,
            options=GcpOptions(list_every_s=0),
        )

    def refuse() -> None:
        fake.exhausted.update({"us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"})

    w = World("gcp", job, "us-central1", make, refuse, fake.preempt, fake.boot_all, cloud="gcp")
    w.fake = fake  # type: ignore[attr-defined]
    try:
        yield w
    finally:
        fake.close()


WORLDS = {
    "local": local_world,
    "skypilot": skypilot_world,
    "skypilot-node": skypilot_node_world,
    "aws": aws_world,
    "gcp": gcp_world,
}


# ---- a real controller over a world's provider --------------------------------------------------

BOOT_TOKEN = "job-token-never-in-boot-data-7c1d"
BOOT_SECRET = "hf_secret_never_in_boot_data_91aa"


def launch_through_controller(world: World, tmp: Path, trainer_accelerator: str) -> Any:
    """A real Controller of a TLS job with a secret `--env HF_TOKEN` launches its trainer and a spot
    worker on the world's provider, as `rlboost launch` would; the provider. The trainer is not
    waited for (its node is not real): the worker is launched as if the trainer were up."""
    import contextlib
    import io

    from rich.console import Console

    from rlboost.cli.controller import Controller, TrainerFailed
    from rlboost.cli.job_envs import write_secret_envs
    from rlboost.cli.progress import JobProgress
    from rlboost.cli.state import StateStore
    from rlboost.contracts.spec import parse_spec, spec_to_yaml
    from rlboost.providers.prices import CloudPrices
    from rlboost.providers.pricing import spot_offers, trainer_offer

    spec = parse_spec(
        {
            "name": world.job,
            "provider": world.cloud,
            "envs": {"HF_TOKEN": None, "PLAIN_SETTING": "shown"},
            "trainer": {"cloud": world.cloud, "region": world.region, "accelerators": trainer_accelerator},
            "rollout": {
                "max_workers": 1,
                "candidates": [{"accelerator": world.accelerator, "clouds": [world.cloud], "regions": [world.region]}],
            },
        }
    )
    run_dir = tmp / "run"  # the world's provider's
    (run_dir / "spec.yaml").write_text(spec_to_yaml(spec))
    write_secret_envs(run_dir, {"HF_TOKEN": BOOT_SECRET})
    store = StateStore(tmp / "state.db")
    job_id = store.create_job(spec.name, spec_to_yaml(spec), spec.provider)
    prices = CloudPrices(use_skypilot=False)
    provider = world.provider()
    console = Console(file=io.StringIO())
    ctl = Controller(
        spec=spec,
        store=store,
        job_id=job_id,
        run_dir=run_dir,
        provider=_NoEndpoints(provider),  # type: ignore[arg-type]
        token=BOOT_TOKEN,
        trainer_offer=trainer_offer(spec, prices),
        spot_offers=spot_offers(spec, prices),
        console=console,
        poll_s=0.01,
        trainer_boot_timeout_s=0,
    )
    progress = JobProgress(console, spec.algorithm.steps)
    with contextlib.suppress(TrainerFailed):  # "did not come up": its address is never reported
        ctl._launch_trainer(progress)
    ctl.trainer_url = "https://203.0.113.9:8787"
    assert ctl._launch_worker(progress, ctl.spot_offers[0])
    return provider


class _NoEndpoints:
    """The provider, minus the trainer's address: nothing is dialled (the cloud's addresses are not real)."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider

    def __getattr__(self, name: str) -> Any:
        return getattr(self.provider, name)

    def poll(self) -> list[InstanceEvent]:
        from dataclasses import replace

        return [replace(e, endpoint=None) for e in self.provider.poll()]


def assert_no_secret(boot_data: str, what: str) -> None:
    """Boot data holds no job token, no TLS private key, no secret variable's value."""
    assert BOOT_TOKEN not in boot_data, f"the job token is in the {what}"
    assert "PRIVATE KEY" not in boot_data, f"a TLS private key is in the {what}"
    assert BOOT_SECRET not in boot_data, f"a secret variable's value is in the {what}"
