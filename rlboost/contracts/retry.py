"""The one retry policy: exponential backoff with jitter, and the loop that tries again.

Used by the weight pull (origin chunks, deltas, manifest/tracker requests), the notice watchers' metadata
polls and the controller's per-candidate launch cool-down, so that they all back off the same way.
Lives here, not in the CLI, because trainer and spot-node code use it too. `sleep` and `rng` are
injectable so that tests replay a schedule without a clock.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """delay(n) = min(cap_s, base_s * 2**min(n, max_doublings)) * uniform(*jitter)."""

    base_s: float
    cap_s: float
    # the delay is scaled by a uniform draw from this range, so that many clients do not retry in step
    jitter: tuple[float, float] = (0.5, 1.5)
    max_doublings: int = 30

    def delay(self, n: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number n (0: the first retry)."""
        raw = min(self.cap_s, self.base_s * 2 ** min(max(n, 0), self.max_doublings))
        lo, hi = self.jitter
        return raw * (lo if lo == hi else (rng or random).uniform(lo, hi))


def retry(
    fn: Callable[[], T],
    *,
    tries: int,
    backoff: Backoff,
    on: tuple[type[BaseException], ...],
    on_retry: Callable[[int, BaseException], None] | None = None,
    sleep: Callable[[float], object] = time.sleep,
) -> T:
    """fn() until it returns, at most `tries` times; an exception in `on` is retried after
    backoff.delay(attempt) (on_retry(attempt, exc) first), the last one is raised. Others raise at once."""
    for attempt in range(tries):
        try:
            return fn()
        except on as e:
            if attempt + 1 >= tries:
                raise
            if on_retry is not None:
                on_retry(attempt, e)
        sleep(backoff.delay(attempt))
    raise ValueError(f"tries must be >= 1, got {tries}")


async def aretry(
    fn: Callable[[], Awaitable[T]],
    *,
    tries: int,
    backoff: Backoff,
    on: tuple[type[BaseException], ...],
    on_retry: Callable[[int, BaseException], None] | None = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """`retry` for a coroutine function."""
    for attempt in range(tries):
        try:
            return await fn()
        except on as e:
            if attempt + 1 >= tries:
                raise
            if on_retry is not None:
                on_retry(attempt, e)
        await sleep(backoff.delay(attempt))
    raise ValueError(f"tries must be >= 1, got {tries}")
