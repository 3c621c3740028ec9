"""One broadcast member as its own process, for tests/test_weight_broadcast.py:

    python -m tests.broadcast_member PLAN.json MEMBER BASE_URL OUT.pt [--stall-after BUCKET MARKER]

receives the version the plan names the way a worker does (WeightNode.pull with the trainer's offer,
falling back to HTTP at BASE_URL), saves the tensors and how they came to OUT.pt. `--stall-after` is
the test's hook for a kill mid-broadcast: once bucket BUCKET is in, it touches MARKER and waits to
be killed (it never falls back)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from pathlib import Path

import aiohttp
import torch

from rlboost.contracts.protocol import Offer
from rlboost.weights.broadcast import BroadcastPlan, receive
from rlboost.weights.buffers import HostBuffer
from rlboost.weights.peer_server import WeightNode
from rlboost.weights.pull import PullOptions


async def get(plan: BroadcastPlan, member: str, base_url: str) -> tuple[dict[str, torch.Tensor], str, str]:
    """The version's tensors (copied out of the node's store), "broadcast" or "http", and why it fell back."""
    node = WeightNode(PullOptions(token="tok", peer_id=member, swarm=False), serve=None)  # the origin checks no token
    async with aiohttp.ClientSession() as session, node:
        offer = Offer(transport="torch", plan=plan.model_dump(mode="json"))
        tensors = await node.pull(base_url, plan.version, session, offer=offer)
        mode = "broadcast" if node.offers_taken else "http"
        return {k: v.clone() for k, v in tensors.items()}, mode, node.last_fallback


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("plan", type=Path)
    ap.add_argument("member")
    ap.add_argument("base_url")
    ap.add_argument("out", type=Path)
    ap.add_argument("--stall-after", nargs=2, metavar=("BUCKET", "MARKER"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    plan = BroadcastPlan.model_validate_json(args.plan.read_text())
    if args.stall_after:
        bucket, marker = int(args.stall_after[0]), Path(args.stall_after[1])

        def stall(b: int) -> None:
            if b == bucket:
                marker.touch()
                threading.Event().wait()  # until the test kills this process

        receive(plan, args.member, HostBuffer(plan.manifest.total_bytes, shareable=False), on_bucket=stall)
        return 1  # not reached when the test kills it
    tensors, mode, reason = asyncio.run(get(plan, args.member, args.base_url))
    torch.save({"mode": mode, "reason": reason, "tensors": tensors}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
