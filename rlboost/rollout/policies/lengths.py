"""Running statistics of finished response lengths.

`LengthStats` learns the distribution of finished lengths as a job runs; policies use it to predict
how many tokens a partial response still needs: E[L - l | L > l]. (The synthetic workload's own
length model is rlboost/contracts/lengths.py.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


class LengthStats:
    """Finished response lengths seen so far (a bounded window), for remaining-length predictions."""

    def __init__(self, budget: int, window: int = 20_000, prior_mean: float | None = None) -> None:
        self.budget = budget
        self.window = window
        self._ring = np.zeros(window, np.float64)  # the last `window` lengths
        self._n = 0  # lengths seen in total
        self._sorted_at = -1  # _n when the sorted view was built
        self._sorted = np.zeros(0)
        self._suffix = np.zeros(1)
        self.prior_mean = prior_mean if prior_mean is not None else budget / 2

    def add(self, lengths: Iterable[int]) -> None:
        for n in lengths:
            self.add_one(n)

    def add_one(self, n: int) -> None:
        self._ring[self._n % self.window] = n
        self._n += 1

    @property
    def count(self) -> int:
        return min(self._n, self.window)

    @property
    def _recent(self) -> np.ndarray:
        return self._ring[: self.count]

    def _prepare(self) -> tuple[np.ndarray, np.ndarray]:
        # re-sorted once 1/64 of the window is new: predictions need the shape, not the last sample
        if self._sorted_at < 0 or self._n - self._sorted_at >= max(1, self.count // 64):
            s = np.sort(self._recent)
            self._sorted = s
            # suffix[i] = sum(s[i:]); suffix[n] = 0
            self._suffix = np.concatenate([np.cumsum(s[::-1])[::-1], [0.0]])
            self._sorted_at = self._n
        return self._sorted, self._suffix

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """Quantiles of the finished lengths (the prior mean for every one before any is seen)."""
        if not self._n:
            return [self.prior_mean for _ in qs]
        s, _ = self._prepare()
        return [float(s[min(len(s) - 1, int(q * len(s)))]) for q in qs]

    def mean(self) -> float:
        return float(self._recent.mean()) if self._n else self.prior_mean

    def expected_remaining(
        self, generated: np.ndarray | Sequence[int], budget_left: np.ndarray | Sequence[int]
    ) -> np.ndarray:
        """E[L - l | L > l], capped by each response's remaining budget (vectorised)."""
        g = np.asarray(generated, dtype=np.float64)
        cap = np.asarray(budget_left, dtype=np.float64)
        if not self._n:
            return np.minimum(np.maximum(self.prior_mean - g, 1.0), cap)
        s, suffix = self._prepare()
        idx = np.searchsorted(s, g, side="right")
        n_above = len(s) - idx
        with np.errstate(divide="ignore", invalid="ignore"):
            cond = (suffix[idx] - g * n_above) / n_above
        # longer than anything seen so far: assume it runs as long again as the longest seen (heavy tail)
        tail = np.maximum(g * 0.5, 1.0)
        out = np.where(n_above > 0, cond, tail)
        return np.minimum(np.maximum(out, 1.0), cap)

    def sample_remaining(
        self, generated: np.ndarray | Sequence[int], budget_left: np.ndarray | Sequence[int]
    ) -> np.ndarray:
        """A plausible draw of every response's remaining tokens: conditional quantiles of L - l | L > l
        at evenly spread levels (deterministic), so the set has the right bulk *and* the right longest
        one - E[max] is what bounds a step's tail, and the max of expectations underestimates it."""
        g = np.asarray(generated, dtype=np.float64)
        cap = np.asarray(budget_left, dtype=np.float64)
        n = g.size
        if n == 0:
            return np.zeros(0)
        levels = (np.arange(n) * 0.6180339887498949 + 0.5) % 1.0  # low-discrepancy, no RNG
        levels = levels[np.argsort(np.argsort(-g, kind="stable"), kind="stable")]  # spread over ages
        if not self._n:
            out = np.maximum(self.prior_mean - g, 1.0) * 2 * levels
            return np.minimum(np.maximum(out, 1.0), cap)
        s, _ = self._prepare()
        idx = np.searchsorted(s, g, side="right")
        n_above = len(s) - idx
        pick = np.minimum(idx + np.floor(levels * n_above).astype(np.int64), len(s) - 1)
        out = np.where(n_above > 0, s[pick] - g, np.maximum(g * 0.5, 1.0))
        return np.minimum(np.maximum(out, 1.0), cap)
