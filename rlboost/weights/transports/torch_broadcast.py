"""The `torch` transport: each version broadcast over torch.distributed to the workers in the trainer's
own network (the mechanism: rlboost/weights/broadcast.py).

Trainer end: for each published version, pick the members among the receivers (never the reserved
engine on the trainer's own machine, which maps the version's buffer instead), open the transfer and
run it in the background while they join; each member is offered the transfer's `BroadcastPlan`.
Worker end: join the broadcast into a buffer of the worker's store, every chunk verified; any failure
(a member died and this one was left out, the rendezvous is unreachable, a chunk arrived corrupt) is
a TransportError, and the worker pulls the version over HTTP instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from rlboost.contracts.protocol import Offer
from rlboost.weights.broadcast import (
    Backend,
    BroadcastError,
    BroadcastOptions,
    BroadcastPlan,
    BroadcastResult,
    Transfer,
    receive,
)
from rlboost.weights.buffers import HostBuffer, tensor_views
from rlboost.weights.transports.base import Fetch, Receiver, Site, TrainerEnd, TransportError, WeightTransport

if TYPE_CHECKING:
    import torch

log = logging.getLogger("rlboost.broadcast")


def suits(trainer: Site, members: Sequence[Site], *, one_host: bool) -> bool:
    """Whether `auto` broadcasts to `members`: only when every one is on a GPU in the trainer's network
    (the trainer's machine, or its cloud and region), since a broadcast waits on its slowest member
    and NCCL needs direct routes."""
    if not members or not trainer.cuda:
        return False
    for m in members:
        if not m.cuda:
            return False
        if not one_host and (m.cloud != trainer.cloud or m.region is None or m.region != trainer.region):
            return False
    return True


def backend_for(trainer: Site, members: Sequence[Site], *, one_host: bool) -> Backend:
    """NCCL between GPUs on different machines; gloo otherwise, and on one machine, where the members
    would share GPUs and NCCL refuses two ranks on one device."""
    if one_host or not trainer.cuda or not all(m.cuda for m in members):
        return "gloo"
    return "nccl"


class TorchBroadcast(WeightTransport):
    name = "torch"
    auto = True  # `auto` broadcasts where it `suits`

    def __init__(self, trainer: TrainerEnd | None = None) -> None:
        super().__init__(trainer)
        self.opts = BroadcastOptions(bind_host=trainer.bind_host if trainer else "127.0.0.1")
        self._task: asyncio.Task | None = None

    # ---- the trainer's end
    def decide(self, receivers: Sequence[Receiver]) -> tuple[list[Receiver], Backend] | None:
        """The members of a broadcast among `receivers` and its backend, or None: they pull over HTTP."""
        end = self.end
        members = [r for r in receivers if r.kind != "reserved"]
        sites = [r.site for r in members]
        if not members or not (end.forced or suits(end.site, sites, one_host=end.one_host)):
            return None
        return members, backend_for(end.site, sites, one_host=end.one_host)

    async def publish(self, version: int, receivers: Sequence[Receiver]) -> dict[str, Offer]:
        """Offers for the members of `version`'s broadcast, whose send is running when this returns."""
        chosen = self.decide(receivers)
        if chosen is None:
            return {}
        members, backend = chosen
        await self._wait()  # one broadcast at a time (each is bounded by its timeouts)
        publisher = self.end.publisher
        m = await publisher.wait_manifest(version)
        got = publisher.chunk_buffer(version, 0) if m is not None else None
        if m is None or got is None:
            return {}
        opts = replace(self.opts, backend=backend, device="cuda" if backend == "nccl" else "cpu")
        transfer = Transfer(m, [r.id for r in members], opts)
        publisher.pin(version)  # its buffer must outlive the send
        self._task = asyncio.create_task(self._send(transfer, version, got[1]))
        offer = self.offer(transfer.plan.model_dump(mode="json"))
        return {r.id: offer for r in members}

    async def _send(self, transfer: Transfer, version: int, buf: HostBuffer) -> None:
        try:
            res: BroadcastResult = await asyncio.to_thread(transfer.send, buf)
        except Exception:  # the members then time out and pull: the job goes on
            log.warning("broadcast v%d failed on the trainer", version, exc_info=True)
            return
        finally:
            transfer.close()
            self.end.publisher.unpin(version)
        self.carried(version, len(res.delivered), len(res.missed))
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

    async def close(self) -> None:
        await self._wait()

    async def _wait(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    # ---- a worker's end
    async def fetch(self, job: Fetch, plan: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Receive the version into a buffer of the worker's store, as tensors that are views into it."""
        try:
            p = plan_for(plan, job.version, job.base_url)
        except BroadcastError as e:
            raise TransportError(str(e)) from e
        m, store = p.manifest, job.store
        buf = store.buffer(m.total_bytes)
        mark = store.begin(m, buf)
        device = "cuda" if p.backend == "nccl" else "cpu"
        try:
            await asyncio.to_thread(receive, p, job.member, buf, device=device)
        except BaseException as e:
            store.abandon(job.version)
            if isinstance(e, BroadcastError):
                raise TransportError(str(e)) from e
            raise
        for c in m.chunks:  # every one verified by `receive`
            mark(c.index)
        store.complete(job.version)
        job.stats.mode = "broadcast"
        job.stats.total_bytes = job.stats.bytes_received = m.total_bytes
        job.stats.chunks = len(m.chunks)
        return tensor_views(buf.view, m.tensors)


def plan_for(raw: Mapping[str, Any], version: int, trainer_url: str) -> BroadcastPlan:
    """The plan from an offer, aimed at the trainer's address as this worker reaches it (the URL it
    dialed: the trainer may know itself only by a bind address such as 0.0.0.0)."""
    try:
        plan = BroadcastPlan.model_validate(raw)
    except ValidationError as e:
        raise BroadcastError(f"malformed broadcast plan: {e.errors()[0]['msg']}") from e
    if plan.version != version:
        raise BroadcastError(f"broadcast plan is for version {plan.version}, not {version}")
    host = urlsplit(trainer_url).hostname
    return plan.model_copy(update={"host": host}) if host else plan
