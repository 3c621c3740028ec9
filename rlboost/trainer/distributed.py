"""The trainer on torch.distributed: data-parallel (ddp) or FSDP training across the trainer
cluster's GPUs and nodes, launched with torchrun; rank 0 also hosts the coordinator and the weight
publisher (rlboost/trainer/runtime.py), the other ranks only train.

    python -m rlboost.trainer.distributed --spec job.yaml ...   # on every node of the trainer cluster

execs `torchrun --nnodes N --node-rank R --nproc-per-node G --master-addr HEAD -m trainer ...` from
SkyPilot's variables (SKYPILOT_NODE_IPS, SKYPILOT_NODE_RANK, SKYPILOT_NUM_GPUS_PER_NODE), or runs the
trainer directly on a one-GPU, one-node cluster. Under torchrun, `python -m rlboost.trainer` calls `init()`:
rank 0 runs the runtime with a `LeaderLearner`, which broadcasts every learner call (warm start, train
step, state dict, ...) to the other ranks, and those run `run_follower()`: the same call on their own
Learner, so every collective lines up. The collectives themselves (the gradient all-reduce, FSDP
sharding, LeaderLearner / follow) are in rlboost/trainer/collectives.py, which the learner imports; this
module joins and leaves the process group, builds the followers' Learners and launches torchrun.

Backends: nccl on GPUs, gloo on CPU (tests run 2 CPU processes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any

import torch
import torch.distributed as dist

from rlboost.contracts.env_names import Env
from rlboost.trainer.collectives import DistContext, follow, release_followers

DEFAULT_PORT = 29517


def launched() -> bool:
    """True under torchrun with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init(strategy: str = "ddp") -> DistContext:
    """Join the process group torchrun set up (RANK, WORLD_SIZE, MASTER_ADDR/PORT in the env)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        backend, device = "nccl", f"cuda:{local}"
    else:
        backend, device = "gloo", "cpu"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    global _CTX
    _CTX = DistContext(rank, world, local, strategy, device)
    return _CTX


_CTX: DistContext | None = None


def current() -> DistContext | None:
    """The context init() set up in this process (None when not distributed)."""
    return _CTX


def run_follower(spec: Any, ctx: DistContext) -> int:
    """Ranks other than 0: a Learner of their own, driven by rank 0's calls."""
    from rlboost.trainer.learner import Learner

    torch.set_num_threads(int(os.environ.get(Env.TORCH_THREADS, "1")))
    learner = Learner(spec.model, spec.algorithm, spec.task, seed=spec.algorithm.seed, dist=ctx)
    try:
        return follow(learner)
    finally:
        shutdown()


def finish() -> None:
    """Rank 0, once the job is over: release the followers, leave the group."""
    if _CTX is not None and _CTX.rank == 0 and dist.is_initialized():
        release_followers()
    shutdown()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# ---- launcher ----------------------------------------------------------------------------------


def torchrun_args(
    env: dict[str, str], gpus_per_node: int | None = None, port: int = DEFAULT_PORT, nnodes: int | None = None
) -> list[str]:
    """torchrun's arguments for this node of a SkyPilot cluster (or a single machine); `nnodes`
    limits training to the first nodes (the others may serve as reserved rollout workers)."""
    ips = [ip for ip in env.get("SKYPILOT_NODE_IPS", "").split() if ip] or ["127.0.0.1"]
    if nnodes is not None:
        ips = ips[:nnodes]
    rank = int(env.get("SKYPILOT_NODE_RANK", "0"))
    gpus = gpus_per_node or int(env.get("SKYPILOT_NUM_GPUS_PER_NODE", "0") or 0)
    if not gpus:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 1
    return [
        f"--nnodes={len(ips)}",
        f"--node-rank={rank}",
        f"--nproc-per-node={gpus}",
        f"--master-addr={ips[0]}",
        f"--master-port={port}",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m rlboost.trainer.distributed",
        description="Launch the trainer on every GPU of this node under torchrun "
        "(other args go to python -m rlboost.trainer).",
    )
    ap.add_argument("--gpus-per-node", type=int, default=None)
    ap.add_argument("--nnodes", type=int, default=None, help="train on the first N nodes only (default: all)")
    ap.add_argument("--master-port", type=int, default=DEFAULT_PORT)
    ap.add_argument("--print", action="store_true", help="print the torchrun command instead of running it")
    args, rest = ap.parse_known_args(argv)
    targs = torchrun_args(dict(os.environ), args.gpus_per_node, args.master_port, args.nnodes)
    nnodes = int(targs[0].split("=")[1])
    nproc = int(targs[2].split("=")[1])
    if nnodes * nproc == 1 and not args.print:
        cmd = [sys.executable, "-m", "rlboost.trainer", *rest]  # nothing to distribute
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", *targs, "-m", "rlboost.trainer", *rest]
    if args.print:
        print(" ".join(cmd))
        return 0
    sys.stdout.flush()
    os.execv(shutil.which(cmd[0]) or cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
