"""A local job's processes share this machine's cores (`simulate.cpu_cores`): processor sharing, where each
busy process runs at min(1, cores / busy) of the rate it has alone."""

from __future__ import annotations

from dataclasses import dataclass


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
