"""Rollout correction: truncated importance sampling (TIS) against the engines' behaviour log-probs.

The engines draw each token from pi_behaviour and report its log-prob with it (contracts/sampling.py;
the rollout book keeps them per token, rlboost/rollout/book.py). The trainer's pi_old is its own
forward pass over the same tokens (rlboost/trainer/learner.py), which differs from the engine's
numerically (kernels, precision, batch shapes) and, once rollout runs ahead of training (issue 39's
bounded staleness), by weight versions. The policy gradient assumes the tokens came from pi_old; TIS
reweights each token's policy-gradient loss by the truncated ratio, detached (Yao et al. 2025, "Your
Efficient RL Framework Secretly Brings You Off-Policy RL Training"; veRL's
algorithm.rollout_correction with rollout_is / rollout_is_threshold):

  token:     w_t = min(pi_old(y_t) / pi_behaviour(y_t), C)
  sequence:  w_t = min(prod_s pi_old(y_s) / pi_behaviour(y_s), C)   for every token t of the response

The product is taken as exp(sum of log-ratios), with the sum capped just above log C before exp, so no
response length overflows it. Pure functions of tensors: no learner, no spec (the staleness work reuses
them with the log-probs of the version that generated the tokens).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

Level = Literal["none", "token", "sequence"]


@dataclass(frozen=True)
class Correction:
    weights: Tensor  # [N, T]: the detached importance weight of each response token, 0 at padding
    clipped: Tensor  # [N, T] bool: the token's weight was truncated to the threshold


def is_weights(old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, level: Level, threshold: float) -> Correction:
    """The truncated importance weights of the response tokens (mask [N, T]) from the trainer's
    pi_old log-probs and the engines' behaviour log-probs, both [N, T] and placed alike; weights come
    in old_logp's dtype, computed in float64."""
    if level not in ("token", "sequence"):
        raise ValueError(f"rollout correction level must be 'token' or 'sequence', got {level!r}")
    if not threshold > 1:
        raise ValueError(f"rollout correction threshold must be > 1, got {threshold}")
    f64 = torch.float64
    zeros = torch.zeros(old_logp.shape, dtype=f64, device=old_logp.device)
    delta = torch.where(mask, old_logp.detach().to(f64) - behaviour_logp.to(f64), zeros)
    if level == "sequence":
        delta = torch.where(mask, delta.sum(dim=1, keepdim=True).expand_as(delta), zeros)
    # capped above log C before exp (no overflow), but above it, so that exactly the ratios > C truncate
    ratio = torch.exp(delta.clamp(max=math.log(threshold) + 1.0))
    clipped = (ratio > threshold) & mask
    weights = torch.where(clipped, torch.full_like(ratio, threshold), torch.where(mask, ratio, zeros))
    return Correction(weights.to(old_logp.dtype), clipped)


def right_aligned(rows: Sequence[Sequence[float] | Tensor], like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """Per-row values (each row's response tokens) placed as the learner places a response in [N, T]:
    in the last len(row) columns (rows are left padded), zeros elsewhere; like's device, and its dtype
    unless given (the engines' log-probs are float64: kept so, the weight's difference is taken in it)."""
    # lists (the engines' log-probs) are placed on the host and copied to the device once, not per row
    host = not any(isinstance(row, Tensor) for row in rows)
    out = torch.zeros(like.shape, dtype=dtype or like.dtype, device="cpu" if host else like.device)
    for j, row in enumerate(rows):
        if len(row):
            out[j, -len(row) :] = torch.as_tensor(row, dtype=out.dtype, device=out.device)
    return out.to(like.device)


def check_behaviour(samples: Sequence, level: Level) -> None:
    """Every sample carries one behaviour log-prob per response token, or the correction is refused
    (a hand-built or synthetic sample has none: there is nothing to correct against)."""
    if level == "none":
        return
    for s in samples:
        lps = s.behaviour_logprobs
        if lps is None or len(lps) != len(s.response_ids):
            got = "none" if lps is None else f"{len(lps)}"
            raise ValueError(
                f"algorithm.rollout_correction.level is {level!r} but a response of group {s.group} has {got} "
                f"behaviour log-probs for its {len(s.response_ids)} tokens (the engines' per-token log-probs): "
                "train on responses from the rollout engines, or set rollout_correction.level: none"
            )


@dataclass
class WeightSums:
    """A step's running figures of the weights, for its metrics (one rank's; summed/maxed over ranks)."""

    total: float = 0.0  # sum of the response tokens' weights
    peak: float = 0.0
    clipped: float = 0.0  # tokens whose weight was truncated
    tokens: float = 0.0

    def add(self, c: Correction, mask: Tensor) -> None:
        if not bool(mask.any()):
            return
        self.total += float(c.weights.detach().to(torch.float64)[mask].sum())
        self.peak = max(self.peak, float(c.weights.detach()[mask].max()))
        self.clipped += float(c.clipped.sum())
        self.tokens += float(mask.sum())

    def merge(self, other: WeightSums) -> None:
        self.total, self.clipped, self.tokens = (
            self.total + other.total,
            self.clipped + other.clipped,
            self.tokens + other.tokens,
        )
        self.peak = max(self.peak, other.peak)

    def metrics(self) -> dict[str, float]:
        """metrics.jsonl's is_weight_mean (token mean), is_weight_max and is_clipped_share (share of the
        response tokens whose weight was truncated; at sequence level, every token of a truncated response)."""
        n = max(1.0, self.tokens)
        return {"is_weight_mean": self.total / n, "is_weight_max": self.peak, "is_clipped_share": self.clipped / n}
