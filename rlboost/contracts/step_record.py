"""One finished training step, typed end to end: the trainer records a StepRecord per step (rlboost/trainer/
runtime.py), its status document carries them in `history` (status.py), and the controller takes them
from there into the state store (rlboost/cli/state.py's StepMetrics), metrics.jsonl, its progress line
and the fleet sizing. Each quantity has one name, the one users read in metrics.jsonl (README):
`step_s`, `offload_s`, `trainer_idle_s`, `spot_workers`, ...

StepTiming is the rollout coordinator's part of it (what `Coordinator.end_step` measured).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

# StepRecord's rollout-correction figures (metrics.jsonl writes them only when set)
ROLLOUT_CORRECTION_COLUMNS = ("is_weight_mean", "is_weight_max", "is_clipped_share")


class StepTiming(BaseModel):
    """What the rollout coordinator measured of one step, on its own clock, from the step's dispatch to
    the trainer's end of it (trained and published)."""

    model_config = ConfigDict(extra="forbid")

    spot_workers: int  # remote engines serving (or pulling) when the step started
    step_s: float  # the step, as the coordinator timed it
    gen_s: float  # until its last response
    offload_s: float | None  # seconds into the step when the reserved engine handed over (None: it did not)
    trainer_idle_s: float  # after that, time the trainer waited for finished groups to train on
    remote_idle_s: float  # time the remote engines waited for work
    gen_tokens: int  # generated since the last step ended, by every engine (trained or not)
    spot_tokens: int  # of which spot workers generated


class StepRecord(BaseModel):
    """What the trainer records of one finished step."""

    model_config = ConfigDict(extra="forbid")

    step: int  # the trainer's index, from 0: users see step + 1 (rlboost/cli/step_numbers.py)
    version: int  # the weights that generated it (= step; up to algorithm.max_staleness older)
    reward: float  # mean over the responses trained on
    loss: float  # the whole objective: PPO-clipped policy term + KL - entropy
    kl: float | None = None  # token means, where the learner has them (kl / entropy: only when weighted)
    entropy: float | None = None
    clip_frac: float | None = None  # share of tokens whose PPO ratio was clipped
    # the optimizer's side (None: a learner without one, the synthetic; a record an older rlboost wrote)
    pg_loss: float | None = None  # the policy-gradient (PPO-clipped) term of loss, without KL and entropy
    grad_norm: float | None = None  # the gradient's global L2 norm before clipping (mean over the updates)
    lr: float | None = None  # the learning rate of the step's last update
    updates: int | None = None  # optimizer updates taken in the step
    # DAPO's knobs (None when off): the mean overlong penalty added to the rewards (algorithm.overlong_buffer),
    # and the groups dynamic sampling dropped (algorithm.dynamic_sampling; update_skipped 1: all of them)
    overlong_penalty_mean: float | None = None
    groups_dropped: int | None = None
    update_skipped: bool | None = None
    # algorithm.rollout_correction (None when its level is none): the importance weights' token mean and
    # max, and the share of response tokens whose weight was truncated to the threshold
    is_weight_mean: float | None = None
    is_weight_max: float | None = None
    is_clipped_share: float | None = None
    responses: int
    tokens: int  # of the responses trained on
    len_max: int  # the longest response's tokens
    engines: int  # engines that generated a part of a response
    migrated: int  # responses moved to another engine mid-generation
    reward_errors: int  # responses a custom reward failed on so far in the job, evaluations included (scored 0)
    # the step's wall time on the trainer, from its start (or, where it began before the last step's
    # record, algorithm.max_staleness, from that record) to its record: a job's step_s sum to its wall time
    step_s: float
    gen_s: float  # generation: the coordinator's measure where it timed the step, else the trainer's
    train_s: float  # the trainer's busy time training it
    tail_train_s: float  # of which while the tail generated remotely (after the offload)
    publish_s: float | None = None  # the weight sync's share on the trainer (stage + publish the next version)
    broadcast: dict[str, Any] | None = None  # weights.transport: the last finished broadcast, else None
    # the coordinator's measurements (StepTiming); None where it timed no step
    spot_workers: int | None = None
    offload_s: float | None = None
    trainer_idle_s: float | None = None
    gen_tokens: int | None = None
    spot_tokens: int | None = None
    # speculative decoding (rollout.speculative.method not none; else None), over the step's responses:
    # drafted tokens verified, of which accepted, and the mean tokens a response gained per forward
    # pass that verified a draft for it (None: nothing was drafted)
    spec_drafted: int | None = None
    spec_accepted: int | None = None
    spec_tokens_per_pass: float | None = None

    @property
    def timed(self) -> bool:
        """Did the coordinator time this step (StepTiming's fields are set)?"""
        return self.spot_workers is not None

    @model_validator(mode="before")
    @classmethod
    def _older_names(cls, data: Any) -> Any:
        """A record an older rlboost wrote (a checkpoint resumed by this one, a trainer still running
        under a resumed controller): `seconds` was step_s, `box_s` offload_s, `n_remote` spot_workers,
        and the coordinator's own step_s and remote_idle_s came along."""
        if not isinstance(data, dict) or "seconds" not in data:
            return data
        d = {k: v for k, v in data.items() if k not in ("step_s", "remote_idle_s")}
        d["step_s"] = d.pop("seconds")
        for old, new in (("box_s", "offload_s"), ("n_remote", "spot_workers")):
            if old in d:
                d[new] = d.pop(old)
        return d


def speculation_figures(counts: Iterable[tuple[int, int, int]]) -> dict[str, Any]:
    """StepRecord's spec_* fields from each response's (drafted, accepted, passes that verified a draft):
    a pass gains a response its accepted tokens plus the one sampled after them."""
    drafted = accepted = passes = 0
    for d, a, n in counts:
        drafted, accepted, passes = drafted + d, accepted + a, passes + n
    return {
        "spec_drafted": drafted,
        "spec_accepted": accepted,
        "spec_tokens_per_pass": round((accepted + passes) / passes, 3) if passes else None,
    }
