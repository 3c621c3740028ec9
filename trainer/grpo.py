"""GRPO math: group-normalised advantages and the on-policy policy-gradient loss.

GRPO samples G responses per prompt (a "group") and scores each response against its own group, so no
value network is needed: advantage = (reward - group mean) / (group std + eps). Training here is
strictly on-policy (one update per batch of rollouts, all from the current weights), so the PPO ratio
is 1 and its clipping never triggers; the loss reduces to the advantage-weighted log-likelihood.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Sample:
    prompt_ids: list[int]
    response_ids: list[int]  # exactly what the engine generated (EOS included if it stopped on EOS)
    reward: float
    group: int  # samples with the same group id answer the same prompt


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


def policy_gradient_loss(logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Token-level mean of -A * log pi(token): logp, mask [N, T]; advantages [N].

    Every response token counts once, so long responses weigh more than short ones (DAPO-style
    token-level averaging rather than a per-sequence mean)."""
    mask = mask.to(logp.dtype)
    return -(advantages[:, None].to(logp.dtype) * logp * mask).sum() / mask.sum().clamp(min=1.0)
