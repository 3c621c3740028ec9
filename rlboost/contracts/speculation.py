"""Adaptive speculation: how many drafted tokens a response gets per verification step.

Speculative decoding is lossless here (a drafted token is kept exactly when it equals the token the
seeded sampler draws at its position), so the only question is speed. A verification step feeds each
live response its last token plus K drafted ones, i.e. `live * (K + 1)` tokens in one forward pass, and
yields 1 + (accepted drafted tokens) tokens per response. With a per-token acceptance probability `a`
(drafted tokens are accepted left to right until the first miss), the expected yield is
(1 - a^(K+1)) / (1 - a) (Leviathan et al., 2023, "Fast Inference from Transformers via Speculative
Decoding", eq. 1). Decoding is memory-bound at small batches, so extra tokens per forward are nearly free
in a step's tail and expensive in a full batch: the rule picks the K that maximises expected tokens per
second under the caller's cost of one forward pass of n tokens (the live engine measures or bounds it,
the simulator reads it from the performance table), so it speculates in the tail, not in a full batch.

Pure and clock-free: the torch engine and the simulator call the same function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


def expected_yield(accept: float, k: int) -> float:
    """Expected tokens a response gains from one verification step with k drafted tokens."""
    if k <= 0:
        return 1.0
    a = min(max(accept, 0.0), 1.0)
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def draft_length(accept: float, live: int, max_tokens: int, step_cost: Callable[[int], float]) -> int:
    """The K in 0..max_tokens with the most expected tokens per second for `live` responses.

    step_cost(n): seconds (or any unit) of one forward pass over n tokens in total. K = 0 is plain
    decoding; ties go to the smaller K (less wasted compute)."""
    if live <= 0 or max_tokens <= 0:
        return 0
    best_k, best_rate = 0, live * expected_yield(accept, 0) / step_cost(live)
    for k in range(1, max_tokens + 1):
        rate = live * expected_yield(accept, k) / step_cost(live * (k + 1))
        if rate > best_rate * (1 + 1e-9):
            best_k, best_rate = k, rate
    return best_k


def batch_step_cost(capacity: int) -> Callable[[int], float]:
    """A memory-bound engine's forward cost when nothing better is measured: one unit per `capacity`
    tokens started (a forward pass of up to a full batch costs what one decode step of a full batch
    costs), so speculating is free while live * (K + 1) fits the batch the engine was sized for."""
    cap = max(1, capacity)
    return lambda n: float(-(-max(n, 1) // cap))


@dataclass
class PassCost:
    """Seconds of one forward pass by the tokens it feeds, as an engine measures its own passes, for
    draft_length. A measured size answers with its running mean; a size between two measured ones, by
    linear interpolation; any other, the prior's shape (batch_step_cost) scaled to the nearest measured
    size; before any measurement, the prior itself (only ratios matter to draft_length). Why measured:
    the prior is a memory-bound GPU's shape, and on a CPU a pass over 4x the tokens costs ~1.6x
    (BENCHMARKS, live speculative decoding), so a prior alone drafts where drafting costs time. An
    engine measures a plain pass first (knows_plain), then drafts what the prior finds free, so every
    width is tried once before it is judged. A width not measured for `retry_after` passes is priced
    again as if never measured, and its next measurement replaces the old one: one slow pass (a
    hiccup, another process's burst) must not bar a width for the rest of the job, as nothing else
    would ever measure it again once draft_length stops choosing it."""

    prior: Callable[[int], float]
    keep: float = 0.8  # weight of the running mean against a new measurement
    retry_after: int = 512  # passes; a slow width is tried again at most once per this many passes
    seen: dict[int, float] = field(default_factory=dict)
    passes: int = 0  # passes measured so far
    last: dict[int, int] = field(default_factory=dict)  # width -> `passes` at its last measurement

    def knows_plain(self, tokens: int) -> bool:
        """Whether a pass over at most `tokens` (a plain pass of that many rows) has been measured: until
        one has, the prior's flat shape would price a plain pass like the widest measured one."""
        return any(n <= tokens for n in self.seen)

    def observe(self, tokens: int, seconds: float) -> None:
        old = self.seen.get(tokens) if not self._stale(tokens) else None
        self.seen[tokens] = seconds if old is None else old * self.keep + seconds * (1.0 - self.keep)
        self.passes += 1
        self.last[tokens] = self.passes

    def _stale(self, tokens: int) -> bool:
        return tokens in self.last and self.passes - self.last[tokens] >= self.retry_after

    def __call__(self, tokens: int) -> float:
        # stale widths are left out, unless every one is (then nothing fresher prices anything)
        seen = {n: t for n, t in self.seen.items() if not self._stale(n)} or self.seen
        if not seen:
            return self.prior(tokens)
        if tokens in seen:
            return seen[tokens]
        below = max((n for n in seen if n < tokens), default=None)
        above = min((n for n in seen if n > tokens), default=None)
        if below is not None and above is not None:
            f = (tokens - below) / (above - below)
            return seen[below] + f * (seen[above] - seen[below])
        near = below if below is not None else above
        assert near is not None
        return seen[near] * self.prior(tokens) / self.prior(near)


@dataclass
class AcceptanceMeter:
    """A running estimate of the per-token acceptance probability, from drafted and accepted counts.

    Starts at `prior` worth `prior_weight` drafted tokens, and forgets old evidence with `decay` per
    update, since acceptance changes within a step (more siblings finish, more text to draft from)."""

    prior: float = 0.5
    prior_weight: float = 8.0
    decay: float = 0.9
    drafted: float = 0.0
    accepted: float = 0.0

    def update(self, drafted: int, accepted: int) -> None:
        self.drafted = self.drafted * self.decay + drafted
        self.accepted = self.accepted * self.decay + accepted

    @property
    def rate(self) -> float:
        return (self.accepted + self.prior * self.prior_weight) / (self.drafted + self.prior_weight)
