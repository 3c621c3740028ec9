"""A step whose generation has begun, as the trainer's runtime (trainer/runtime.py) tracks it: what its
training needs while its responses come in."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from rlboost.rollout.live import RolloutRequest


@dataclass
class StepRollout:
    """A step whose generation has begun: what its training needs."""

    step: int
    version: int  # the weights generating it
    problems: list
    rnd: Any  # tail batching's round, if on
    t0: float
    done: asyncio.Future  # its responses, once the last is in
    requests: list[RolloutRequest] = field(default_factory=list)
    group_of: dict[str, int] = field(default_factory=dict)  # request id -> its prompt's index
    by_group: dict[str, list] = field(default_factory=dict)  # finished responses by group, as they come
    offloaded_at_start: bool = False  # begun while an older step trained
    t_gen: float = 0.0
    migrated: int = 0

    def add(self, r: Any) -> None:
        if r.group is not None:
            self.by_group.setdefault(r.group, []).append(r)
