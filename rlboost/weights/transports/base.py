"""The `WeightTransport` interface: how a published version reaches a worker.

Every version is published to the trainer's HTTP routes first (rlboost/weights/publisher.py), and a
worker can always pull it from there (the `http` transport). Another transport carries a version some
other way to the receivers it takes: its trainer end says so in an `Offer` per receiver (sent in the
`version` message), and that receiver's end of the same transport fetches it as the offer's plan
says. A receiver whose fetch fails pulls the version over HTTP, so a failed transport costs time,
never the version.

One class per transport holds both ends; the factory (rlboost/weights/transports/__init__.py) makes a
trainer's end with a `TrainerEnd`, a worker's end with nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from rlboost.contracts.protocol import Offer

if TYPE_CHECKING:
    import aiohttp
    import torch

    from rlboost.weights.publisher import WeightPublisher
    from rlboost.weights.pull import PullOptions, PullStats
    from rlboost.weights.store import WeightStore


class TransportError(RuntimeError):
    """This worker did not get the version this way (it pulls it over HTTP instead)."""


class UnknownTransportError(ValueError):
    """A transport name with no registration; the message names the registered ones."""


@dataclass(frozen=True)
class Site:
    """Where a node runs, as far as a transport cares."""

    cloud: str | None
    region: str | None
    cuda: bool


@dataclass(frozen=True)
class Receiver:
    """A connected engine a new version goes to."""

    id: str
    kind: str  # spot | on-demand | reserved
    cuda: bool
    cloud: str | None = None  # as the worker reports it (None: unknown, never "in the trainer's network")
    region: str | None = None

    @property
    def site(self) -> Site:
        return Site(self.cloud, self.region, self.cuda)


@dataclass(frozen=True)
class TrainerEnd:
    """What a transport's trainer end is made with."""

    setting: str  # the job file's `weights.transport`: a transport's name, or `auto`
    publisher: WeightPublisher  # every version is staged there before a transport publishes it
    site: Site  # the trainer's own
    # the provider's workers run on the trainer's machine (ProviderKind.runs_here): they are in its
    # network whatever cloud and region they report, and share its GPUs
    one_host: bool = False
    bind_host: str = "127.0.0.1"  # where a transport's own listener (a rendezvous) binds

    @property
    def forced(self) -> bool:
        """The job named the transport, so it carries every version it can (`auto` picked it: only where it suits)."""
        return self.setting != "auto"


@dataclass
class Fetch:
    """One version for a worker to get, as a transport's worker end is handed it."""

    version: int
    base_url: str  # the trainer as this worker reaches it (the pull's origin, a rendezvous's host)
    member: str  # this worker's id
    store: WeightStore  # where the version lands: served to peers once whole, the next delta's base
    session: aiohttp.ClientSession
    pull: PullOptions  # how this worker pulls (for the HTTP pull)
    stats: PullStats  # filled in by the fetch (mode, bytes); the caller sets the version and the time
    on_progress: Callable[[int, int], None] | None = None  # (done bytes, total bytes)


class WeightTransport(ABC):
    """One way a version travels: publish it (trainer), fetch it (worker), close.

    A subclass names itself (`name`, the job file's `weights.transport` value) and is registered with
    `register_transport` (rlboost/weights/transports/__init__.py)."""

    name: ClassVar[str]
    # `weights.transport: auto` uses the first registered transport marked auto, which then carries a
    # version only to receivers it suits (everyone else pulls)
    auto: ClassVar[bool] = False

    def __init__(self, trainer: TrainerEnd | None = None) -> None:
        """`trainer`: this is the trainer's end; None: a worker's end (it only fetches)."""
        self.trainer = trainer
        # what the trainer end carried (a push transport counts each finished version with `carried`)
        self.versions = self.delivered = self.missed = 0
        self.last: dict | None = None  # the last version carried, for the step record

    @property
    def end(self) -> TrainerEnd:
        if self.trainer is None:
            raise RuntimeError(f"the {self.name} transport was made for a worker: it cannot publish")
        return self.trainer

    @abstractmethod
    async def publish(self, version: int, receivers: Sequence[Receiver]) -> dict[str, Offer]:
        """Start carrying `version` (already staged in the publisher) to the receivers this transport
        takes; returns the offer each of them is sent (receiver id -> offer). {}: they all pull it."""

    @abstractmethod
    async def fetch(self, job: Fetch, plan: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Get `job.version` into `job.store` as `plan` (the trainer's offer) says; returns its
        tensors, views into the store's buffer. Raises TransportError when it could not."""

    async def close(self) -> None:
        """Finish what is in flight and release what the transport holds."""
        return None

    def offer(self, plan: Mapping[str, Any]) -> Offer:
        """The offer that sends a receiver to this transport's worker end with `plan`."""
        return Offer(transport=self.name, plan=dict(plan))

    def carried(self, version: int, delivered: int, missed: int) -> None:
        """Count one version carried: `delivered` receivers hold it, `missed` must pull it."""
        self.versions += 1
        self.delivered += delivered
        self.missed += missed
        self.last = {"version": version, "delivered": delivered, "missed": missed}

    def stats(self) -> dict:
        """For /v1/status (`weights.broadcast`): the job's setting and what was carried."""
        return {
            "transport": self.trainer.setting if self.trainer else self.name,
            "versions": self.versions,
            "delivered": self.delivered,
            "missed": self.missed,
            "last": self.last,
        }
