"""Training while the tail generates (what makes an offload pay): the accounting the live learner and
the simulator share.

Once the coordinator has offloaded the step's remaining generation, the trainer trains finished groups
as they come (live: those waiting when the learner is free, in one call; simulated: per token at the
training rate, which is the same time); when the last response arrives, what is in training keeps the
part already done, and the step's update trains what is left. Pure functions of one clock's marks.
"""

from __future__ import annotations

from collections.abc import Iterable


def may_train_group(overlap: bool, offload_at: float | None, gen_end: float | None) -> bool:
    """Whether the trainer may start training a finished group now: only with a learner that streams,
    only after the offload (before it, the trainer's GPUs generate) and only until the last response."""
    return overlap and offload_at is not None and gen_end is None


def trained_part(tokens: int, started: float, now: float, tokens_per_s: float) -> int:
    """Tokens of a group trained by `now`, when its training started at `started` (a group cut short by
    the end of generation keeps this part)."""
    return min(tokens, max(0, int((now - started) * tokens_per_s)))


def left_to_train(total: int, pretrained: int, overlap: bool) -> int:
    """Tokens the step's update still trains after its last response."""
    return max(0, total - pretrained) if overlap else total


def busy_total(intervals: Iterable[tuple[float, float]]) -> float:
    """Training time of a step (its busy intervals summed)."""
    return float(sum(e - s for s, e in intervals))


def busy_between(intervals: Iterable[tuple[float, float]], a: float | None, b: float | None) -> float:
    """Training time inside [a, b] (the tail: offload -> last response); 0 without both marks."""
    if a is None or b is None:
        return 0.0
    return float(sum(max(0.0, min(e, b) - max(s, a)) for s, e in intervals))
