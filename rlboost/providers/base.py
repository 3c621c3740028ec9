"""The Provider protocol: the one seam between rlboost and any source of machines.

A provider launches instances (the on-demand trainer, spot rollout workers), reports their state
changes, terminates them, lists what it owns for a job (so orphans can be found), and prices them.
Every provider passes tests/test_provider_contract.py.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rlboost.contracts.provider_kinds import ProviderKind

if TYPE_CHECKING:
    from rlboost.contracts.spec import JobSpec


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


# The tags (AWS) / labels (GCP, SkyPilot) every instance carries. The job's uid decides ownership;
# the name is for people reading a cloud console; the store says which rlboost state store launched it.
JOB_TAG, UID_TAG, STORE_TAG = "rlboost-job", "rlboost-job-uid", "rlboost-store"
# which process launched the instance (`<machine>-<boot>-<pid>-<start ticks>`, rlboost/cli/pids.py
# controller_tag; NODE_CONTROLLER: the job's controller runs on its trainer node): `gc --all-stores`
# keeps another store's job whose controller still runs
CONTROLLER_TAG, NODE_CONTROLLER = "rlboost-controller", "trainer-node"
INSTANCE_TAG, ROLE_TAG = "rlboost-instance", "rlboost-role"


def instance_name_re(job: str, job_id: int | None = None) -> re.Pattern[str]:
    """Names rlboost gives a job's instances: `{job}-{job id}-trainer` (`-trainer-r1`... when a lost
    trainer is relaunched) / `{job}-{job id}-w001`; `job_id` None: any run of that name.

    Anchored, so job `demo` never claims the instances of job `demo-2`.
    """
    run = r"\d+" if job_id is None else str(int(job_id))
    return re.compile(rf"^{re.escape(job)}-{run}-(trainer(-r\d+)?|w\d+)$")


@dataclass(frozen=True)
class Owner:
    """Whose instances these are, by identity: the job's uid, unique across every store and machine
    (a job name is reused; a store's job id repeats in another store). `gc`, `launch` and `down` act
    on an instance only when its uid tag is that of a job they own, never on a name match.

    `uid` None: a job recorded before rlboost tagged instances by uid; its instances are known by
    name and by the store's job id, which their names embed (never by name alone)."""

    name: str
    job_id: int
    uid: str | None = None
    store: str | None = None  # the state store that launched it: reported, not used to decide
    controller: str | None = None  # the launching controller (CONTROLLER_TAG): a sign of life, never identity

    def tags(self, instance_id: str, role: Role) -> dict[str, str]:
        """The tags/labels an instance of this job carries (values fit GCP's label rules: the name
        and ids are lowercase letters, digits and dashes)."""
        out = {JOB_TAG: self.name, INSTANCE_TAG: instance_id, ROLE_TAG: role.value}
        if self.uid:
            out[UID_TAG] = self.uid
        if self.store:
            out[STORE_TAG] = self.store
        if self.controller:
            out[CONTROLLER_TAG] = self.controller
        return out

    def owns(self, instance_id: str, tags: Mapping[str, str]) -> bool:
        """Is the instance named `instance_id` with these tags/labels this job's?"""
        if self.uid:
            return tags.get(UID_TAG) == self.uid
        if tags.get(UID_TAG):  # a uid-tagged instance belongs to a job that has one
            return False
        return tags.get(JOB_TAG, self.name) == self.name and bool(
            instance_name_re(self.name, self.job_id).match(instance_id)
        )


@dataclass(frozen=True)
class Tagged:
    """An rlboost instance a provider lists, with whose it says it is (for `gc` across stores)."""

    instance_id: str
    job: str | None
    uid: str | None
    store: str | None
    controller: str | None = None  # CONTROLLER_TAG: who launched it

    @classmethod
    def of(cls, instance_id: str, tags: Mapping[str, str]) -> Tagged:
        return cls(
            instance_id,
            tags.get(JOB_TAG),
            tags.get(UID_TAG) or None,
            tags.get(STORE_TAG) or None,
            tags.get(CONTROLLER_TAG) or None,
        )


@dataclass(frozen=True)
class LaunchRequest:
    instance_id: str  # chosen by the controller, recorded before launch
    owner: Owner  # the job, by identity: what the instance is tagged with
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

    @property
    def job(self) -> str:
        """The job's name."""
        return self.owner.name

    @property
    def tags(self) -> dict[str, str]:
        return self.owner.tags(self.instance_id, self.role)


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
    kind: ProviderKind  # what it can do (rlboost/contracts/provider_kinds.py): callers ask it, never the name

    def launch(self, req: LaunchRequest) -> str | None:
        """Ask for an instance. Returns once the request is accepted, with the provider's handle for it
        (a cloud instance id, a pid, a request id; None if it has none yet); state arrives via poll().
        The instance carries `req.tags` from its creation on."""

    def poll(self) -> list[InstanceEvent]:
        """State changes since the last poll (never blocks for long)."""

    def terminate(self, instance_id: str) -> None:
        """Terminate; idempotent; unknown ids are ignored."""

    def list_owned(self, owner: Owner) -> list[str]:
        """Instance ids this provider holds for the job (live ones, by `owner.owns`), for orphan
        reconciliation. A cloud's listing may lag a launch by seconds (eventual consistency)."""

    def list_tagged(self) -> list[Tagged]:
        """Every live rlboost instance this provider can see (its regions, project, clusters), whoever
        launched it: `gc` reports those of other stores and leaves them alone."""

    def exit_clock(self, instance_id: str) -> float | None:
        """For an instance that is gone: when it stopped, on the billing clock, if the provider can
        still tell (a cloud's termination time, a local node's last heartbeat); else None."""

    def adopt(self, req: LaunchRequest) -> bool:
        """Track an instance a previous controller launched (after a controller restart), so poll()
        and terminate() cover it; False when it no longer exists. `req` is rebuilt from the state
        store (no command or secrets)."""

    def clock(self) -> float:
        """Billing clock in seconds (wall time for clouds, trace time for the local market)."""

    def close(self) -> None:
        """Release background resources (not instances)."""


class ProviderClass(Protocol):
    """A provider class as rlboost/providers/__init__.py's registry holds it: its kind, and how a job builds one."""

    kind: ProviderKind

    def setup_problems(self) -> list[str]:
        """What the launching machine lacks for this provider beyond its clouds' credentials (which
        preflight checks from the clouds' records), one line each with its fix (a classmethod)."""
        ...

    def boot_data_problems(self, requests: list[LaunchRequest], saved: str) -> list[str]:
        """What in these launch requests (a job's trainer and a worker, as its controller would build them;
        `saved`: the job file as launched) the provider's cloud would refuse at launch for its boot data's
        size, one line each naming the job-file field and the fix (a classmethod; [] where a node gets
        its files and variables another way)."""
        ...

    def for_job(self, spec: JobSpec, run_dir: Path, *, owner: Owner, market: Any = None) -> Provider:
        """The provider for a job's run dir (`owner`: the job its instances are tagged with; `market`:
        the local provider's spot market). Raises PreflightError for what the job's setup lacks."""
        ...


def job_regions(spec: JobSpec, cloud: str) -> list[str]:
    """The regions a job names for `cloud`: the trainer's, if it runs there, and its candidates'."""
    regions = [spec.trainer.region] if spec.trainer.cloud == cloud and spec.trainer.region else []
    for c in spec.rollout.candidates:
        if cloud in c.clouds:
            regions.extend(c.regions)
    return sorted(set(regions))
