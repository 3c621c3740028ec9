"""The job file's `rollout:` section: the spot candidates, the fleet, the engines, the scheduling
policies and the synthetic workload."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from rlboost.contracts.cloud_kinds import DEFAULT_CLOUD, cloud_kind
from rlboost.contracts.spec.base import LaxPath, Price, Seconds, Strict, check_accelerator
from rlboost.contracts.spec.text_limits import region_problem


class SpotCandidate(Strict):
    """One accelerator type to bid for, on any of the listed clouds/regions."""

    accelerator: str
    clouds: list[str] = Field(default_factory=lambda: [DEFAULT_CLOUD])
    regions: list[str] = Field(default_factory=list)
    # Relative generation throughput of one such node (1.0 = the reference accelerator).
    throughput: Annotated[float, Field(gt=0, le=1000)] = 1.0
    spot_price: Price | None = None
    on_demand_price: Price | None = None

    _acc = field_validator("accelerator")(classmethod(lambda cls, v: check_accelerator(v)))

    @field_validator("clouds")
    @classmethod
    def _clouds(cls, v: list[str]) -> list[str]:
        for c in v:
            cloud_kind(c)  # UnknownCloudError (a ValueError) names the registered ones
        if not v:
            raise ValueError("list at least one cloud")
        return v

    @field_validator("regions")
    @classmethod
    def _regions(cls, v: list[str]) -> list[str]:
        for r in v:
            problem = region_problem(r)
            if problem:
                raise ValueError(problem)
        return v


class LengthSpec(Strict):
    """Response lengths of the synthetic workload (and of `rlboost simulate`): log-normal with a long
    tail and a per-prompt factor shared by a GRPO group, or sampled from a recorded run."""

    median_tokens: Annotated[float, Field(gt=0, le=1_000_000)] | None = None  # None: algorithm.max_new_tokens / 8
    sigma: Annotated[float, Field(ge=0, le=5)] = 0.8  # per-response spread (log space)
    prompt_sigma: Annotated[float, Field(ge=0, le=5)] = 0.5  # per-prompt spread (log space)
    # rollouts.jsonl of a run launched with --record-rollouts, or a JSON list of lengths
    recorded: LaxPath | None = None


class SyntheticSpec(Strict):
    lengths: LengthSpec = LengthSpec()
    # Prompt length the synthetic engine charges prefill for (None: the task prompt's real length),
    # e.g. 1000 to model a long-prompt LLM workload without sending long prompts.
    prompt_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None


class SpeculativeSpec(Strict):
    """Lossless speculative decoding (Seer-style, README: Speculative decoding): a drafter proposes up to
    `max_tokens` tokens per response, the engine verifies them in one forward pass and keeps a drafted token
    exactly when it equals the token the seeded sampling rule (contracts/sampling.py) draws there, so every
    response is token for token the one plain decoding gives. `group` drafts from the response's GRPO
    siblings and its prompt, `ngram` from its own prompt and tokens only, `none` never drafts."""

    method: Literal["none", "group", "ngram"] = "none"
    max_tokens: Annotated[int, Field(ge=1, le=64)] = 4


class RolloutSpec(Strict):
    engine: Literal["torch", "vllm", "synthetic"] = "torch"
    candidates: list[SpotCandidate] = Field(default_factory=list)
    max_workers: Annotated[int, Field(ge=0, le=100_000)] = 2
    # The objective never holds fewer (min_workers = max_workers: a fixed fleet, e.g. for benchmarks).
    min_workers: Annotated[int, Field(ge=0, le=100_000)] = 0
    # How many of max_workers to hold (rlboost/rollout/policies/fleet.py), decided after each step from its
    # measured length: `cost` the most tokens per dollar (trainer + workers), `throughput` the fewest
    # workers that give the fastest step (no paying for workers that wait on the trainer).
    objective: Literal["cost", "throughput"] = "cost"
    max_hourly_price: Annotated[float, Field(gt=0, le=10_000)] | None = None
    # Concurrent sequences per engine (the engine's batch size).
    engine_batch: Annotated[int, Field(ge=1, le=100_000)] = 64
    # Tokens per streamed chunk: small chunks mean little is lost when a worker dies.
    stream_chunk_tokens: Annotated[int, Field(ge=1, le=4096)] = 4
    heartbeat_timeout_s: Annotated[float, Field(gt=0, le=600)] = 6.0
    # The trainer cluster also generates (the reserved-cluster share of rollout).
    trainer_engine: bool = True
    # float64 makes sampling reproducible across batch shapes and migration (tiny models only).
    # bfloat16/float16 for hf models on GPUs; auto = model.dtype for hf, float32 for tiny-gpt.
    engine_dtype: Literal["float32", "float64", "bfloat16", "float16", "auto"] = "float32"
    # ---- scheduling policies (rlboost/rollout/policies/) ----
    # When the trainer's own engine stops generating and goes back to training (README: offload).
    offload_policy: Literal["none", "rlboost", "predictive"] = "predictive"
    offload_min_box_s: Seconds = 5.0  # `rlboost` rule's floor
    # `rate`: by measured engine speed and load; `spread`: in proportion to free slots.
    dispatch_policy: Literal["rate", "spread"] = "rate"
    # Move long partial responses from slow or crowded engines to idle ones at a step's tail.
    migration: bool = True
    migration_min_gain_s: Seconds = 0.5
    # RollPacker-style tail batching: over-launch prompts, keep the first groups to finish, gather
    # the long ones into long rounds.
    tail_batching: bool = False
    tail_over_launch: Annotated[float, Field(gt=0, le=4)] = 0.25
    # Seer-style context-aware scheduling: predict each unfinished response's remaining length from its
    # finished GRPO siblings, start and migrate the longest first and spread a group's long ones.
    sibling_scheduling: bool = False
    speculative: SpeculativeSpec = SpeculativeSpec()
    # How often workers send generated tokens (seconds); larger = fewer frames at scale.
    flush_s: Annotated[float, Field(gt=0, le=10)] = 0.02
    synthetic: SyntheticSpec = SyntheticSpec()

    @model_validator(mode="after")
    def _fleet_bounds(self) -> RolloutSpec:
        if self.min_workers > self.max_workers:
            raise ValueError(
                f"min_workers ({self.min_workers}) is above max_workers ({self.max_workers}): lower min_workers, "
                "or raise max_workers to at least it"
            )
        return self
