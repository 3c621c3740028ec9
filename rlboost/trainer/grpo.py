"""GRPO math: group-normalised advantages and the per-token loss terms.

GRPO samples G responses per prompt (a "group") and scores each response against its own group, so no
value network is needed: advantage = (reward - group mean) / (group std + eps).

The loss per response token (veRL's actor loss; names as in veRL's config):
  -A * ratio, PPO-clipped      ratio = pi / pi_old, clipped to [1 - clip_ratio_low, 1 + clip_ratio_high]
                              (DAPO's "clip-higher" is clip_ratio_high > clip_ratio_low)
  + kl_coef * KL(pi || pi_ref) per-token estimate of the drift from a frozen reference model
  - entropy_coeff * H(pi)     entropy of the sampling distribution at that position
aggregated over the step by `loss_agg_mode`. pi_old is the learner's own log-prob under the weights
that generated the response (not the engine's, which differs numerically). With one update per step
(the default) that is the current pi, detached: the ratio is 1, the clip never triggers and the policy
term's gradient is the plain policy gradient; with several (ppo_mini_batch_size, ppo_epochs) every
update after the first sees ratios != 1 and the clip acts. With algorithm.rollout_correction the
policy term of each token is also weighted by the truncated ratio pi_old / pi_behaviour of the engine's
own log-prob (rlboost/trainer/rollout_correction.py).

DAPO's (arXiv 2503.14476) reward-side knobs live here too: `overlong_penalty` (the soft overlong
punishment, algorithm.overlong_buffer) and `informative_groups` (dynamic sampling's filter,
algorithm.dynamic_sampling); the learner applies them to whole groups before advantages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor


@dataclass
class Sample:
    prompt_ids: list[int]
    response_ids: list[int]  # exactly what the engine generated (EOS included if it stopped on EOS)
    reward: float
    group: int  # samples with the same group id answer the same prompt
    # the engine's log-prob of each response token (its behaviour policy; contracts/sampling.py), for
    # algorithm.rollout_correction (rlboost/trainer/rollout_correction.py); None where none was recorded
    behaviour_logprobs: list[float] | None = None


def group_advantages(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """rewards [n_groups, G] -> advantages [n_groups, G]: (r - mean) / (std + eps) within each row.

    std is the unbiased sample std (as in TRL/verl); a group whose rewards are all equal carries no
    signal and gets zeros."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [n_groups, G>=2], got {tuple(rewards.shape)}")
    rewards = rewards.to(torch.float64)
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return ((rewards - mean) / (std + eps)).to(torch.float32)


def sample_advantages(samples: Sequence[Sample]) -> Tensor:
    """Per-sample advantages [N], grouping by `Sample.group` (groups may differ in size)."""
    by_group: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        by_group.setdefault(s.group, []).append(i)
    adv = torch.zeros(len(samples))
    for members in by_group.values():
        if len(members) < 2:
            continue  # a lone response has nothing to be compared with
        r = torch.tensor([[samples[i].reward for i in members]])
        adv[members] = group_advantages(r)[0]
    return adv


def overlong_penalty(length: int, max_len: int, buffer_len: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13), added to a response's reward: 0 up to
    max_len - buffer_len tokens, then falling linearly to -penalty at max_len, and -penalty beyond."""
    if not 0 < buffer_len < max_len:
        raise ValueError(f"need 0 < buffer_len < max_len, got buffer_len {buffer_len}, max_len {max_len}")
    start = max_len - buffer_len
    if length <= start:
        return 0.0
    if length <= max_len:
        return (start - length) / buffer_len * penalty
    return -penalty


def informative_groups(samples: Sequence[Sample]) -> set[int]:
    """The groups whose rewards are not all equal (DAPO's dynamic sampling keeps these): a group whose
    rewards are all equal, a lone response included, has zero advantage everywhere."""
    by_group: dict[int, set[float]] = {}
    for s in samples:
        by_group.setdefault(s.group, set()).add(s.reward)
    return {g for g, rewards in by_group.items() if len(rewards) > 1}


LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
KlEstimator = Literal["low_var_kl", "kl", "mse"]


def token_weights(mask: Tensor, mode: LossAgg, dtype: torch.dtype) -> Tensor:
    """Per-token weights [N, T] such that the step's loss is sum(weight * token loss) / agg_units.

    token-mean: every response token of the step counts once (long responses weigh more; veRL's
    default, DAPO's token-level loss). seq-mean-token-mean: each response's token mean, averaged over
    responses (the original GRPO paper). seq-mean-token-sum: each response's token sum, averaged over
    responses."""
    if mode == "token-mean":
        return mask  # the mask itself: the default's arithmetic is unchanged (x * True == x)
    w = mask.to(dtype)
    if mode == "seq-mean-token-mean":
        return w / w.sum(dim=1, keepdim=True).clamp(min=1.0)
    if mode == "seq-mean-token-sum":
        return w
    raise ValueError(f"unknown loss_agg_mode {mode!r}")


def agg_units(lengths: Sequence[int], mode: LossAgg) -> int:
    """The step's denominator: its response tokens (token-mean) or its responses (seq-mean-*)."""
    return sum(lengths) if mode == "token-mean" else len(lengths)


def agg_loss(values: Tensor, mask: Tensor, mode: LossAgg = "token-mean") -> Tensor:
    """A whole batch's loss from per-token values [N, T] (mask [N, T]) under `mode`."""
    units = agg_units([int(n) for n in mask.sum(dim=1)], mode)
    return (values * token_weights(mask, mode, values.dtype)).sum() / max(1, units)


def policy_gradient_loss(logp: Tensor, advantages: Tensor, mask: Tensor, mode: LossAgg = "token-mean") -> Tensor:
    """-A * log pi(token) aggregated by `mode`: logp, mask [N, T]; advantages [N] (the warm start's
    likelihood loss is this with A = 1)."""
    return agg_loss(-(advantages[:, None].to(logp.dtype) * logp), mask, mode)


def clipped_ratio(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """PPO's clipped ratio: (surrogate [N, T], clipped [N, T] bool); the policy loss per token is
    -A * surrogate, equal in value and gradient to max(-A * r, -A * clip(r, 1 - low, 1 + high)).

    A token is clipped where the update already moved it far enough in the advantage's direction
    (A > 0 and r > 1 + high, or A < 0 and r < 1 - low): its surrogate is the clip bound, a constant,
    so it gets no gradient. Written with where() rather than max() so that at r == 1 the gradient is
    exactly A * dr (max() splits a tie's gradient in halves)."""
    ratio = torch.exp(logp - old_logp)
    a = advantages[:, None].to(logp.dtype)
    clipped = ((a > 0) & (ratio > 1.0 + clip_high)) | ((a < 0) & (ratio < 1.0 - clip_low))
    bound = ratio.detach().clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.where(clipped, bound, ratio), clipped


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: KlEstimator) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled tokens (Schulman's k1/k2/k3; veRL's names).

    low_var_kl (k3): exp(ref - logp) - (ref - logp) - 1, >= 0 and unbiased, clamped to [-10, 10] as in
    veRL; kl (k1): logp - ref; mse (k2): (logp - ref)^2 / 2. All are 0 where pi == pi_ref."""
    if estimator == "low_var_kl":
        d = (ref_logp - logp).clamp(min=-20.0, max=20.0)  # veRL's guard against exp overflow
        return (torch.exp(d) - d - 1.0).clamp(min=-10.0, max=10.0)
    if estimator == "kl":
        return logp - ref_logp
    if estimator == "mse":
        return 0.5 * (logp - ref_logp) ** 2
    raise ValueError(f"unknown kl_estimator {estimator!r}")


def entropy(log_probs: Tensor) -> Tensor:
    """Entropy of each position's distribution: log_probs [..., V] (log-softmax) -> [...]."""
    return -(log_probs.exp() * log_probs).sum(dim=-1)
