"""A worker's end of the torch.distributed weight broadcast (rlboost/weights/broadcast.py): join the
broadcast the trainer announced and, when that fails (a member died and this one was left out, the
rendezvous is unreachable, a chunk arrived corrupt), pull the same version over HTTP instead, so a
broken broadcast costs time, never the version."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from rlboost.weights.broadcast import BroadcastError, BroadcastPlan, receive
from rlboost.weights.buffers import HostBuffer, tensor_views
from rlboost.weights.pull import PullOptions, PullStats, pull_weights

if TYPE_CHECKING:
    import torch

    from rlboost.weights.store import WeightStore


@dataclass
class BroadcastStats:
    version: int = -1
    mode: str = "broadcast"  # broadcast | http (the fallback)
    fallback_reason: str = ""
    seconds: float = 0.0


async def receive_or_pull(
    plan: BroadcastPlan,
    member: str,
    base_url: str,
    *,
    token: str | None = None,
    device: str = "cpu",
    stats: BroadcastStats | None = None,
    pull_stats: PullStats | None = None,
) -> dict[str, torch.Tensor]:
    """Version `plan.version` as tensors (views into one buffer), over the broadcast if it works,
    else pulled from `base_url` (verified chunk by chunk either way)."""
    st = stats if stats is not None else BroadcastStats()
    st.version, t0 = plan.version, time.monotonic()
    try:
        buf = HostBuffer(plan.manifest.total_bytes, shareable=False)
        await asyncio.to_thread(receive, plan, member, buf, device=device)
        st.seconds = time.monotonic() - t0
        return tensor_views(buf.view, plan.manifest.tensors)
    except BroadcastError as e:
        st.mode, st.fallback_reason = "http", str(e)
    opts = PullOptions(token=token, swarm=False, delta=False)
    out = await pull_weights(base_url, plan.version, opts, stats=pull_stats)
    st.seconds = time.monotonic() - t0
    return out


def plan_for(raw: dict[str, Any], version: int, trainer_url: str) -> BroadcastPlan:
    """The plan from a `version` message, aimed at the trainer's address as this worker reaches it
    (the URL it dialed: the trainer may know itself only by a bind address such as 0.0.0.0)."""
    try:
        plan = BroadcastPlan.model_validate(raw)
    except ValidationError as e:
        raise BroadcastError(f"malformed broadcast plan: {e.errors()[0]['msg']}") from e
    if plan.version != version:
        raise BroadcastError(f"broadcast plan is for version {plan.version}, not {version}")
    host = urlsplit(trainer_url).hostname
    return plan.model_copy(update={"host": host}) if host else plan


async def receive_to_store(
    raw: dict[str, Any], member: str, store: WeightStore, trainer_url: str, version: int
) -> dict[str, torch.Tensor]:
    """Receive `version` into a buffer of the worker's store (served to peers once whole, the base
    of the next delta), as tensors that are views into it; BroadcastError when it could not."""
    plan = plan_for(raw, version, trainer_url)
    m = plan.manifest
    buf = store.buffer(m.total_bytes)
    mark = store.begin(m, buf)
    device = "cuda" if plan.backend == "nccl" else "cpu"
    try:
        await asyncio.to_thread(receive, plan, member, buf, device=device)
    except BaseException:
        store.abandon(version)
        raise
    for c in m.chunks:  # every one verified by `receive`
        mark(c.index)
    store.complete(version)
    return tensor_views(buf.view, m.tensors)
