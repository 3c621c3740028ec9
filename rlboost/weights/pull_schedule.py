"""Which chunk a pull fetches next, and from where: the schedule its fetch threads share.

The tracker's answers (peers and what they hold, the chunks granted to this puller from the trainer)
update it from the event loop; each fetch thread takes a (chunk, source) pair, and reports it done or
failed. Peers that fail or lie are dropped; a chunk the trainer fails to send `retries` times fails
the pull (rlboost/weights/pull.py runs it).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable

from rlboost.weights.chunk_http import Partial
from rlboost.weights.pull_control import WeightPullError

ORIGIN = "origin"  # the trainer, as a chunk's source (every other source is a peer's URL)


class ChunkSchedule:
    """Thread-safe schedule of the chunks still to fetch, and of the sources to fetch them from."""

    def __init__(self, label: str, chunks: list[int], retries: int, seed: int, on_need: Callable[[], None]) -> None:
        self.label = label
        self.cv = threading.Condition()
        self.todo = set(chunks)
        self.order = list(chunks)
        random.Random(seed).shuffle(self.order)  # pullers start at different chunks: more to trade
        self.busy: set[int] = set()
        self.grants: set[int] = set()
        self.grant_all = False
        self.holders: dict[int, set[str]] = {}
        self.peer_have: dict[str, set[int]] = {}
        self.bad: set[str] = set()
        self.new_bad: set[str] = set()
        self.load: Counter[str] = Counter()
        self.fails: Counter[int] = Counter()
        self.partials: dict[int, Partial] = {}
        self.retries = retries
        self.error: BaseException | None = None
        self.stopped = False
        self.idle = 0
        self.low_water = 4
        self.on_need = on_need

    # called from the event loop with the tracker's answer
    def update(self, peers: dict[str, set[int]] | None, grants: set[int] | None, grant_all: bool = False) -> None:
        with self.cv:
            if peers is not None:
                self.peer_have = {u: h for u, h in peers.items() if u not in self.bad}
                self.holders = {}
                for u, have in self.peer_have.items():
                    for c in have:
                        self.holders.setdefault(c, set()).add(u)
            if grants is not None:
                self.grants = set(grants)
            self.grant_all = self.grant_all or grant_all
            self.cv.notify_all()

    def take(self) -> tuple[int, str] | None:
        """The next (chunk, source), waiting while everything left is busy or not yet sourced."""
        with self.cv:
            while True:
                if self.error is not None or self.stopped or not self.todo:
                    return None
                pick = self._pick()
                if pick is not None:
                    c, src = pick
                    self.busy.add(c)
                    self.load[src] += 1
                    if src == ORIGIN and not self.grant_all and len(self.grants - self.busy) < self.low_water:
                        self.on_need()  # ask for more grants before the threads run dry
                    return pick
                self.idle += 1
                self.on_need()  # ask the tracker now rather than at the next tick
                self.cv.wait(0.2)
                self.idle -= 1

    def _pick(self) -> tuple[int, str] | None:
        free = [c for c in self.order if c in self.todo and c not in self.busy]
        for c in free:  # origin grants first: others may be waiting for exactly these
            if c in self.grants or (self.grant_all and not self.holders.get(c)):
                return c, ORIGIN
        for c in free:
            good = [u for u in self.holders.get(c, ()) if u not in self.bad]
            if good:
                least = min(self.load[u] for u in good)
                return c, random.choice([u for u in good if self.load[u] == least])
        if self.grant_all:  # only chunks whose holders all went bad are left
            return (free[0], ORIGIN) if free else None
        return None

    def done(self, c: int, src: str) -> None:
        with self.cv:
            self.todo.discard(c)
            self.busy.discard(c)
            self.load[src] -= 1
            self.grants.discard(c)
            self.partials.pop(c, None)
            self.cv.notify_all()

    def failed(self, c: int, src: str, err: BaseException, *, drop: set[str], forget: str | None) -> int:
        """Record a failed try; returns how many origin failures chunk c has had.

        `drop`: peers to stop using (dead or lying; reported to the tracker). `forget`: a peer that
        answered 404, i.e. no longer holds this version: not bad, just not a holder."""
        with self.cv:
            self.busy.discard(c)
            self.load[src] -= 1
            for u in drop:
                if u not in self.bad:
                    self.bad.add(u)
                    self.new_bad.add(u)
            for u in [*drop, *([forget] if forget else [])]:
                self.peer_have.pop(u, None)
                for h in self.holders.values():
                    h.discard(u)
            n = 0
            if src == ORIGIN:
                self.fails[c] += 1
                n = self.fails[c]
                if n > self.retries:
                    self.error = WeightPullError(f"{self.label} chunk {c}: failed after {n} attempts: {err!r}")
            self.cv.notify_all()
            return n

    def fail(self, err: BaseException) -> None:
        with self.cv:
            self.error = self.error or err
            self.stopped = True
            self.cv.notify_all()

    def stop(self) -> None:
        with self.cv:
            self.stopped = True
            self.cv.notify_all()
