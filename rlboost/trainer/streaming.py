"""Feeds a step's complete groups to the learner while the tail still generates remotely.

Until the coordinator offloads, the trainer's accelerators generate (the reserved engine), so nothing
trains. Once it has offloaded (`coord.offloaded`), every complete GRPO group is trained as soon as the
learner is free: the groups that finished meanwhile go in one `learner.add_groups`, in completion
order, in a worker thread, while the event loop keeps serving the remote engines. One call for the
backlog, not one per group: a group is `group_size` rows, often under a micro-batch, and on a GPU
small calls cost more per token (4 chunks of a step took 22 % longer than the whole batch on an H200,
BENCHMARKS.md); the update is the same, being a sum over rows, and the simulator, which trains per
token at the measured rate, is indifferent to the grouping. When generation ends, the groups still
waiting go in one call, in prompt order, so a step that never offloaded trains exactly like a whole
batch. The optimizer step (finish_step) is
the caller's, after the step's last group: the update stays strictly on-policy.

Works with any learner that has add_groups (trainer.learner.Learner, or rank 0's LeaderLearner); the
busy intervals it records, on an injected clock, feed the offload policy's training-rate estimate and
the step record (training during the tail, trainer idle time).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from rlboost.rollout.policies.overlap import busy_between, busy_total, may_train_group
from rlboost.trainer.grpo import Sample


class GroupSource(Protocol):
    """What the coordinator offers (rlboost/rollout/coordinator.py)."""

    offloaded: asyncio.Event
    group_ready: asyncio.Event

    @property
    def groups_done(self) -> Any: ...  # deque[str]: complete groups, in completion order


class GroupFeeder:
    def __init__(
        self,
        learner: Any,
        coord: GroupSource,
        samples_of: Callable[[Sequence[str]], list[Sample]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.learner = learner
        self.coord = coord
        self.samples_of = samples_of
        self.clock = clock
        self.gen_done = asyncio.Event()  # set by the caller when the step's generation is over
        self.abandon = False  # generation failed: stop after the call in flight
        self.busy: list[tuple[float, float]] = []  # training intervals (clock)
        self.samples: list[Sample] = []  # everything added, in the order it was added
        self.streamed_groups = 0  # groups added before generation ended

    async def run(self) -> None:
        coord = self.coord
        await _first(coord.offloaded.wait(), self.gen_done.wait())
        while not self.abandon:
            if coord.groups_done and may_train_group(True, *self._marks()):
                ready = list(coord.groups_done)
                coord.groups_done.clear()
                await self._add(ready)
                self.streamed_groups += len(ready)
                continue
            if self.gen_done.is_set():
                rest = sorted(coord.groups_done, key=lambda g: (len(g), g))  # p2 before p10
                coord.groups_done.clear()
                if rest:
                    await self._add(rest)
                return
            coord.group_ready.clear()  # no await since the check above: no completion is missed
            await _first(coord.group_ready.wait(), self.gen_done.wait())

    def _marks(self) -> tuple[float | None, float | None]:
        """(offload, end of generation) as the simulator's marks: now if it has happened, else None."""
        now = self.clock()
        return (now if self.coord.offloaded.is_set() else None, now if self.gen_done.is_set() else None)

    async def _add(self, groups: Sequence[str]) -> None:
        samples = self.samples_of(groups)
        t0 = self.clock()
        try:
            await asyncio.to_thread(self.learner.add_groups, samples)
        finally:
            self.busy.append((t0, self.clock()))
        self.samples.extend(samples)

    def busy_between(self, a: float | None, b: float | None) -> float:
        """Training time inside [a, b] (the tail: offload -> last response)."""
        return busy_between(self.busy, a, b)

    def busy_total(self) -> float:
        return busy_total(self.busy)


async def _first(*waits: Awaitable[Any]) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
