"""The provider of a controller that runs on the trainer node itself (`controller: trainer` on a cloud).

The node is the job's on-demand instance, up for the job's whole life: its controller runs the
trainer as a process next to itself (as the local provider does) and sends every spot worker to the
cloud provider it wraps (SkyPilot). Workers dial the trainer at the node's public address, which
the trainer cannot know itself (it binds 0.0.0.0): the endpoint it announces is rewritten to it.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from rlboost.providers.base import InstanceEvent, LaunchRequest, Owner, Provider, Role, Tagged
from rlboost.providers.local import LocalProvider

TRAINER_NAME = re.compile(r"-trainer(-r\d+)?$")


class _NoSpotMarket:
    """The local half runs only the trainer: no spot capacity, nobody preempted."""

    def capacity(self, t: float) -> int:
        return 0

    def choose_victims(self, t: float, running: list[str]) -> list[tuple[str, bool]]:
        return []


def public_endpoint(url: str, host: str) -> str:
    """`url` (what the trainer wrote: its bind address) with the node's public host in its place."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{host}{port}"))


class TrainerHere:
    """Trainer: a process on this node; workers: `workers` (a cloud provider). One billing clock,
    the cloud's (wall time)."""

    def __init__(
        self, run_dir: Path, workers: Provider, *, public_host: str, port: int, owner: Owner | None = None
    ) -> None:
        self.name = workers.name
        self.kind = workers.kind  # the job's provider: the trainer process here is its stand-in
        self.workers = workers
        self.public_host, self.port = public_host, port
        self.here = LocalProvider(run_dir, _NoSpotMarket(), time_scale=1.0, term_grace_s=30.0, owner=owner)

    def _owner(self, instance_id: str) -> Provider:
        # rlboost names a trainer `{job}-{id}-trainer` (`-rN` when relaunched), known after a restart too
        return self.here if TRAINER_NAME.search(instance_id) else self.workers

    # ---- Provider protocol -------------------------------------------------------------
    def clock(self) -> float:
        return self.workers.clock()

    def launch(self, req: LaunchRequest) -> str | None:
        if req.role is not Role.TRAINER:
            return self.workers.launch(req)
        # the port the cluster opened (sky `ports:`), on every interface, so workers can dial it
        cmd = [*req.command, "--host", "0.0.0.0", "--port", str(self.port)]
        return self.here.launch(replace(req, command=cmd))

    def poll(self) -> list[InstanceEvent]:
        now = self.clock()
        mine = [
            replace(e, at=now, endpoint=public_endpoint(e.endpoint, self.public_host) if e.endpoint else None)
            for e in self.here.poll()
        ]
        return mine + self.workers.poll()

    def terminate(self, instance_id: str) -> None:
        self._owner(instance_id).terminate(instance_id)

    def list_owned(self, owner: Owner) -> list[str]:
        return sorted({*self.here.list_owned(owner), *self.workers.list_owned(owner)})

    def list_tagged(self) -> list[Tagged]:
        return [*self.here.list_tagged(), *self.workers.list_tagged()]

    def exit_clock(self, instance_id: str) -> float | None:
        if self._owner(instance_id) is self.workers:
            return self.workers.exit_clock(instance_id)
        at = self.here.exit_clock(instance_id)  # the local half's clock: seconds since its origin, at scale 1
        return None if at is None else self.here.t0 + at

    def adopt(self, req: LaunchRequest) -> bool:
        return (self.here if req.role is Role.TRAINER else self.workers).adopt(req)

    def close(self) -> None:
        self.workers.close()
