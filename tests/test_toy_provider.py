"""A provider from outside the package: this module defines a provider class, its record and a cloud of
its own, registers them, and a job file naming them validates, passes preflight and builds the class;
unregistered, the same file is an error again. Nothing in rlboost/ is edited to add it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rlboost.contracts.cloud_kinds import CloudKind, register_cloud, unregister_cloud
from rlboost.contracts.provider_kinds import ProviderKind, provider_kind, register_provider, unregister_provider
from rlboost.contracts.spec import JobSpec, SpecError, load_spec
from rlboost.providers import make_provider, preflight, provider_class
from rlboost.providers.base import (
    InstanceEvent,
    InstanceKind,
    InstanceState,
    LaunchRequest,
    Owner,
    Provider,
    Role,
    Tagged,
)
from rlboost.providers.bootstrap import node_env
from rlboost.worker.notice import FileNotice, watcher_from_env

TOY_CLOUD = CloudKind(name="toycloud", notice="file")
# a cloud API of its own, like aws's (one cloud, wall-clock billing, no trainer node), but picking its
# own regions and booting from no template
TOY = replace(
    provider_kind("aws"),
    name="toy",
    provider_class=f"{__name__}:ToyProvider",
    libraries=("json",),
    extra="toy",
    clouds=("toycloud",),
    needs_regions=False,
    boot_templates=(),
)

JOB = """\
name: toy-job
provider: toy
trainer: {cloud: toycloud, accelerators: "A100:8"}
rollout:
  max_workers: 1
  candidates: [{accelerator: A100, clouds: [toycloud], spot_price: 1.0, on_demand_price: 3.0}]
"""


class ToyProvider:
    """Instances are entries in a dict: launched pending, running at the next poll."""

    name = "toy"
    kind = TOY

    @classmethod
    def setup_problems(cls) -> list[str]:
        return []

    @classmethod
    def boot_data_problems(cls, requests: list[LaunchRequest], saved: str) -> list[str]:
        return []

    @classmethod
    def for_job(cls, spec: JobSpec, run_dir: Path, *, owner: Owner, market: Any = None) -> ToyProvider:
        return cls(owner)

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.live: dict[str, LaunchRequest] = {}
        self.events: list[InstanceEvent] = []

    def launch(self, req: LaunchRequest) -> str | None:
        self.live[req.instance_id] = req
        self.events.append(InstanceEvent(req.instance_id, InstanceState.RUNNING, self.clock()))
        return req.instance_id

    def poll(self) -> list[InstanceEvent]:
        out, self.events = self.events, []
        return out

    def terminate(self, instance_id: str) -> None:
        if self.live.pop(instance_id, None) is not None:
            self.events.append(InstanceEvent(instance_id, InstanceState.TERMINATED, self.clock()))

    def list_owned(self, owner: Owner) -> list[str]:
        return [i for i, r in self.live.items() if owner.owns(i, r.tags)]

    def list_tagged(self) -> list[Tagged]:
        return [Tagged.of(i, r.tags) for i, r in self.live.items()]

    def exit_clock(self, instance_id: str) -> float | None:
        return None

    def adopt(self, req: LaunchRequest) -> bool:
        return req.instance_id in self.live

    def clock(self) -> float:
        return time.time()

    def close(self) -> None:
        pass


@pytest.fixture
def toy() -> Iterator[ProviderKind]:
    register_cloud(TOY_CLOUD)
    register_provider(TOY)
    try:
        yield TOY
    finally:
        unregister_provider(TOY.name)
        unregister_cloud(TOY_CLOUD.name)


def test_a_provider_registered_from_outside_runs_a_job_file(toy: ProviderKind, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    spec = load_spec(job)
    assert spec.provider == "toy" and spec.rollout.candidates[0].clouds == ["toycloud"]
    assert spec.controller == "launcher"  # its record has no trainer node
    preflight(spec)  # its library imports; its cloud has no credentials to look for
    assert provider_class("toy") is ToyProvider and provider_kind("toy") is toy

    owner = Owner(spec.name, 1, "uid-toy")
    p = make_provider(spec, tmp_path, owner=owner)
    try:
        assert type(p) is ToyProvider and isinstance(p, Provider) and p.kind is toy
        req = LaunchRequest("toy-job-1-w001", owner, Role.WORKER, InstanceKind.SPOT, "toycloud", None, "A100", 1.0)
        p.launch(req)
        assert [e.state for e in p.poll()] == [InstanceState.RUNNING]
        assert p.list_owned(owner) == [req.instance_id]
    finally:
        p.close()

    # its cloud's record says where a worker there watches for notices: the provider's notice file
    env = node_env(req, port=1, from_workdir=False)
    assert env["RLBOOST_NOTICE"] == "file"
    watcher = watcher_from_env({**env, "RLBOOST_NOTICE_FILE": str(tmp_path / "notice")})
    assert isinstance(watcher, FileNotice)


def test_unregistered_the_job_file_is_an_error_again(toy: ProviderKind, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    load_spec(job)
    unregister_provider(toy.name)
    unregister_cloud("toycloud")
    with pytest.raises(SpecError) as e:
        load_spec(job)
    assert "provider: invalid value 'toy'; input should be 'local', 'skypilot', 'aws' or 'gcp'" in str(e.value)
    assert "rollout.candidates[0].clouds: unknown cloud 'toycloud' (allowed: aws, gcp, azure" in str(e.value)


def test_a_taken_name_or_an_unknown_cloud_is_refused(toy: ProviderKind) -> None:
    register_provider(toy)  # the same record again: nothing changes
    with pytest.raises(ValueError, match="provider 'toy' is registered already"):
        register_provider(replace(toy, extra="other"))
    with pytest.raises(ValueError, match="cloud 'aws' is registered already"):
        register_cloud(CloudKind(name="aws"))
    with pytest.raises(ValueError, match="unknown cloud 'nowhere'"):
        register_provider(replace(toy, name="toy2", clouds=("nowhere",)))
