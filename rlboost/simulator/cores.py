"""A local job's processes share this machine's cores (`simulate.cpu_cores`): processor sharing, where each
busy process runs at min(1, cores / busy) of the rate it has alone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlboost.simulator.engines import Fleet, ModelledEngine
from rlboost.simulator.events import INF, EventQueue


def share(cores: float, busy: int) -> float:
    """A busy process's share of a core."""
    return min(1.0, cores / max(1, busy))


@dataclass
class Work:
    """CPU-bound work whose length alone is known (a process starting up, the trainer's warm start):
    re-timed whenever its share of a core changes."""

    left: float  # single-core seconds left at `since`
    since: float
    speed: float = 1.0
    epoch: int = 0  # the end event it is waiting for

    def retime(self, now: float, speed: float) -> float:
        """The progress so far at the old speed, then its end at the new one (returned)."""
        self.left = max(0.0, self.left - (now - self.since) * self.speed)
        self.since, self.speed = now, speed
        self.epoch += 1
        return now + self.left / speed


class CoreShare:
    """Who uses this machine's cores in a local job's replay, and the CPU work under way.

    Busy processes: each engine starting up, pulling weights or holding responses; the trainer
    warm-starting, training, dispatching a static batch's round trip, or serving the responses an
    engine took (their streamed tokens and ends, `simulate.serve_s` each). After every event
    (`reshare`) each runs at min(1, cores / busy) of its rate alone: engines and start-ups are
    re-timed when that changes; the trainer's training is timed as it starts (`trainer_speed`), pulls
    and round trips are measured timings. Without shared cores (`cores` None: a cloud job) work is a
    plain delay."""

    def __init__(self, cores: float | None, q: EventQueue, fleet: Fleet) -> None:
        self.cores, self.q, self.fleet = cores, q, fleet
        self.works: dict[tuple, Work] = {}
        self.then: dict[tuple, Callable[[], None]] = {}
        self.trainer_busy_until = -INF  # training
        self.coordinating_until = -INF  # a static batch's dispatch round trip
        # re-times a live engine's next event after its speed changed (the coordinator's)
        self.reschedule: Callable[[ModelledEngine], None] = lambda e: None
        q.on("work_done", self.on_work_done)
        q.on("coordinated", lambda _: None)  # a round trip is over: the loop re-shares the cores

    def start_work(self, key: tuple, seconds: float, then: Callable[[], None]) -> None:
        """CPU work of `seconds` alone (a start-up, the warm start); `then` runs when it ends."""
        self.then[key] = then
        if not self.cores:
            self.q.push(self.q.now + seconds, "work_done", (key, 0))
            return
        w = self.works[key] = Work(seconds, self.q.now)
        self.q.push(w.retime(self.q.now, 1.0), "work_done", (key, w.epoch))  # the loop re-times it at once

    def on_work_done(self, payload: tuple[tuple, int]) -> None:
        key, epoch = payload
        w = self.works.get(key)
        if w is not None:
            if w.epoch != epoch:
                return  # re-timed since
            del self.works[key]
        then = self.then.pop(key, None)
        if then is not None:  # None: an end re-timed earlier already came (the work sped up)
            then()

    def trainer_busy(self) -> bool:
        return max(self.trainer_busy_until, self.coordinating_until) > self.q.now or ("warm",) in self.works

    def trainer_speed(self) -> float:
        """The trainer's share of a core for work it starts now."""
        return share(self.cores, self.fleet.busy() + 1) if self.cores else 1.0

    def coordinate_until(self, t: float) -> None:
        """The coordinator is busy with a round trip until t (it counts as a busy process)."""
        self.coordinating_until = max(self.coordinating_until, t)
        self.q.push(t, "coordinated")

    def serve(self, cpu_s: float) -> None:
        """The coordinator serves responses (simulate.serve_s each): CPU work after what it has under way,
        at its share of the cores."""
        now = self.q.now
        self.coordinate_until(max(now, self.coordinating_until) + cpu_s / share(self.cores, self.fleet.busy() + 1))

    def reshare(self) -> None:
        """After every event: every process's share of the cores, now."""
        assert self.cores
        now = self.q.now
        speed = share(self.cores, self.fleet.busy() + self.trainer_busy())
        for key, w in self.works.items():
            if w.speed != speed:
                self.q.push(w.retime(now, speed), "work_done", (key, w.epoch))
        for e in self.fleet.alive:
            if e.speed != speed:
                if e.live:
                    e.advance(now)  # progress so far at the old speed
                e.speed = speed
                if e.live:
                    e.set_load()
                    self.reschedule(e)
