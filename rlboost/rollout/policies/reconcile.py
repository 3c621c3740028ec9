"""Reconcile the spot fleet to its target: which candidates to launch on now, and how a candidate that
refuses for lack of capacity cools down. The controller and the simulator both run `reconcile_fleet`
with their own `launch` (a provider's, or the replayed market's), on their own clock."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from rlboost.contracts.retry import Backoff
from rlboost.rollout.policies.placement import OfferLike

OfferT = TypeVar("OfferT", bound=OfferLike)

BACKOFF_CAP_S = 30.0  # a candidate that keeps failing cools down up to this long


@dataclass
class CandidateBackoff:
    """Per-candidate capacity backoff with jitter: 1 s, 2 s, 4 s ... up to the cap, times U(0.5, 1)."""

    failures: int = 0
    until: float = 0.0

    def fail(self, now: float, *, cap: float = BACKOFF_CAP_S, rng: random.Random | None = None) -> None:
        self.failures += 1
        policy = Backoff(base_s=1.0, cap_s=cap, jitter=(0.5, 1.0), max_doublings=6)
        self.until = now + policy.delay(self.failures - 1, rng)

    def ok(self) -> None:
        """The candidate delivered a running instance: it starts over."""
        self.failures = 0
        self.until = 0.0


def reconcile_fleet(
    want: int,
    ordered: Sequence[OfferT],
    backoff: Mapping[str, CandidateBackoff],
    now: float,
    launch: Callable[[OfferT], bool],
    *,
    cap: float = BACKOFF_CAP_S,
    rng: random.Random | None = None,
) -> int:
    """Launch up to `want` workers, at most one per candidate per round, in placement order, skipping
    candidates that back off. `launch(offer)` is False when the offer was refused for capacity: the
    candidate then backs off (`cap`, jitter from `rng`). Returns how many launched."""
    launched = 0
    for offer in ordered:
        if launched >= want:
            break
        bo = backoff[offer.key]
        if now < bo.until:
            continue
        if launch(offer):
            launched += 1
        else:
            bo.fail(now, cap=cap, rng=rng)
    return launched
