"""The shared retry policy (rlboost/contracts/retry.py): its delays, and the sync and async retry loops, replayed
with a recording sleep instead of a clock."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

import pytest

from rlboost.contracts.retry import Backoff, aretry, retry
from rlboost.rollout.policies.reconcile import CandidateBackoff, reconcile_fleet
from rlboost.weights.pull import PULL_BACKOFF

EXACT = Backoff(base_s=0.05, cap_s=2.0, jitter=(1.0, 1.0))


def test_delays_double_up_to_the_cap():
    assert [EXACT.delay(n) for n in range(8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert EXACT.delay(-3) == 0.05 and EXACT.delay(10_000) == 2.0  # no overflow for a long outage
    six = Backoff(base_s=1.0, cap_s=600.0, jitter=(1.0, 1.0), max_doublings=6)
    assert [six.delay(n) for n in (5, 6, 7, 20)] == [32.0, 64.0, 64.0, 64.0]


def test_jitter_stays_in_its_range_and_spreads():
    rng = random.Random(7)
    draws = [PULL_BACKOFF.delay(3, rng) for _ in range(500)]
    assert all(0.2 <= d <= 0.6 for d in draws)  # 0.4 s x [0.5, 1.5]
    assert max(draws) - min(draws) > 0.3  # not one value: clients do not retry in step


def test_retry_until_success_sleeps_the_schedule():
    calls, slept, seen = [], [], []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError(f"try {len(calls)}")
        return "ok"

    out = retry(
        flaky,
        tries=5,
        backoff=EXACT,
        on=(ConnectionError,),
        on_retry=lambda n, e: seen.append((n, str(e))),
        sleep=slept.append,
    )
    assert out == "ok" and len(calls) == 3
    assert slept == [0.05, 0.1] and seen == [(0, "try 1"), (1, "try 2")]


def test_retry_gives_up_with_the_last_error_and_no_final_sleep():
    slept: list[float] = []
    n = iter(range(10))

    def down() -> None:
        raise TimeoutError(f"attempt {next(n)}")

    with pytest.raises(TimeoutError, match="attempt 2"):
        retry(down, tries=3, backoff=EXACT, on=(TimeoutError,), sleep=slept.append)
    assert slept == [0.05, 0.1]


def test_other_errors_are_not_retried():
    slept: list[float] = []

    def broken() -> None:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        retry(broken, tries=5, backoff=EXACT, on=(OSError,), sleep=slept.append)
    assert slept == []
    with pytest.raises(ValueError, match="tries must be >= 1"):
        retry(lambda: 1, tries=0, backoff=EXACT, on=(OSError,))


def test_aretry_follows_the_same_schedule():
    slept: list[float] = []
    calls = []

    async def record(s: float) -> None:
        slept.append(s)

    async def flaky() -> int:
        calls.append(1)
        if len(calls) < 4:
            raise OSError("refused")
        return len(calls)

    assert asyncio.run(aretry(flaky, tries=4, backoff=EXACT, on=(OSError,), sleep=record)) == 4
    assert slept == [0.05, 0.1, 0.2]
    calls.clear()
    slept.clear()
    with pytest.raises(OSError):
        asyncio.run(aretry(flaky, tries=2, backoff=EXACT, on=(OSError,), sleep=record))
    assert slept == [0.05]


def test_candidate_cooldown_uses_the_policy():
    """The per-candidate cool-down (controller and simulator): 1 s doubling, at most 64 s (or the cap), x0.5-1.0."""
    cd = CandidateBackoff()
    for failures, raw in [(1, 1.0), (2, 2.0), (7, 64.0), (9, 64.0)]:
        while cd.failures < failures:
            cd.fail(100.0, cap=600.0)
        assert raw * 0.5 <= cd.until - 100.0 <= raw, (failures, cd.until)
    cd.fail(100.0, cap=10.0)
    assert 5.0 <= cd.until - 100.0 <= 10.0
    cd.ok()
    assert cd.failures == 0 and cd.until == 0.0


@dataclass(frozen=True)
class Candidate:
    key: str
    hourly_price: float = 1.0
    throughput: float = 1.0


def test_reconcile_launches_one_per_candidate_and_backs_off_the_refusals():
    offers = {k: Candidate(k) for k in "abc"}
    backoff = {k: CandidateBackoff() for k in "abc"}
    backoff["b"].until = 50.0  # still cooling down at t=10
    tried: list[str] = []

    def launch(offer: Candidate) -> bool:
        tried.append(offer.key)
        return offer.key != "c"  # c has no capacity

    n = reconcile_fleet(3, list(offers.values()), backoff, 10.0, launch, rng=random.Random(0))
    assert n == 1 and tried == ["a", "c"]
    assert backoff["c"].failures == 1 and 10.5 <= backoff["c"].until <= 11.0
    assert backoff["a"].failures == 0  # a launch alone does not reset: the provider's RUNNING does (ok())
    tried.clear()
    assert reconcile_fleet(1, list(offers.values()), backoff, 10.0, launch) == 1 and tried == ["a"]
    assert reconcile_fleet(0, list(offers.values()), backoff, 10.0, launch) == 0 and tried == ["a"]

