"""The Provider protocol: the one seam between rlboost and any source of machines.

A provider launches instances (the on-demand trainer, spot rollout workers), reports their state
changes, terminates them, lists what it owns for a job (so orphans can be found), and prices them.
Every provider passes tests/test_provider_contract.py.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from contracts.provider_kinds import ProviderKind

if TYPE_CHECKING:
    from contracts.spec import JobSpec


class InstanceKind(str, enum.Enum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class Role(str, enum.Enum):
    TRAINER = "trainer"
    WORKER = "worker"


class InstanceState(str, enum.Enum):
    PENDING = "pending"  # asked for, not yet running
    RUNNING = "running"
    NOTICE = "notice"  # the cloud announced a preemption; still running
    PREEMPTED = "preempted"  # taken away by the cloud (terminal)
    EXITED = "exited"  # its process ended by itself (terminal)
    TERMINATED = "terminated"  # we terminated it (terminal)
    FAILED = "failed"  # never came up (terminal)

    @property
    def terminal(self) -> bool:
        return self in (self.PREEMPTED, self.EXITED, self.TERMINATED, self.FAILED)


@dataclass(frozen=True)
class LaunchRequest:
    instance_id: str  # chosen by the controller, recorded before launch
    job: str
    role: Role
    kind: InstanceKind
    cloud: str
    region: str | None
    accelerator: str | None
    hourly_price: float
    env: dict[str, str] = field(default_factory=dict)  # bootstrap environment (trainer URL, token...)
    command: list[str] = field(default_factory=list)  # what the node runs once up
    # the job's own variables (`envs:`): plain ones, and secret ones (`launch --env`), which every
    # provider passes the way it passes the job token and never writes into a record
    user_envs: dict[str, str] = field(default_factory=dict)
    user_secrets: dict[str, str] = field(default_factory=dict)
    # `file_mounts:` (node path -> local absolute path or bucket URL) and `workdir:` (local absolute dir)
    file_mounts: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None


@dataclass(frozen=True)
class InstanceEvent:
    instance_id: str
    state: InstanceState
    at: float  # provider clock (billing time), seconds
    detail: str = ""
    endpoint: str | None = None  # e.g. the trainer's URL once it is up
    # FAILED because the cloud had no capacity (an async CapacityError): the controller backs off
    capacity: bool = False


class CapacityError(Exception):
    """No capacity for this request right now (like sky.exceptions.ResourcesUnavailableError)."""


class ProviderError(Exception):
    """Anything else the provider could not do; the message is user-facing."""


@runtime_checkable
class Provider(Protocol):
    name: str
    kind: ProviderKind  # what it can do (contracts/provider_kinds.py): callers ask it, never the name

    def launch(self, req: LaunchRequest) -> None:
        """Ask for an instance. Returns once the request is accepted; state arrives via poll()."""

    def poll(self) -> list[InstanceEvent]:
        """State changes since the last poll (never blocks for long)."""

    def terminate(self, instance_id: str) -> None:
        """Terminate; idempotent; unknown ids are ignored."""

    def list_owned(self, job: str) -> list[str]:
        """Instance ids this provider holds for the job (live ones), for orphan reconciliation."""

    def adopt(self, req: LaunchRequest) -> bool:
        """Track an instance a previous controller launched (after a controller restart), so poll()
        and terminate() cover it; False when it no longer exists. `req` is rebuilt from the state
        store (no command or secrets)."""

    def clock(self) -> float:
        """Billing clock in seconds (wall time for clouds, trace time for the local market)."""

    def close(self) -> None:
        """Release background resources (not instances)."""


class ProviderClass(Protocol):
    """A provider class as providers/__init__.py's registry holds it: its kind, and how a job builds one."""

    kind: ProviderKind

    def for_job(self, spec: JobSpec, run_dir: Path, *, job: str, market: Any = None) -> Provider:
        """The provider for a job's run dir (`job`: the name its instances are tagged with; `market`: the
        local provider's spot market). Raises PreflightError for what the job's setup lacks."""
        ...


def job_regions(spec: JobSpec, cloud: str) -> list[str]:
    """The regions a job names for `cloud`: the trainer's, if it runs there, and its candidates'."""
    regions = [spec.trainer.region] if spec.trainer.cloud == cloud and spec.trainer.region else []
    for c in spec.rollout.candidates:
        if cloud in c.clouds:
            regions.extend(c.regions)
    return sorted(set(regions))
