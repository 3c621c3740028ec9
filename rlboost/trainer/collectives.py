"""The torch.distributed pieces a Learner uses (rlboost/trainer/learner.py): the rank's context, the gradient
all-reduce (ddp), FSDP sharding, and rank 0 driving the others: `LeaderLearner` announces every
learner call (warm start, train step, state dict, ...) to every rank, and the other ranks `follow`,
making the same call on their own Learner, so every collective lines up. Samples travel as pickled
objects (broadcast_object_list): a step's token ids are small next to its gradients.

The process group's life (joining it under torchrun, leaving it) and the torchrun launcher are in
rlboost/trainer/distributed.py, which builds the followers' Learners; this module imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    strategy: str  # ddp | fsdp
    device: str


# ---- training collectives ----------------------------------------------------------------------


def all_reduce_grads(model: nn.Module) -> None:
    """Sum gradients over ranks, as one flat buffer (one collective per step, not per tensor)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def shard_model(model: nn.Module, ctx: DistContext) -> None:
    """FSDP2 (`fully_shard`): each transformer block, then the root; parameters become DTensors."""
    from torch.distributed.fsdp import fully_shard

    blocks = _blocks(model)
    for block in blocks:
        fully_shard(block)
    fully_shard(model)


def _blocks(model: nn.Module) -> list[nn.Module]:
    for path in ("model.layers", "transformer.h", "gpt_neox.layers", "blocks"):
        mod: Any = model
        try:
            for part in path.split("."):
                mod = getattr(mod, part)
        except AttributeError:
            continue
        if isinstance(mod, nn.ModuleList):
            return list(mod)
    return []


# ---- rank 0 drives, the others follow ----------------------------------------------------------

_CALLS = (
    "warm_start",
    "train_step",
    "begin_step",
    "add_groups",
    "finish_step",
    "state_dict",
    "logprobs",
    "load_state_dict",
    # every rank: FSDP gathers its shards (and loads them back); a ddp replica restores its own copy
    "checkpoint_state",
    "load_checkpoint_state",
)


def _broadcast(obj: Any) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class LeaderLearner:
    """Rank 0's learner handle: each call is announced to every rank, then run here too."""

    def __init__(self, learner: Any) -> None:
        self.learner = learner

    def __getattr__(self, name: str) -> Any:
        if name not in _CALLS:
            return getattr(self.learner, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            _broadcast((name, args, kwargs))
            return getattr(self.learner, name)(*args, **kwargs)

        return call


def release_followers() -> None:
    """Rank 0: tell the other ranks to stop following (their `follow` returns)."""
    _broadcast(("stop", (), {}))


def follow(learner: Any) -> int:
    """A non-zero rank: run what rank 0 announces until it says stop."""
    while True:
        name, args, kwargs = _broadcast(None)
        if name == "stop":
            return 0
        if name not in _CALLS:
            raise RuntimeError(f"unknown learner call {name!r} from rank 0")
        getattr(learner, name)(*args, **kwargs)
