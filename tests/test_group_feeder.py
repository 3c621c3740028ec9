"""trainer/streaming.py's GroupFeeder, against a stand-in coordinator and learner: nothing trains
before the offload, each group trains as it completes after it (those that complete while the learner
is busy in one call), the rest go in one call in prompt order when generation ends, and the busy record
covers exactly the learner calls."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Sequence

from rlboost.trainer.grpo import Sample
from rlboost.trainer.streaming import GroupFeeder


class FakeCoord:
    def __init__(self) -> None:
        self.offloaded = asyncio.Event()
        self.group_ready = asyncio.Event()
        self.groups_done: deque[str] = deque()

    def complete(self, g: str) -> None:
        self.groups_done.append(g)
        self.group_ready.set()


class FakeLearner:
    """Records add_groups calls (in the feeder's worker thread); with `hold`, each call waits for it."""

    def __init__(self, hold: threading.Event | None = None) -> None:
        self.calls: list[list[int]] = []
        self.threads: set[str] = set()
        self.hold = hold

    def add_groups(self, samples: Sequence[Sample]) -> None:
        self.threads.add(threading.current_thread().name)
        self.calls.append(sorted({s.group for s in samples}))
        if self.hold is not None:
            assert self.hold.wait(5), "the test never released the learner"


def samples_of(groups: Sequence[str]) -> list[Sample]:
    return [Sample([1], [2, 3], 1.0, int(g[1:])) for g in groups for _ in range(2)]


async def until(cond) -> None:
    while not cond():
        await asyncio.sleep(0.001)


def test_feeder_streams_after_the_offload_and_batches_the_rest() -> None:
    async def scenario() -> None:
        coord, learner = FakeCoord(), FakeLearner()
        ticks = iter(range(1000))
        feeder = GroupFeeder(learner, coord, samples_of, clock=lambda: float(next(ticks)))
        task = asyncio.create_task(feeder.run())
        coord.complete("p3")  # before the offload: the trainer's GPUs still generate
        for _ in range(20):
            await asyncio.sleep(0)
        assert learner.calls == [] and feeder.busy == []
        coord.offloaded.set()
        await until(lambda: learner.calls == [[3]])  # complete before the offload: trained right after
        coord.complete("p1")
        await until(lambda: learner.calls == [[3], [1]])  # trained as it completes
        # generation ends with three groups not yet taken (no await in between): one call, prompt order
        for g in ("p10", "p0", "p2"):
            coord.complete(g)
        feeder.gen_done.set()
        await asyncio.wait_for(task, 5)
        assert learner.calls == [[3], [1], [0, 2, 10]]
        assert [s.group for s in feeder.samples] == [3, 3, 1, 1, 0, 0, 2, 2, 10, 10]
        assert feeder.streamed_groups == 2
        assert len(feeder.busy) == 3 and all(e > s for s, e in feeder.busy)  # one interval per call
        assert threading.main_thread().name not in learner.threads  # the event loop keeps serving

    asyncio.run(scenario())


def test_groups_that_complete_while_the_learner_is_busy_train_in_one_call() -> None:
    """A group is group_size rows, often under a micro-batch: the backlog goes in one add_groups call
    (completion order), not one call per group."""

    async def scenario() -> None:
        hold = threading.Event()
        coord, learner = FakeCoord(), FakeLearner(hold)
        feeder = GroupFeeder(learner, coord, samples_of)
        task = asyncio.create_task(feeder.run())
        coord.offloaded.set()
        coord.complete("p0")
        await until(lambda: learner.calls == [[0]])  # in training, held there
        for g in ("p5", "p1", "p3"):
            coord.complete(g)
        hold.set()
        await asyncio.wait_for(until(lambda: len(learner.calls) >= 2 and not coord.groups_done), 5)
        assert learner.calls == [[0], [1, 3, 5]]
        assert [s.group for s in feeder.samples] == [0, 0, 5, 5, 1, 1, 3, 3]  # completion order
        assert feeder.streamed_groups == 4 and not coord.groups_done
        feeder.gen_done.set()
        await asyncio.wait_for(task, 5)
        assert len(learner.calls) == 2 and len(feeder.busy) == 2

    asyncio.run(scenario())


def test_feeder_without_offload_trains_every_group_in_one_call_in_prompt_order() -> None:
    async def scenario() -> None:
        coord, learner = FakeCoord(), FakeLearner()
        feeder = GroupFeeder(learner, coord, samples_of)
        task = asyncio.create_task(feeder.run())
        for g in ("p2", "p10", "p0", "p1"):
            coord.complete(g)
        for _ in range(20):
            await asyncio.sleep(0)
        assert learner.calls == []
        feeder.gen_done.set()
        await asyncio.wait_for(task, 5)
        assert learner.calls == [[0, 1, 2, 10]]
        assert [s.group for s in feeder.samples] == [0, 0, 1, 1, 2, 2, 10, 10]  # p2 before p10
        assert feeder.streamed_groups == 0

    asyncio.run(scenario())


def test_busy_between_clips_to_the_tail() -> None:
    feeder = GroupFeeder(FakeLearner(), FakeCoord.__new__(FakeCoord), samples_of)
    feeder.busy = [(0.0, 2.0), (3.0, 5.0), (6.0, 9.0)]
    assert feeder.busy_between(1.0, 7.0) == 1.0 + 2.0 + 1.0
    assert feeder.busy_between(None, 7.0) == 0.0
    assert feeder.busy_total() == 7.0
