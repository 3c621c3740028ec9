"""Sibling-aware remaining-length prediction (Seer's "context-aware scheduling", arXiv 2511.14617).

A GRPO group's responses answer one prompt, and their lengths share a per-prompt factor (hard prompts
make every response long). Seer uses the first finished responses of a group to estimate the group's
length and starts the long groups first. Here that estimate is a Bayesian one, so that it sharpens the
learned length distribution (rollout/policies/lengths.py) instead of replacing it:

    log L = mu + prompt_sd * z + response_sd * e,    z, e ~ N(0, 1), z shared by the group

- mu and the total log-sd come from LengthStats' window of finished lengths (the median and the 10th
  percentile: both below the budget, so responses cut at the budget do not bias them);
- the split of that spread between the prompt and the response is learned from complete groups
  (`GroupSpread`: the within-group spread of log lengths);
- a group's factor z has a posterior from its finished siblings' lengths (a sibling cut at the budget
  only says L >= budget) and from its unfinished ones, which are known to be longer than what they
  have generated (each counted at the predicted response's own progress: siblings start together);
- a response's expected remaining tokens are E[min(L, budget) - g | L > g] under that posterior, so
  the prediction is never below what it has generated, and grows with its siblings' lengths.

Pure numpy on a fixed grid over z; no clock, no I/O. Callers fall back to LengthStats until the
spread has been learned (`SiblingModel.prior` is None).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rlboost.rollout.policies.lengths import LengthStats

_Z = np.linspace(-4.0, 4.0, 41)  # the group factor's grid (standard normal units)
_LOG_PRIOR_Z = -0.5 * _Z**2
_SQRT2 = math.sqrt(2.0)
_Q10 = 1.2815515655446004  # the standard normal's 90th percentile
_MIN_SD = 0.05  # log-sd floor: a degenerate spread would make every ratio 0/0


def _log_erfc(x: np.ndarray) -> np.ndarray:
    """log erfc(x), relative error < 1.2e-7 everywhere (Numerical Recipes' Chebyshev fit), so far tails
    stay accurate in log space."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (
        1.00002368
        + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (
            1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))
    )
    log_pos = np.log(t) + poly  # log erfc(|x|)
    return np.where(x >= 0, log_pos, np.log(np.maximum(2.0 - np.exp(log_pos), 1e-300)))


def log_sf(x: np.ndarray) -> np.ndarray:
    """log P(N(0,1) > x)."""
    return math.log(0.5) + _log_erfc(np.asarray(x, np.float64) / _SQRT2)


def cdf(x: np.ndarray) -> np.ndarray:
    return np.exp(log_sf(-np.asarray(x, np.float64)))


@dataclass(frozen=True)
class LogNormalPrior:
    mu: float  # log of the median length
    prompt_sd: float  # log-sd of the factor a group shares
    response_sd: float  # log-sd of a response around its group's factor


class GroupSpread:
    """The within-group spread of log lengths, from complete groups (a bounded window of deviations).
    Robust (median absolute deviation): a few responses cut at the budget barely move it."""

    def __init__(self, window: int = 8192, min_groups: int = 8) -> None:
        self.window = window
        self.min_groups = min_groups
        self._ring = np.zeros(window)
        self._n = 0
        self.groups = 0

    def add_group(self, lengths: Sequence[int]) -> None:
        n = len(lengths)
        if n < 2:
            return
        x = np.log(np.maximum(np.asarray(lengths, np.float64), 1.0))
        dev = (x - x.mean()) * math.sqrt(n / (n - 1))  # deviations from the group's own mean shrink by (n-1)/n
        for d in dev.tolist():
            self._ring[self._n % self.window] = d
            self._n += 1
        self.groups += 1

    def response_sd(self) -> float | None:
        if self.groups < self.min_groups:
            return None
        d = self._ring[: min(self._n, self.window)]
        return float(np.median(np.abs(d - np.median(d)))) * 1.4826


class SiblingModel:
    """What the predictions rest on: the learned length distribution and the within-group spread."""

    def __init__(self, stats: LengthStats, spread: GroupSpread | None = None) -> None:
        self.stats = stats
        self.spread = spread if spread is not None else GroupSpread()

    def prior(self) -> LogNormalPrior | None:
        """None until enough is known (then callers use LengthStats alone)."""
        se = self.spread.response_sd()
        if se is None or self.stats.count < 2:
            return None
        q10, q50 = self.stats.quantiles((0.1, 0.5))
        mu = math.log(max(q50, 1.0))
        total = max((mu - math.log(max(q10, 1.0))) / _Q10, _MIN_SD)
        se = min(max(se, _MIN_SD), total)
        return LogNormalPrior(mu, math.sqrt(max(total * total - se * se, 0.0)), se)


def group_log_lik(prior: LogNormalPrior, finished: Sequence[int], budget: float) -> np.ndarray:
    """Log-likelihood of a group's finished lengths at each grid point of its factor (a length at the
    budget is censored: the response would have gone on)."""
    out = np.zeros_like(_Z)
    if not finished:
        return out
    f = np.asarray(finished, np.float64)
    m = prior.mu + prior.prompt_sd * _Z  # the group's log-median at each z
    se = prior.response_sd
    cut = f >= budget
    x = np.log(np.maximum(f[~cut], 1.0))
    if x.size:
        out -= 0.5 * (((x[:, None] - m[None, :]) / se) ** 2).sum(axis=0)
    if cut.any():
        out += int(cut.sum()) * log_sf((math.log(budget) - m) / se)
    return out


def expected_remaining(
    prior: LogNormalPrior,
    generated: np.ndarray,
    budget_left: np.ndarray,
    group_lik: np.ndarray,
    unfinished: np.ndarray,
) -> np.ndarray:
    """E[min(L, budget) - g | L > g, the group's evidence] for each response (vectorised).

    group_lik: (responses, grid) log-likelihood of each response's group's finished siblings;
    unfinished: how many of its group (itself included) have not finished, each known to be longer
    than g, the response's own progress."""
    g = np.asarray(generated, np.float64)
    left = np.asarray(budget_left, np.float64)
    budget = g + left
    se = prior.response_sd
    m = prior.mu + prior.prompt_sd * _Z[None, :]  # (1, Z)
    lg = np.log(np.maximum(g, 1.0))[:, None]
    a = np.where(g[:, None] >= 1.0, (lg - m) / se, -np.inf)  # P(L > g | z) = sf(a)
    b = (np.log(np.maximum(budget, 1.0))[:, None] - m) / se
    log_surv = np.where(np.isfinite(a), log_sf(np.where(np.isfinite(a), a, 0.0)), 0.0)
    logw = _LOG_PRIOR_Z[None, :] + group_lik + np.asarray(unfinished, np.float64)[:, None] * log_surv
    w = np.exp(logw - logw.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    # E[min(L, B) | L > g, z] = (exp(m + se^2/2) (Phi(b - se) - Phi(a - se)) + B sf(b)) / sf(a)
    below = np.where(np.isfinite(a), cdf(np.where(np.isfinite(a), a, 0.0) - se), 0.0)
    partial = np.exp(m + 0.5 * se * se) * np.maximum(cdf(b - se) - below, 0.0)
    capped = budget[:, None] * np.exp(log_sf(b))
    surv = np.exp(log_surv)
    mean_z = (partial + capped) / np.maximum(surv, 1e-300)
    mean_z = np.clip(mean_z, g[:, None], budget[:, None])  # where sf underflows (weight ~0 there anyway)
    rest = (w * mean_z).sum(axis=1) - g
    return np.minimum(np.maximum(rest, 1.0), left)


class GroupLengths:
    """A step's groups as the coordinator sees them: their sizes and their finished lengths, in the
    order they finished."""

    def __init__(self, sizes: Mapping[Hashable, int]) -> None:
        self.sizes = dict(sizes)
        self.finished: dict[Hashable, list[int]] = {}

    def extend(self, sizes: Mapping[Hashable, int]) -> None:
        """Another step's groups, generated beside these (weights swapped in flight)."""
        self.sizes.update(sizes)

    def add(self, group: Hashable, length: int) -> list[int]:
        got = self.finished.setdefault(group, [])
        got.append(length)
        return got

    def predict(
        self,
        model: SiblingModel,
        groups: Sequence[Hashable],
        generated: np.ndarray,
        budget_left: np.ndarray,
    ) -> np.ndarray | None:
        """Every response's expected remaining tokens (`groups[i]` its group); None while the model
        knows too little (the caller keeps LengthStats' prediction)."""
        prior = model.prior()
        if prior is None:
            return None
        gen = np.asarray(generated, np.float64)
        if gen.size == 0:
            return np.zeros(0)
        budget = float(np.max(gen + np.asarray(budget_left, np.float64)))
        liks: dict[Hashable, np.ndarray] = {}
        rows = np.empty((gen.size, _Z.size))
        unfinished = np.empty(gen.size)
        for i, grp in enumerate(groups):
            lik = liks.get(grp)
            fin = self.finished.get(grp, ())
            if lik is None:
                lik = liks[grp] = group_log_lik(prior, fin, budget)
            rows[i] = lik
            unfinished[i] = max(1, self.sizes.get(grp, len(fin) + 1) - len(fin))
        return expected_remaining(prior, gen, budget_left, rows, unfinished)
