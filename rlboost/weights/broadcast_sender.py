"""The trainer's use of the torch.distributed weight broadcast (rlboost/weights/broadcast.py): for each
published version, decide from `weights.transport` whether the remote workers get it by broadcast,
open the transfer, and run it in the background while they join. The reserved engine on the trainer's
own machine maps the version's buffer instead and is never a member."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace

from rlboost.weights.broadcast import (
    Backend,
    BroadcastOptions,
    BroadcastResult,
    Site,
    Transfer,
    Transport,
    backend_for,
    choose_transport,
)
from rlboost.weights.publisher import WeightPublisher

log = logging.getLogger("rlboost.broadcast")


@dataclass(frozen=True)
class Receiver:
    """A connected engine a new version goes to."""

    id: str
    kind: str  # spot | on-demand | reserved
    cuda: bool
    cloud: str | None = None  # as the worker reports it (None: unknown, never "in the trainer's network")
    region: str | None = None


class BroadcastSender:
    def __init__(self, setting: Transport, trainer: Site, *, local: bool, opts: BroadcastOptions) -> None:
        """`local`: the local provider, whose workers share the trainer's machine (its network)."""
        self.setting, self.trainer, self.local, self.opts = setting, trainer, local, opts
        self.last: dict | None = None  # the last finished broadcast, for the step record
        self.versions = self.delivered = self.missed = 0
        self._task: asyncio.Task | None = None

    def _site(self, r: Receiver) -> Site:
        if self.local:  # the local provider's workers share the trainer's machine
            return Site("local", None, r.cuda)
        return Site(r.cloud or "unknown", r.region, r.cuda)

    def decide(self, receivers: list[Receiver]) -> tuple[list[Receiver], Backend] | None:
        """The members of a broadcast among `receivers` and its backend, or None: pull over HTTP."""
        members = [r for r in receivers if r.kind != "reserved"]
        sites = [self._site(r) for r in members]
        if not members or choose_transport(self.setting, self.trainer, sites) != "torch":
            return None
        return members, backend_for(self.trainer, sites)

    async def start(self, publisher: WeightPublisher, version: int, receivers: list[Receiver]) -> dict[str, dict]:
        """Plans (worker id -> plan JSON) for the members of `version`'s broadcast, whose send is
        running when this returns; {} when the version goes over HTTP only."""
        chosen = self.decide(receivers)
        if chosen is None:
            return {}
        members, backend = chosen
        await self.wait()  # one broadcast at a time (each is bounded by its timeouts)
        m = await publisher.wait_manifest(version)
        got = publisher.chunk_buffer(version, 0) if m is not None else None
        if m is None or got is None:
            return {}
        opts = replace(self.opts, backend=backend, device="cuda" if backend == "nccl" else "cpu")
        transfer = Transfer(m, [r.id for r in members], opts)
        publisher.pin(version)  # its buffer must outlive the send
        self._task = asyncio.create_task(self._send(transfer, publisher, version, got[1]))
        plan = transfer.plan.model_dump(mode="json")
        return {r.id: plan for r in members}

    async def _send(self, transfer: Transfer, publisher: WeightPublisher, version: int, buf: object) -> None:
        try:
            res: BroadcastResult = await asyncio.to_thread(transfer.send, buf)  # type: ignore[arg-type]
        except Exception:  # the members then time out and pull: the job goes on
            log.warning("broadcast v%d failed on the trainer", version, exc_info=True)
            return
        finally:
            transfer.close()
            publisher.unpin(version)
        self.versions += 1
        self.delivered += len(res.delivered)
        self.missed += len(res.missed)
        self.last = {"version": version, "delivered": len(res.delivered), "missed": len(res.missed)}
        log.info(
            "broadcast v%d (%s): %d of %d members in %.2fs, %d round(s)%s",
            version,
            transfer.plan.backend,
            len(res.delivered),
            len(transfer.plan.members),
            res.seconds,
            res.rounds,
            f"; pulling over HTTP: {', '.join(res.missed)}" if res.missed else "",
        )

    async def wait(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def stats(self) -> dict:
        return {
            "transport": self.setting,
            "versions": self.versions,
            "delivered": self.delivered,
            "missed": self.missed,
            "last": self.last,
        }
