"""The job file's `algorithm:` section: GRPO and its loss."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from rlboost.contracts.spec.base import SEED_LIMIT, Strict
from rlboost.contracts.stop import stop_problem

Beta = Annotated[float, Field(ge=0, lt=1)]


class OverlongBuffer(Strict):
    """DAPO's soft overlong punishment (arXiv 2503.14476, section 3.4): the last `length` tokens before
    max_new_tokens are a buffer in which a response's reward falls linearly from 0 to -penalty."""

    length: Annotated[int, Field(ge=1, le=1_000_000)]  # veRL: reward_model.overlong_buffer.len
    penalty: Annotated[float, Field(ge=0, le=100)] = 1.0  # veRL: reward_model.overlong_buffer.penalty_factor


class RolloutCorrection(Strict):
    """Truncated importance sampling against the engines' behaviour log-probs (veRL's
    algorithm.rollout_correction.rollout_is / rollout_is_threshold; rlboost/trainer/rollout_correction.py):
    each token's policy-gradient loss is weighted by min(pi_old / pi_behaviour, threshold), per token or
    as the response's product. `none` (the default) is the loss without it, bit for bit."""

    level: Literal["none", "token", "sequence"] = "none"  # veRL: rollout_is (null | token | sequence)
    # the weight's cap; > 1, since a cap at or below 1 would only ever shrink the gradient
    threshold: Annotated[float, Field(gt=1, le=1e6)] = 2.0  # veRL: rollout_is_threshold (default 2.0)


class AlgorithmSpec(Strict):
    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: object) -> object:
        # algorithm.checkpoint_every was never read (the trainer checkpoints by trainer.checkpoint_every)
        if isinstance(data, dict) and "checkpoint_every" in data:
            raise ValueError(
                "checkpoint_every moved to trainer.checkpoint_every (algorithm.checkpoint_every was never used); "
                "move the line under trainer:"
            )
        return data

    name: Literal["grpo"] = "grpo"
    prompts_per_step: Annotated[int, Field(ge=1, le=100_000)] = 32
    group_size: Annotated[int, Field(ge=2, le=1024)] = 8
    max_new_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 12
    learning_rate: Annotated[float, Field(gt=0, le=1.0)] = 3e-3
    steps: Annotated[int, Field(ge=1, le=10_000_000)] = 30
    seed: Annotated[int, Field(ge=0, lt=SEED_LIMIT)] = 0
    temperature: Annotated[float, Field(gt=0, le=10)] = 1.0
    # Rollout sampling truncation on logits / T (vLLM's / veRL's rollout.top_k, rollout.top_p): only the
    # top_k largest tokens (0 = off), then the smallest set holding probability top_p (1 = off). Inside
    # the seeded rule (contracts/sampling.py), so every engine draws the same tokens.
    top_k: Annotated[int, Field(ge=0, le=10_000_000)] = 0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    # Stop strings (vLLM's SamplingParams.stop, veRL's rollout.stop): a response ends at the first token
    # after which its decoded text holds one (contracts/stop.py); [] = EOS and max_new_tokens only.
    stop: list[str] = Field(default_factory=list)
    # Supervised steps on task demonstrations before RL starts ("brief warm start").
    warm_start_steps: Annotated[int, Field(ge=0, le=1_000_000)] = 100
    # Sequences per forward/backward pass (gradients accumulate); None = the whole step's share at once.
    micro_batch_size: Annotated[int, Field(ge=1, le=100_000)] | None = None
    # ---- the optimizer (AdamW, rlboost/trainer/learner.py); the defaults are the fixed values of
    # earlier rlboost versions (weight decay 0 on a tiny model; AdamW's own default is 0.01) ----
    # Adam's (beta1, beta2): veRL actor.optim.betas, TRL adam_beta1 / adam_beta2
    betas: tuple[Beta, Beta] = (0.9, 0.99)
    weight_decay: Annotated[float, Field(ge=0, le=10)] = 0.0
    # clip the gradient's global L2 norm to this before each update (None: no clipping); the metric
    # grad_norm is the norm before clipping
    grad_clip: Annotated[float, Field(gt=0, le=1e6)] | None = 1.0
    # the learning rate by RL step (rlboost/trainer/lr_schedule.py): a linear warm-up over
    # lr_warmup_steps steps, then constant, linear decay or cosine decay over the rest of `steps`
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    lr_warmup_steps: Annotated[int, Field(ge=0, le=10_000_000)] = 0
    # ---- the GRPO loss (rlboost/trainer/grpo.py); names and defaults as veRL's actor config ----
    # KL penalty against a frozen copy of the weights GRPO starts from (held only when > 0: one more copy
    # of the weights in memory, one more forward per micro-batch). 0 as TRL's GRPO default (beta).
    kl_coef: Annotated[float, Field(ge=0, le=100)] = 0.0
    # per-token KL estimate: low_var_kl (k3), kl (k1), mse (k2)
    kl_estimator: Literal["low_var_kl", "kl", "mse"] = "low_var_kl"
    # PPO ratio clip [1 - low, 1 + high]; DAPO's clip-higher: clip_ratio_high 0.28
    clip_ratio_low: Annotated[float, Field(ge=0, lt=1)] = 0.2
    clip_ratio_high: Annotated[float, Field(ge=0, le=100)] = 0.2
    # entropy bonus: the loss gets -entropy_coeff * (entropy of the sampling distribution)
    entropy_coeff: Annotated[float, Field(ge=0, le=100)] = 0.0
    # token-mean: every token of the step weighs the same; seq-mean-token-mean: each response's token
    # mean, averaged over responses (the GRPO paper); seq-mean-token-sum: each response's token sum, averaged
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = "token-mean"
    # several optimizer updates per step (veRL's ppo_mini_batch_size, in prompts, and ppo_epochs); the
    # default, None and 1, is one update per step, strictly on-policy
    ppo_mini_batch_size: Annotated[int, Field(ge=1, le=100_000)] | None = None
    ppo_epochs: Annotated[int, Field(ge=1, le=100)] = 1
    # ---- DAPO (arXiv 2503.14476) ----
    # soft overlong punishment added to each response's reward before advantages (off: None)
    overlong_buffer: OverlongBuffer | None = None
    # drop groups whose rewards are all equal (zero advantage) from the update; dropped groups are not
    # replaced (no refill like veRL's filter_groups.max_num_gen_batches): the step trains on fewer groups
    dynamic_sampling: bool = False
    # ---- rollout correction (off: level none): the engines' behaviour log-probs in the loss ----
    rollout_correction: RolloutCorrection = RolloutCorrection()
    # ---- bounded staleness (rlboost/rollout/policies/staleness.py): 0 is strictly on-policy, each step
    # generated by the weights it trains; k >= 1 lets the next steps' generation run on weights up to k
    # versions older while the trainer trains (prime-rl's async_level, veRL's one-step-off-policy at 1) ----
    max_staleness: Annotated[int, Field(ge=0, le=8)] = 0
    # when a new version reaches engines that still generate an older step: `step` - they finish the
    # step on its weights and pull at the next step's start (each response one version); `in_flight` -
    # they pull it at once and continue every response on it, its KV cache recomputed (AReaL's
    # interruptible rollout), so the next step generates beside the last one's tail (per-token versions;
    # a response's first version is still within max_staleness). Needs max_staleness >= 1.
    weight_swap: Literal["step", "in_flight"] = "step"

    @model_validator(mode="after")
    def _buffer_fits(self) -> AlgorithmSpec:
        if self.weight_swap == "in_flight" and self.max_staleness < 1:
            raise ValueError(
                "weight_swap in_flight needs max_staleness >= 1 (strictly on-policy, no step generates while "
                "a new version lands); set algorithm.max_staleness: 1, or weight_swap: step"
            )
        b = self.overlong_buffer
        if b is not None and b.length >= self.max_new_tokens:
            raise ValueError(
                f"overlong_buffer.length ({b.length}) must be < algorithm.max_new_tokens ({self.max_new_tokens}): "
                "the buffer is the last overlong_buffer.length tokens before max_new_tokens"
            )
        return self

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, v: object) -> object:
        if isinstance(v, str):  # one string where a list was meant: take it as the one stop string
            v = [v]
        if not isinstance(v, list):
            raise ValueError(f"algorithm.stop: a list of strings, got {type(v).__name__}")
        why = stop_problem(v)
        if why is not None:
            raise ValueError(f"algorithm.stop: {why} (e.g. stop: [\"</answer>\"])")
        return v

    @field_validator("betas", mode="before")
    @classmethod
    def _betas_list(cls, v: object) -> object:
        return tuple(v) if isinstance(v, list) else v  # YAML writes a pair as a list

    @model_validator(mode="after")
    def _warmup_fits(self) -> AlgorithmSpec:
        if self.lr_warmup_steps > self.steps:
            raise ValueError(
                f"algorithm.lr_warmup_steps ({self.lr_warmup_steps}) is more than algorithm.steps ({self.steps}): "
                "the learning rate would never reach learning_rate"
            )
        return self

    def loss_knobs_set(self) -> list[str]:
        """The loss and optimizer fields that differ from their defaults."""
        fields = type(self).model_fields
        return [k for k in (*LOSS_KNOBS, *OPTIMIZER_KNOBS) if getattr(self, k) != fields[k].default]


LOSS_KNOBS = (
    "kl_coef",
    "kl_estimator",
    "clip_ratio_low",
    "clip_ratio_high",
    "entropy_coeff",
    "loss_agg_mode",
    "ppo_mini_batch_size",
    "ppo_epochs",
    "overlong_buffer",
    "dynamic_sampling",
    "rollout_correction",
)

OPTIMIZER_KNOBS = ("betas", "weight_decay", "grad_clip", "lr_schedule", "lr_warmup_steps")
