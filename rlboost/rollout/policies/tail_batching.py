"""Tail batching (after RollPacker): keep long-tail prompts out of most steps.

Short rounds launch `prompts_per_step * (1 + over_launch)` prompts and end as soon as
`prompts_per_step` groups are complete; the unfinished groups are aborted (their tokens are discarded:
on-policy training cannot keep tokens of an older version) and their prompts are parked. Once
`prompts_per_step` prompts are parked, the next round is a long round of exactly those prompts, run to
completion. Most steps therefore never wait for the long tail; the few long rounds are full of long
responses, which keeps their batches busy.

Pure bookkeeping over opaque prompt keys; the runtime and the simulator decide what a prompt is.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Round:
    long: bool
    prompts: list[Hashable]  # prompts to launch
    keep: int  # groups that complete the round

    @property
    def need_groups(self) -> int | None:
        """A short round ends once this many groups are complete; a long round (None) runs to its end."""
        return None if self.long else self.keep


@dataclass
class TailBatcher:
    prompts_per_step: int
    over_launch: float = 0.25
    parked: deque = field(default_factory=deque)
    rounds: int = 0
    long_rounds: int = 0
    discarded_groups: int = 0

    def __post_init__(self) -> None:
        if self.prompts_per_step < 1 or self.over_launch < 0:
            raise ValueError("prompts_per_step must be >= 1 and over_launch >= 0")

    def launch_count(self) -> int:
        """Fresh prompts the next round needs (0 for a long round)."""
        if len(self.parked) >= self.prompts_per_step:
            return 0
        return math.ceil(self.prompts_per_step * (1.0 + self.over_launch))

    def next_round(self, fresh: Iterable[Hashable]) -> Round:
        self.rounds += 1
        if len(self.parked) >= self.prompts_per_step:
            self.long_rounds += 1
            prompts = [self.parked.popleft() for _ in range(self.prompts_per_step)]
            return Round(True, prompts, len(prompts))
        prompts = list(fresh)
        return Round(False, prompts, min(self.prompts_per_step, len(prompts)))

    def close_round(self, rnd: Round, unfinished: Iterable[Hashable]) -> None:
        """The round kept its first `keep` groups; park the prompts that did not finish."""
        if rnd.long:
            return
        for p in unfinished:
            self.parked.append(p)
            self.discarded_groups += 1


def step_prompts(
    batcher: TailBatcher | None, sample: Callable[[int], list], prompts_per_step: int
) -> tuple[list, Round | None]:
    """A step's prompts, for the live trainer and the simulator alike: a tail-batching round's (fresh ones
    drawn with `sample(n)` only when the round launches new prompts), else `prompts_per_step` drawn."""
    if batcher is None:
        return sample(prompts_per_step), None
    fresh = batcher.launch_count()
    rnd = batcher.next_round(sample(fresh) if fresh else [])
    return rnd.prompts, rnd
