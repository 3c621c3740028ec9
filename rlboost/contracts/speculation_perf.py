"""How often drafted tokens are accepted: the simulator's speculative-decoding model, from cited measurements.

Speculative decoding here is lossless (rlboost/contracts/speculation.py), so what it changes is
speed: a verification pass with K drafted tokens yields 1 + (accepted) tokens per response. With a
per-token acceptance probability `a` (drafts accepted left to right until the first miss) the mean
is (1 - a^(K+1)) / (1 - a) (Leviathan et al. 2023, eq. 1; `expected_yield` there). Papers and
benchmarks report the *mean acceptance length* tau: tokens per verification step, 1.00 for plain
decoding. Inverting at K -> infinity, tau = 1 / (1 - a), gives a = 1 - 1/tau: the lowest per-token
rate consistent with a measured tau at whatever K the measurement drafted (at a finite K the same
tau needs a higher `a`), so the inversion below understates acceptance where the K is not stated.

Sources (the numbers each parameter comes from):

  ngram, tau 1.73 -> a 0.422: Spec-Bench (hemingkx/Spec-Bench, Leaderboard.md, "Leaderboard on A100"),
    Vicuna-7B-v1.3, one A100-80GB, greedy, batch 1: PLD (prompt lookup decoding, the n-gram drafter
    vLLM ships as `ngram`) "#Mean Accepted Tokens" 1.73 (1.74 on an RTX 3090), 1.61x speedup on its
    mathematical-reasoning subset (GSM8K). A 7B model drafting from its own prompt and tokens, on math:
    the nearest public measurement of `method: ngram`, though not a reasoning model and not RL.
  group, tau 2.85 -> a 0.649 once every sibling has finished: Seer (Qin et al., arXiv 2511.14617,
    Moonshot AI + Tsinghua, OSDI '26), ablation of adaptive grouped speculative decoding: drafting from
    the group's compressed suffix trees raises the mean acceptance length from 1.70 to 2.85 and
    rollout throughput by 26-48 %, on RL rollouts of reasoning models (Moonlight, Qwen2-VL-72B,
    Kimi-K2: larger than 7-8B). The figures were read from a public summary of the paper (the paper's
    own table was not reachable from here); the 1.70 without the group agrees with Spec-Bench's 1.73
    for a request drafting from its own text.

The dependence on siblings is an assumption, not a measurement: Seer's point is that the group's
text drafts the tail, and the more of the group has been written, the better the drafts. Nothing
citable gives the curve, so the rate rises linearly with the fraction of the response's siblings
that have finished, from the ngram rate (no sibling done: the response drafts from little but its
own text, as Seer's 1.70) to Seer's grouped rate (all done). Seer spends its speculation mostly on
the tail, where most siblings are done, so its mean is used as the all-done rate.

Verification cost (rlboost/contracts/perf.py EngineModel.pass_time): a pass over n tokens costs a
decode step of n sequences. Decode is memory-bound: a pass reads the weights once and each
sequence's KV cache once however many tokens it verifies, so n sequences (n KV caches) cost at least
as much as n tokens of fewer sequences; the measured decode curve is an upper bound on verification
and the model is conservative for speculation. Drafting itself (a suffix-tree or n-gram lookup on
CPU) is not charged. Nothing here is fitted to the throughput targets BENCHMARKS.md checks.
"""

from __future__ import annotations

from dataclasses import dataclass


def rate_from_mean_length(tau: float) -> float:
    """Per-token acceptance from a mean acceptance length tau (tokens per verification step), inverted
    at K -> infinity: the lowest rate that gives tau at any K (see the module's docstring)."""
    if tau < 1.0:
        raise ValueError(f"a mean acceptance length is >= 1 (plain decoding), got {tau}")
    return 1.0 - 1.0 / tau


NGRAM_MEAN_LENGTH = 1.73  # Spec-Bench, PLD, Vicuna-7B-v1.3, A100 (see above)
GROUP_MEAN_LENGTH = 2.85  # Seer, grouped speculative decoding (see above)


@dataclass(frozen=True)
class AcceptanceModel:
    """Per-token acceptance probability of a response's drafted tokens."""

    ngram: float = rate_from_mean_length(NGRAM_MEAN_LENGTH)
    group_all_done: float = rate_from_mean_length(GROUP_MEAN_LENGTH)

    def rate(self, method: str, siblings_done: float) -> float:
        """method: none | ngram | group; siblings_done: the fraction (0..1) of the response's GRPO
        siblings that have finished (its group's text that exists to draft from)."""
        if method == "ngram":
            return self.ngram
        if method == "group":
            f = min(max(siblings_done, 0.0), 1.0)
            return self.ngram + (self.group_all_done - self.ngram) * f
        if method == "none":
            return 0.0
        raise ValueError(f"unknown speculative method {method!r}")


ACCEPTANCE = AcceptanceModel()


def measured(rate: float) -> AcceptanceModel:
    """A measured per-token acceptance (simulate.acceptance), the same whatever the siblings."""
    return AcceptanceModel(ngram=rate, group_all_done=rate)
