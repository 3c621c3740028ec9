"""The learning rate of each RL step: `lr_at(step, schedule)`, a pure function of the step index.

The schedule counts RL steps (one GRPO step = one `finish_step`, however many optimizer updates
algorithm.ppo_mini_batch_size / ppo_epochs make of it; every update of a step uses that step's rate),
so its position after a resume is the learner's restored `steps_done`, and its length is
algorithm.steps, known before the run. The warm start (algorithm.warm_start_steps) is not counted and
runs at algorithm.learning_rate.

- warm-up (lr_warmup_steps W > 0): step s < W runs at lr * (s + 1) / W, so step W - 1 reaches lr
  (no step runs at 0, unlike a scheduler stepped after its first update);
- then `constant`: lr; `linear`: lr * (T - s) / (T - W); `cosine`: lr * (1 + cos(pi * (s - W) / (T - W))) / 2,
  with T = algorithm.steps (the formulas of transformers' get_linear/cosine_schedule_with_warmup
  after warm-up: the last step's rate is small but not 0).

The defaults (constant, W = 0) give exactly lr at every step: today's fixed-rate AdamW.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

LrScheduleKind = Literal["constant", "linear", "cosine"]


@dataclass(frozen=True)
class LrSchedule:
    lr: float  # algorithm.learning_rate: the peak rate
    kind: LrScheduleKind = "constant"
    warmup_steps: int = 0
    total_steps: int = 1  # algorithm.steps

    @classmethod
    def of(cls, algo) -> LrSchedule:
        """The schedule of an AlgorithmSpec."""
        return cls(algo.learning_rate, algo.lr_schedule, algo.lr_warmup_steps, algo.steps)


def lr_at(step: int, schedule: LrSchedule) -> float:
    """The learning rate of RL step `step` (from 0)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, not {step}")
    s, w, t = step, schedule.warmup_steps, schedule.total_steps
    if s < w:
        return schedule.lr * (s + 1) / w
    if schedule.kind == "constant":
        return schedule.lr  # exactly the configured rate (no float arithmetic on it)
    span = max(1, t - w)
    progress = min(1.0, (s - w) / span)
    if schedule.kind == "linear":
        return schedule.lr * max(0.0, 1.0 - progress)
    if schedule.kind == "cosine":
        return schedule.lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_schedule {schedule.kind!r}")
