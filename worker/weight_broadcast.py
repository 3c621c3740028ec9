"""A worker's end of the torch.distributed weight broadcast (trainer/weight_broadcast.py): join the
broadcast the trainer announced and, when that fails (a member died and this one was left out, the
rendezvous is unreachable, a chunk arrived corrupt), pull the same version over HTTP instead, so a
broken broadcast costs time, never the version."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer.weight_broadcast import BroadcastError, BroadcastPlan, receive
from trainer.weights import HostBuffer, tensor_views
from worker.weight_pull import PullStats, pull_weights

if TYPE_CHECKING:
    import torch


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
    out = await pull_weights(base_url, plan.version, token=token, stats=pull_stats, swarm=False, delta=False)
    st.seconds = time.monotonic() - t0
    return out
