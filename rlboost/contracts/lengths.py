"""The synthetic workload's response lengths: a deterministic long-tailed model.

`LengthModel` decides how long a synthetic response is, from the prompt and the request seed only, so
a response that migrates mid-way ends at the same length on any engine, and the simulator and the
live synthetic engine agree on every response. Lengths are log-normal with a per-prompt factor
(GRPO groups share a prompt, and hard prompts make every response of the group long) or drawn from a
recorded run. The trainer sends it to synthetic workers in `welcome`; the simulator replays it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
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
        return cls(recorded=read_recorded(path).lengths)


@dataclass(frozen=True)
class RecordedRun:
    """What a recorded run's file says, read once: its response lengths (sorted) and, where its
    engines drafted, the drafted and accepted token counts (speculative decoding)."""

    lengths: tuple[int, ...]
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance(self) -> float | None:
        """accepted / drafted over the responses; None where it drafted nothing (or the file is a
        plain list of lengths)."""
        return self.accepted / self.drafted if self.drafted > 0 else None


def read_recorded(path: str | Path) -> RecordedRun:
    """A recorded run: rollouts.jsonl (`--record-rollouts`) or a JSON list of ints (lengths only)."""
    p = Path(path)
    text = p.read_text()
    lengths: list[int] = []
    drafted = accepted = 0
    if text.lstrip().startswith("["):
        lengths = [int(x) for x in json.loads(text)]
    else:
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                lengths.append(len(r["tokens"]))
                drafted, accepted = drafted + int(r.get("drafted") or 0), accepted + int(r.get("accepted") or 0)
            except (ValueError, KeyError, TypeError, AttributeError):
                raise ValueError(f"{p}:{i}: expected a rollouts.jsonl line with `tokens`") from None
    lengths = [n for n in lengths if n > 0]
    if not lengths:
        raise ValueError(f"{p}: no response lengths found")
    return RecordedRun(tuple(sorted(lengths)), drafted, accepted)
