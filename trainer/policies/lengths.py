"""Response lengths: a deterministic long-tailed model (synthetic workload) and running statistics.

`LengthModel` decides how long a synthetic response is, from the prompt and the request seed only, so
a response that migrates mid-way ends at the same length on any engine, and the simulator and the
live synthetic engine agree on every response. Lengths are log-normal with a per-prompt factor
(GRPO groups share a prompt, and hard prompts make every response of the group long) or drawn from a
recorded run.

`LengthStats` learns the distribution of finished lengths as a job runs; policies use it to predict
how many tokens a partial response still needs: E[L - l | L > l].
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np

_MASK = (1 << 64) - 1
_STD_NORMAL = NormalDist()


def mix64(x: int) -> int:
    """splitmix64 finaliser: a fast, well-mixed hash of a 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def unit(x: int) -> float:
    """A hash mapped into the open interval (0, 1)."""
    return ((mix64(x) >> 11) + 0.5) / float(1 << 53)


def prompt_key(prompt: Sequence[int]) -> int:
    h = 0x51ED2701
    for t in prompt:
        h = mix64(h ^ (int(t) & _MASK))
    return h


@dataclass(frozen=True)
class LengthModel:
    """Where a synthetic response ends (its full length, EOS included; capped by the budget elsewhere)."""

    median: float = 100.0
    sigma: float = 0.8  # per-response spread (log space)
    prompt_sigma: float = 0.5  # per-prompt spread shared by a group (log space)
    recorded: tuple[int, ...] = ()  # sorted lengths of a recorded run: sample these instead

    def length(self, prompt: Sequence[int], seed: int) -> int:
        return self.length_from_key(prompt_key(prompt), seed)

    def length_from_key(self, pkey: int, seed: int) -> int:
        u = unit(seed ^ 0x5EED)
        if self.recorded:
            rec = self.recorded
            return rec[min(len(rec) - 1, int(u * len(rec)))]
        z = self.sigma * _STD_NORMAL.inv_cdf(u) + self.prompt_sigma * _STD_NORMAL.inv_cdf(unit(pkey))
        return max(1, round(self.median * math.exp(z)))

    def lengths_from_key(self, pkey: int, seeds: Sequence[int]) -> list[int]:
        """length_from_key for each seed of one prompt (its per-prompt factor computed once)."""
        if self.recorded:
            return [self.length_from_key(pkey, seed) for seed in seeds]
        inv_cdf = _STD_NORMAL.inv_cdf
        zp = self.prompt_sigma * inv_cdf(unit(pkey))
        return [max(1, round(self.median * math.exp(self.sigma * inv_cdf(unit(seed ^ 0x5EED)) + zp))) for seed in seeds]

    def mean(self, budget: int) -> float:
        """Expected response length under a budget (tokens actually generated)."""
        if self.recorded:
            return float(np.minimum(np.asarray(self.recorded), budget).mean())
        # E[min(L, B)] for a log-normal L, by quadrature over the normal (cheap and exact enough)
        s = math.hypot(self.sigma, self.prompt_sigma)
        zs = np.linspace(-6, 6, 2001)
        w = np.exp(-0.5 * zs**2)
        lens = np.minimum(np.maximum(1.0, self.median * np.exp(s * zs)), budget)
        return float((lens * w).sum() / w.sum())

    @classmethod
    def from_recorded(cls, path: str | Path) -> LengthModel:
        """Lengths of a recorded run: rollouts.jsonl (`--record-rollouts`) or a JSON list of ints."""
        p = Path(path)
        text = p.read_text()
        lengths: list[int] = []
        if text.lstrip().startswith("["):
            lengths = [int(x) for x in json.loads(text)]
        else:
            for i, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    lengths.append(len(json.loads(line)["tokens"]))
                except (ValueError, KeyError, TypeError):
                    raise ValueError(f"{p}:{i}: expected a rollouts.jsonl line with `tokens`") from None
        lengths = [n for n in lengths if n > 0]
        if not lengths:
            raise ValueError(f"{p}: no response lengths found")
        return cls(recorded=tuple(sorted(lengths)))


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
