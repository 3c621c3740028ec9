"""The job file (`job.yaml`): a pydantic model, strict about unknown keys and contradictions.

Every error is reported as `<field.path>: <problem> (<allowed values or fix>)` so a user can fix the
file without reading this module.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rlboost.contracts import job_yaml
from rlboost.contracts.bundled_data import bundled_path, is_bundled
from rlboost.contracts.provider_kinds import PROVIDER_KINDS, provider_kind
from rlboost.contracts.spec_hints import (
    clip_message,
    count_form,
    did_you_mean,
    model_at,
    not_a_mapping,
    numeric_range,
    short_repr,
    unknown_key_hint,
)

PROVIDERS = tuple(PROVIDER_KINDS)  # JobSpec.provider's values (tests/test_provider_registry.py keeps them equal)
ENGINES = ("torch", "vllm", "synthetic")
TASKS = ("reverse", "copy", "add", "sort", "jsonl")
CLOUDS = ("aws", "gcp", "azure", "lambda", "runpod", "local")

_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,38}[a-z0-9]$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_name_problem(name: str) -> str | None:
    """Why `name` cannot be a job's environment variable, or None."""
    if not _ENV_NAME_RE.match(name):
        return f"{name!r} is not a valid environment variable name (letters, digits and '_', not starting with a digit)"
    if name.upper().startswith("RLBOOST_"):
        return f"{name!r}: names starting with RLBOOST_ are reserved for rlboost's own variables; rename it"
    return None


class Strict(BaseModel):
    # strict: no silent coercion (`steps: "10"`, `steps: true`, `max_workers: 2.5` are errors); fields
    # whose YAML form is a string of another type (paths) opt out one by one with LaxPath.
    # allow_inf_nan=False: no number is .inf or .nan (an infinite price billed $inf, an infinite time
    # scale $0.00); every number also has bounds no real job leaves (tests/test_job_yaml.py checks each has)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# a path is written as a string in YAML (and in a model_dump(mode="json") round trip)
LaxPath = Annotated[Path, Field(strict=False)]

# the units most numbers come in, each with bounds no real job leaves
Price = Annotated[float, Field(ge=0, le=10_000)]  # $/h of one node or instance (8 H100s: ~$100)
Seconds = Annotated[float, Field(ge=0, le=604_800)]  # a duration: at most a week
Hours = Annotated[float, Field(gt=0, le=10_000)]  # a job's span: at most ~14 months
TokenRate = Annotated[float, Field(gt=0, le=1e9)]  # tokens/s, of one GPU or a whole cluster
SEED_LIMIT = 2**32  # numpy's legacy seeding (and with it HF's set_seed) takes 0 <= seed < 2**32


class ModelSpec(Strict):
    """The policy model. `tiny-gpt` is defined in rlboost/models/tiny_gpt.py and trains on CPU. `synthetic` has
    no weights to speak of: the trainer takes `train_tokens_per_s` to "train" (drives the control
    plane at scale with synthetic engines, no torch work)."""

    kind: Literal["tiny-gpt", "hf", "synthetic"] = "tiny-gpt"
    n_layer: Annotated[int, Field(ge=1, le=48)] = 2
    n_head: Annotated[int, Field(ge=1, le=64)] = 4
    n_embd: Annotated[int, Field(ge=8, le=8192)] = 64
    block_size: Annotated[int, Field(ge=8, le=32768)] = 64
    # synthetic only: training throughput of the whole trainer cluster (tokens/s); None = from `perf`
    # for trainer.accelerators x trainer.nodes
    train_tokens_per_s: TokenRate | None = None
    # ---- hf only (rlboost/models/hf.py): any Hugging Face causal LM ----
    # a local directory (config.json + *.safetensors + tokenizer; relative to the job file) or a hub id
    path: str | None = None
    # weights as trained, published and generated with (float32 on CPU; bfloat16 on GPUs)
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    # engines' context length (prompt + response); None = the model config's, capped at 4096
    max_model_len: Annotated[int, Field(ge=16, le=1_048_576)] | None = None
    trust_remote_code: bool = False

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSpec:
        # "set" = differs from the default, so a model_dump() round trip (the worker's welcome) validates
        changed = {k for k, f in type(self).model_fields.items() if getattr(self, k) != f.default}
        tiny_fields = {"n_layer", "n_head", "n_embd", "block_size"} & changed
        hf_fields = {"path", "dtype", "max_model_len", "trust_remote_code"} & changed
        if self.kind == "hf":
            if not self.path:
                raise ValueError("kind: hf needs path (a local model directory or a hub id, e.g. Qwen/Qwen2.5-0.5B)")
            if tiny_fields:
                raise ValueError(f"{', '.join(sorted(tiny_fields))}: tiny-gpt sizes do not apply to kind: hf (remove)")
        elif hf_fields:
            raise ValueError(f"{', '.join(sorted(hf_fields))}: apply to kind: hf only (remove, or set kind: hf)")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if self.kind != "synthetic" and self.train_tokens_per_s is not None:
            raise ValueError("train_tokens_per_s applies to kind: synthetic only (remove it, or set kind: synthetic)")
        return self


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
    # Supervised steps on task demonstrations before RL starts ("brief warm start").
    warm_start_steps: Annotated[int, Field(ge=0, le=1_000_000)] = 100
    # Sequences per forward/backward pass (gradients accumulate); None = the whole step's share at once.
    micro_batch_size: Annotated[int, Field(ge=1, le=100_000)] | None = None
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

    def loss_knobs_set(self) -> list[str]:
        """The loss fields that differ from their defaults."""
        fields = type(self).model_fields
        return [k for k in LOSS_KNOBS if getattr(self, k) != fields[k].default]


LOSS_KNOBS = (
    "kl_coef",
    "kl_estimator",
    "clip_ratio_low",
    "clip_ratio_high",
    "entropy_coeff",
    "loss_agg_mode",
    "ppo_mini_batch_size",
    "ppo_epochs",
)


VERIFIER_NAMES = ("exact_match", "math_boxed")


class TaskSpec(Strict):
    """A verifiable task: a built-in string task with an exact-match reward (tiny-gpt), or a JSONL
    prompt dataset (rlboost/trainer/datasets.py) scored by a verifier (rlboost/trainer/verifiers.py), for kind: hf.
    Either kind may instead be scored by the user's own function (rlboost/contracts/rewards.py)."""

    name: Literal["reverse", "copy", "add", "sort", "jsonl"] = "reverse"
    # a built-in verifier, or an import path `module:function` called as
    # function(prompt: str, response: str, row: dict) -> float (rlboost/contracts/rewards.py)
    reward: str = "exact_match"
    min_len: Annotated[int, Field(ge=1, le=64)] = 3
    max_len: Annotated[int, Field(ge=1, le=64)] = 6
    # ---- jsonl only (the name of the dataset task, whatever the file's format) ----
    # a .jsonl file (one JSON object per line), a .parquet file, or a Hugging Face `datasets` directory
    # (save_to_disk; parquet and directories need `pip install 'rlboost[data]'`); relative to the job file
    path: LaxPath | None = None
    split: str | None = None  # a DatasetDict directory's split; None = "train"
    prompt_field: str | None = None  # None: the first of prompt, question, problem
    answer_field: str | None = None  # None: the first of answer, solution (GSM8K '#### x' or \boxed{x})
    # wrap prompts in the tokenizer's chat template: auto = when it has one; on = it must have one
    chat_template: Literal["auto", "on", "off"] = "auto"
    system_prompt: str | None = None
    # appended to every prompt (the usual instruction for math_boxed)
    instruction: str | None = "Please reason step by step, and put your final answer within \\boxed{}."
    # ---- validation (rlboost/trainer/evaluation.py) ----
    # every this many steps (and before the first, and after the last), score one response per held-out
    # problem with the weights just published: pass@1 and mean reward; 0 = off
    eval_every: Annotated[int, Field(ge=0, le=10_000_000)] = 0
    eval_path: LaxPath | None = None  # jsonl: a separate held-out dataset (any format of `path`)
    eval_split: str | None = None  # eval_path a DatasetDict directory: its split; None = "test"
    # jsonl: share of task.path held out (never trained on); None = 0.1 unless eval_path is set
    eval_fraction: Annotated[float, Field(gt=0, lt=1)] | None = None
    eval_size: Annotated[int, Field(ge=1, le=1_000_000)] = 64  # problems per evaluation (at most)
    eval_temperature: Annotated[float, Field(ge=0, le=10)] = 0.0  # 0 = greedy

    @field_validator("chat_template", mode="before")
    @classmethod
    def _chat_template(cls, v: object) -> object:
        # YAML 1.1 reads a bare `on`/`off` (and `true`/`false`) as a boolean
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @field_validator("reward")
    @classmethod
    def _reward(cls, v: str) -> str:
        from rlboost.contracts.rewards import RewardImportError, import_reward, is_import_path

        if v in VERIFIER_NAMES:
            return v
        if not is_import_path(v):
            raise ValueError(
                f"{v!r} is neither a built-in verifier ({', '.join(VERIFIER_NAMES)}) nor an import path "
                "to your own function (module.submodule:function)"
            )
        try:  # imported here, so a bad path is a job-file error before anything launches
            import_reward(v)
        except RewardImportError as e:
            raise ValueError(str(e)) from None
        return v

    @model_validator(mode="after")
    def _lens(self) -> TaskSpec:
        if self.min_len > self.max_len:
            raise ValueError(f"min_len ({self.min_len}) must be <= max_len ({self.max_len})")
        if self.name == "jsonl" and self.path is None:
            raise ValueError("name: jsonl needs path (a .jsonl file of prompts and answers)")
        if self.name != "jsonl" and self.path is not None:
            raise ValueError(f"path applies to name: jsonl only (task {self.name!r} generates its own problems)")
        # as ModelSpec: "set" = differs from the default, so a model_dump() round trip validates
        jsonl_only = ("split", "prompt_field", "answer_field", "chat_template", "system_prompt", "instruction")
        fields = type(self).model_fields
        changed = sorted(k for k in jsonl_only if getattr(self, k) != fields[k].default)
        if self.name != "jsonl" and changed:
            raise ValueError(f"{', '.join(changed)}: apply to name: jsonl only (remove, or set name: jsonl)")
        if self.reward == "math_boxed" and self.name != "jsonl":
            raise ValueError(f"reward math_boxed scores a jsonl dataset; task {self.name!r} uses exact_match")
        if self.eval_path is not None and self.eval_fraction is not None:
            raise ValueError("eval_path and eval_fraction: give one held-out split (a file, or a share of path)")
        if self.eval_split is not None and self.eval_path is None:
            raise ValueError("eval_split: applies to eval_path (a datasets directory); set eval_path or remove it")
        eval_keys = ("eval_path", "eval_fraction", "eval_size", "eval_temperature")
        set_eval = sorted(k for k in eval_keys if getattr(self, k) != fields[k].default)
        if not self.eval_every and set_eval:
            raise ValueError(f"{', '.join(set_eval)}: apply when eval_every > 0 (set eval_every, or remove them)")
        held_out = sorted(k for k in ("eval_path", "eval_fraction") if getattr(self, k) is not None)
        if self.name != "jsonl" and held_out:
            raise ValueError(
                f"{', '.join(held_out)}: apply to name: jsonl only (task {self.name!r} draws its held-out "
                "problems from its own seeded generator; set eval_size instead)"
            )
        return self


def _parse_accelerator(value: str | None) -> str | None:
    if value is None:
        return None
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(:[1-9][0-9]*)?", value):
        from rlboost.contracts.perf import DEFAULT_PERF

        fixed = count_form(value, DEFAULT_PERF)
        hint = f"did you mean {fixed!r}?" if fixed else "e.g. 'A100:8', 'H100', 'cpu'"
        raise ValueError(f"{value!r} is not NAME or NAME:COUNT ({hint})")
    return value


class TrainerSpec(Strict):
    """The reserved, on-demand trainer cluster."""

    cloud: str = "local"
    region: str | None = None
    accelerators: str | None = None
    nodes: Annotated[int, Field(ge=1, le=1024)] = 1
    # Price per node-hour. Defaults to the provider's catalog when omitted.
    hourly_price: Price | None = None
    # Training across the cluster's GPUs/nodes when launched under torchrun (rlboost/trainer/distributed.py):
    # ddp = replicated weights, gradients all-reduced; fsdp = weights, gradients and optimizer sharded.
    strategy: Literal["ddp", "fsdp"] = "ddp"
    # TLS on the trainer's port (self-signed per job, pinned by fingerprint in every worker):
    # auto = on unless the trainer binds a loopback address (local jobs), on, off.
    tls: Literal["auto", "on", "off"] = "auto"
    # Checkpoint (model, optimizer, step, data position, RNG) every N steps; also at the end and on a
    # drain (SIGTERM). 0 = only then.
    checkpoint_every: Annotated[int, Field(ge=0, le=1_000_000)] = 10
    # Where the trainer writes checkpoints. Local provider: the job's run dir (always). Clouds: a path
    # on the trainer node; make it durable (a bucket mounted by SkyPilot) to survive losing the node.
    checkpoint_dir: str | None = None
    # Relaunch a lost trainer (it resumes from its last checkpoint) this many times before failing.
    max_restarts: Annotated[int, Field(ge=0, le=1000)] = 3
    # Host memory for past versions' weight deltas (rlboost/weights/delta_chain.py): a worker that many
    # deltas behind gets the latest as one composed delta; further behind, it pulls in full.
    delta_history_mib: Annotated[int, Field(ge=0, le=1 << 20)] = 512

    _acc = field_validator("accelerators")(classmethod(lambda cls, v: _parse_accelerator(v)))


class SpotCandidate(Strict):
    """One accelerator type to bid for, on any of the listed clouds/regions."""

    accelerator: str
    clouds: list[str] = Field(default_factory=lambda: ["local"])
    regions: list[str] = Field(default_factory=list)
    # Relative generation throughput of one such node (1.0 = the reference accelerator).
    throughput: Annotated[float, Field(gt=0, le=1000)] = 1.0
    spot_price: Price | None = None
    on_demand_price: Price | None = None

    _acc = field_validator("accelerator")(classmethod(lambda cls, v: _parse_accelerator(v)))

    @field_validator("clouds")
    @classmethod
    def _clouds(cls, v: list[str]) -> list[str]:
        bad = [c for c in v if c not in CLOUDS]
        if bad:
            raise ValueError(f"unknown cloud {bad[0]!r} (allowed: {', '.join(CLOUDS)})")
        if not v:
            raise ValueError("list at least one cloud")
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


class LocalSpec(Strict):
    """The embedded local provider: real processes, a replayed spot market."""

    # An availability trace: Bamboo-style `t_ms,add|remove,nodeK` CSV, GCP `date, time, N` lines,
    # or JSON `{"metadata": {"gap_seconds": G}, "data": [n0, n1, ...]}`. None = the built-in trace.
    # `bundled:traces/<file>` names one shipped with the package (rlboost/contracts/data/traces).
    trace: LaxPath | None = None
    # Trace seconds that pass per wall-clock second.
    time_scale: Annotated[float, Field(gt=0, le=100_000)] = 60.0
    # Preemption notice lead time, in wall seconds; 0 = killed without notice.
    notice_seconds: Seconds = 1.0
    # Fraction of preemptions that come with a notice (the rest are abrupt SIGKILLs).
    notice_fraction: Annotated[float, Field(ge=0, le=1)] = 0.5
    # Scale the trace's node counts down to this machine (e.g. 32 nodes -> 3 workers).
    capacity_scale: Annotated[float, Field(gt=0, le=1000)] = 1.0
    # Optional SkyPilot-style catalog CSV for prices (vms.csv columns); `bundled:aws_vms.csv` or
    # `bundled:gcp_vms.csv` names the one shipped with the package.
    catalog: LaxPath | None = None


class PerfSpec(Strict):
    """One accelerator's performance (per GPU); unset fields keep the built-in value (see README)."""

    tokens_per_s: TokenRate | None = None  # decode, aggregate at ref_batch
    seq_tokens_per_s: TokenRate | None = None  # decode, one sequence alone
    prefill_tokens_per_s: TokenRate | None = None
    train_tokens_per_s: TokenRate | None = None
    ref_batch: Annotated[int, Field(ge=1, le=100_000)] | None = None


class SimulateSpec(Strict):
    """`rlboost simulate`: platform timings the replay needs beyond `perf` (defaults: a 7B model on a cloud)."""

    boot_s: Seconds = 120.0  # spot launch -> worker dialled in (before its first pull)
    trainer_boot_s: Seconds | None = None  # trainer launch -> serving (None: boot_s)
    reserved_boot_s: Seconds | None = None  # trainer serving -> its engine dialled in
    pull_s: Seconds = 5.0  # a worker pulls each new weight version
    reserved_pull_s: Seconds = 1.0  # the trainer's own engine reloads weights
    step_overhead_s: Seconds = 2.0  # optimizer step + publish, after the last group
    # trainer serving -> weights version 0 published (the supervised warm start, algorithm.warm_start_steps)
    warm_start_s: Seconds = 0.0
    hours: Hours | None = None  # trace hours (default: the job's steps; see bound_to_trace)
    poll_s: Annotated[float, Field(gt=0, le=3600)] = 0.25  # controller loop period (as `rlboost launch`)
    # an engine that batches statically (torch): from one batch's end to its next batch starting (ends
    # reported, the coordinator's dispatch, the requests received); a calibrated local job measures it
    dispatch_s: Seconds = 0.0
    # the trainer's CPU seconds per response it serves (the dispatch, the streamed tokens, the completion):
    # on shared cores (cpu_cores) one more busy process while the engines generate; a calibrated local
    # job measures it
    serve_s: Seconds = 0.0
    # The job's processes share this many CPU cores (a local job's trainer, engines and workers on one
    # machine: each busy one runs at min(1, cores / busy) of its own rate; a fraction where other work
    # takes part of the machine). None: a node each.
    cpu_cores: Annotated[float, Field(gt=0, le=100_000)] | None = None


class WandbSpec(Strict):
    """A W&B run per job (rlboost/cli/metrics_sinks.py), written by the job's controller."""

    project: Annotated[str, Field(min_length=1)]
    entity: str | None = None  # your W&B user or team; None = your default entity
    # None = online when WANDB_API_KEY is set where the controller runs, else offline (no network:
    # the run is kept on disk for `wandb sync`)
    mode: Literal["online", "offline", "disabled"] | None = None


class LoggingSpec(Strict):
    """Where each step's metrics go besides metrics.jsonl (`pip install 'rlboost[logging]'`)."""

    # a TensorBoard log directory; relative = relative to the job's run directory
    tensorboard: LaxPath | None = None
    wandb: WandbSpec | None = None


class WeightsSpec(Strict):
    """How workers get each weight version (README: Weight transfer)."""

    # auto: a torch.distributed broadcast (rlboost/weights/broadcast.py: NCCL) when every worker is on a
    # GPU in the trainer's network (same cloud and region, or local), else the HTTP pull; http: always
    # the pull; torch: always the broadcast (gloo without GPUs). A worker the broadcast fails pulls.
    transport: Literal["auto", "http", "torch"] = "auto"


class JobSpec(Strict):
    name: str
    provider: Literal["local", "skypilot", "aws", "gcp"] = "local"
    model: ModelSpec = ModelSpec()
    algorithm: AlgorithmSpec = AlgorithmSpec()
    task: TaskSpec = TaskSpec()
    trainer: TrainerSpec = TrainerSpec()
    rollout: RolloutSpec = RolloutSpec()
    local: LocalSpec = LocalSpec()
    budget_usd: Annotated[float, Field(gt=0, le=1e8)] | None = None
    # Finish the job's steps within this many hours of its start at the lowest cost: the fleet grows
    # as the deadline nears (rollout.objective decides while there is slack).
    deadline_hours: Hours | None = None
    # Performance per accelerator name (e.g. A100), for synthetic engines and `rlboost simulate`.
    perf: dict[str, PerfSpec] = Field(default_factory=dict)
    simulate: SimulateSpec = SimulateSpec()
    logging: LoggingSpec = LoggingSpec()
    weights: WeightsSpec = WeightsSpec()
    # Where the job's controller runs: `launcher`, in the `rlboost launch` process (or its background
    # child with -d) on the machine that launched it; `trainer`, on the trainer node, which is up for
    # the job's whole life anyway, reached from the launching machine through an authenticated endpoint.
    # Default: `trainer` for SkyPilot jobs (the node bids with the credentials SkyPilot gives it, as its
    # managed-jobs controller does), `launcher` otherwise.
    controller: Literal["launcher", "trainer"] | None = None
    # Environment variables for the trainer and every worker. A value of null is given at launch
    # (`rlboost launch --env NAME`): such values are secret and never written into the saved job file.
    envs: dict[str, str | None] = Field(default_factory=dict)
    # node path (`~/data`, `/data`) -> a local file or directory (relative to the job file), or a
    # bucket (s3://, gs://; SkyPilot only). SkyPilot mounts/uploads them; the local provider copies.
    file_mounts: dict[str, str] = Field(default_factory=dict)
    # a local directory (relative to the job file) synced to every node and the processes' working
    # directory there; on SkyPilot it takes the place of rlboost's own source checkout
    workdir: str | None = None

    @field_validator("envs")
    @classmethod
    def _env_names(cls, v: dict[str, str | None]) -> dict[str, str | None]:
        for name in v:
            problem = env_name_problem(name)
            if problem:
                raise ValueError(problem)
        return v

    @field_validator("file_mounts")
    @classmethod
    def _mounts(cls, v: dict[str, str]) -> dict[str, str]:
        from rlboost.contracts.mounts import destination_problem

        for dest, source in v.items():
            problem = destination_problem(dest)
            if problem:
                raise ValueError(problem)
            if not source:
                raise ValueError(f"{dest!r}: no source (a local path, s3://BUCKET/... or gs://BUCKET/...)")
            if "://" in source and not source.startswith(("s3://", "gs://")):
                raise ValueError(f"{dest!r}: {source!r} is not a supported bucket (s3://, gs://) nor a local path")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(
                f"{v!r} is not a valid job name (2-40 chars: lowercase letters, digits, '-'; "
                "start with a letter, end with a letter or digit)"
            )
        return v

    @model_validator(mode="after")
    def _coherent(self) -> JobSpec:
        a, m, t = self.algorithm, self.model, self.task
        # prompt = BOS + up to max_len symbols + separator; response = max_new_tokens
        need = t.max_len * (2 if t.name == "add" else 1) + 3 + a.max_new_tokens
        if (m.kind == "hf") != (t.name == "jsonl"):
            raise ValueError(
                f"model.kind is {m.kind!r} but task.name is {t.name!r}: kind: hf trains on a jsonl dataset "
                "(task: {name: jsonl, path: ...}); the built-in string tasks go with tiny-gpt (or synthetic)"
            )
        if self.rollout.engine == "vllm" and m.kind != "hf":
            raise ValueError(
                f"rollout.engine is 'vllm' but model.kind is {m.kind!r}: vLLM runs Hugging Face models "
                "(model: {kind: hf, path: ...}); use engine: torch for tiny-gpt"
            )
        if self.rollout.engine_dtype == "float64" and self.rollout.engine == "vllm":
            raise ValueError("rollout.engine_dtype float64 is a torch-engine option (vLLM: float32, bfloat16, float16)")
        if m.kind == "tiny-gpt" and need > m.block_size:
            raise ValueError(
                f"model.block_size ({m.block_size}) is shorter than the longest prompt + "
                f"algorithm.max_new_tokens ({need}); raise model.block_size or lower max_new_tokens"
            )
        kind = provider_kind(self.provider)
        if kind.runs_here:
            for i, c in enumerate(self.rollout.candidates):
                if c.clouds != ["local"]:
                    raise ValueError(
                        f"rollout.candidates[{i}].clouds is {c.clouds} but provider is 'local' "
                        "(use clouds: [local], or provider: skypilot/aws/gcp)"
                    )
        # the node finds the public address its workers dial from its cloud's metadata service
        node_clouds = kind.trainer_node_clouds
        if self.controller is None:  # frozen model: the resolved default is set once, here
            on_node = self.trainer.cloud in node_clouds
            object.__setattr__(self, "controller", "trainer" if on_node else "launcher")
        if self.controller == "trainer" and kind.trainer_node == "cluster" and self.trainer.cloud not in node_clouds:
            raise ValueError(
                f"controller: trainer with trainer.cloud {self.trainer.cloud!r}: the node learns its public address "
                f"from the metadata service of {' or '.join(node_clouds)} only; use one of those for the trainer "
                "or controller: launcher"
            )
        if self.controller == "trainer" and kind.trainer_node is None:
            raise ValueError(
                f"controller: trainer is not available with provider {self.provider!r}: its trainer node gets no "
                "cloud credentials, so it could not bid for spot workers; use provider: skypilot (which gives "
                "the node the launching machine's credentials, as for its managed-jobs controller) or "
                "controller: launcher with `rlboost launch -d` on a machine that stays up"
            )
        self._check_mounts()
        if self.rollout.max_workers > 0 and not self.rollout.candidates:
            raise ValueError(
                "rollout.max_workers > 0 but rollout.candidates is empty "
                "(list at least one spot candidate, or set max_workers: 0)"
            )
        if not self.rollout.trainer_engine and self.rollout.max_workers == 0:
            raise ValueError(
                "rollout.trainer_engine is false and rollout.max_workers is 0: nothing would generate "
                "(enable the trainer's engine or allow spot workers)"
            )
        if t.eval_every and m.kind == "synthetic":
            raise ValueError("task.eval_every: a synthetic model has nothing to evaluate (set eval_every: 0)")
        knobs = a.loss_knobs_set()
        if m.kind == "synthetic" and knobs:
            raise ValueError(
                f"algorithm.{knobs[0]}: model.kind synthetic has no loss to shape (its trainer only models time); "
                f"remove {', '.join('algorithm.' + k for k in knobs)}"
            )
        if a.ppo_mini_batch_size is not None and a.prompts_per_step % a.ppo_mini_batch_size:
            raise ValueError(
                f"algorithm.ppo_mini_batch_size ({a.ppo_mini_batch_size}) must divide algorithm.prompts_per_step "
                f"({a.prompts_per_step}): every update gets the same number of prompts"
            )
        if a.kl_coef > 0 and self.trainer.strategy == "fsdp":
            raise ValueError(
                "algorithm.kl_coef > 0 needs trainer.strategy: ddp (the KL reference model is not sharded "
                "under fsdp in this version); use ddp or set kl_coef: 0"
            )
        if (self.rollout.engine == "synthetic") != (m.kind == "synthetic"):
            raise ValueError(
                f"rollout.engine is {self.rollout.engine!r} but model.kind is {m.kind!r}: synthetic engines "
                "go with model.kind: synthetic (and only they do); set both or neither"
            )
        self._check_perf()
        return self

    def _check_mounts(self) -> None:
        kind = provider_kind(self.provider)
        if not kind.file_transfer and (self.file_mounts or self.workdir):
            key = "file_mounts" if self.file_mounts else "workdir"
            raise ValueError(
                f"{key}: provider {self.provider!r} has no file transfer; use provider: skypilot (it uploads "
                "local files and mounts s3:// and gs:// buckets), or put the files in the node image"
            )
        if kind.copies_local_files_only:
            for dest, source in self.file_mounts.items():
                if source.startswith(("s3://", "gs://")):
                    raise ValueError(
                        f"file_mounts.{dest}: the local provider copies local files only and cannot fetch "
                        f"{source}; give a local path, or use provider: skypilot"
                    )

    def _check_perf(self) -> None:
        from rlboost.contracts.perf import DEFAULT_PERF

        self._check_perf_models()

        for name, p in self.perf.items():
            base = next((v for k, v in DEFAULT_PERF.items() if k.lower() == name.lower()), None)
            rates = (p.tokens_per_s, p.seq_tokens_per_s, p.prefill_tokens_per_s, p.train_tokens_per_s)
            if base is None and None in rates:
                raise ValueError(
                    f"perf.{name}: no built-in model for this accelerator; set tokens_per_s, seq_tokens_per_s, "
                    f"prefill_tokens_per_s and train_tokens_per_s (built-in: {', '.join(DEFAULT_PERF)})"
                )
            tps = p.tokens_per_s or (base.tokens_per_s if base else 0)
            seq = p.seq_tokens_per_s or (base.seq_tokens_per_s if base else 0)
            if tps < seq:
                raise ValueError(
                    f"perf.{name}: tokens_per_s ({tps:g}, a full batch) is below seq_tokens_per_s ({seq:g}, one "
                    "sequence); a batch cannot be slower than one sequence"
                )

    def _check_perf_models(self) -> None:
        """Accelerators the scheduling models need a performance model for (else a KeyError on the
        trainer node, mid-job): the trainer's (its training rate sizes the offload), and for synthetic
        engines every candidate's (their speed is the model). On a provider that runs here (local) a
        candidate's accelerator is a label like the trainer's, checked by no price catalog when its
        prices are given: it needs a model too (one without turns off every candidate's priors)."""
        from rlboost.contracts.perf import DEFAULT_PERF, split_accelerator

        names = [*DEFAULT_PERF, *self.perf]
        known = {k.lower() for k in names}
        needs: list[tuple[str, str | None]] = []
        if not (self.model.kind == "synthetic" and self.model.train_tokens_per_s is not None):
            needs.append(("trainer.accelerators", self.trainer.accelerators))
        if self.model.kind == "synthetic" or provider_kind(self.provider).runs_here:
            cands = self.rollout.candidates
            needs += [(f"rollout.candidates[{i}].accelerator", c.accelerator) for i, c in enumerate(cands)]
        for field, acc in needs:
            name, _ = split_accelerator(acc)
            if name.lower() in known:
                continue
            perf = f"perf.{name} with tokens_per_s, seq_tokens_per_s, prefill_tokens_per_s and train_tokens_per_s"
            fixed = count_form(name, names) if ":" not in (acc or "") else None
            if fixed is not None:
                base = fixed.partition(":")[0]
                then = f"or add {perf}" if base.lower() in known else f"and add perf.{base}: it has no model either"
                raise ValueError(f"{field}: {acc!r} is not NAME:COUNT; did you mean {fixed!r}? ({then})")
            near = did_you_mean(name, names)
            hint = f"{near} " if near else ""
            raise ValueError(
                f"{field}: no performance model for {name!r} ({hint}built-in: {', '.join(DEFAULT_PERF)}); add {perf}"
            )

    def perf_table(self):
        """The performance table: built-in models with this job's overrides (name -> AcceleratorPerf)."""
        from dataclasses import replace

        from rlboost.contracts.perf import DEFAULT_PERF, AcceleratorPerf

        table = dict(DEFAULT_PERF)
        for name, p in self.perf.items():
            key = next((k for k in table if k.lower() == name.lower()), name)
            over = {k: v for k, v in p.model_dump().items() if v is not None}
            table[key] = replace(table[key], **over) if key in table else AcceleratorPerf(**over)
        return table


class SpecError(Exception):
    """A job file problem, already phrased for the user (one line per problem; lines and their number
    capped, as they quote user input)."""

    def __init__(self, message: str) -> None:
        super().__init__(clip_message(message))


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


# strict mode's type errors, with the fix (YAML quotes make strings; `true` is a bool, not 1)
_STRICT_FIXES = {
    "int_type": "write a whole number, no quotes or decimals, e.g. 10",
    "float_type": "write a number without quotes, e.g. 3e-3 or 0.5",
    "bool_type": "write true or false without quotes",
    "string_type": 'quote it, e.g. "A100:8"',
    "list_type": "write a YAML list: [a, b], or one '- item' per line",
    "dict_type": "write a mapping: one 'key: value' per line, indented under it",
}


# pydantic's error types for a number out of its field's bounds (or not finite)
_RANGE_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number")


def format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors(include_url=False):
        parts = tuple(p for p in e["loc"] if not str(p).startswith("function-"))
        loc = _loc(parts)
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        # an int too large for a float field (10**400) is out of its range, not of the wrong type
        huge = e["type"] == "float_type" and isinstance(got, int) and not isinstance(got, bool)
        if e["type"] == "extra_forbidden":
            msg = unknown_key_hint(JobSpec, parts)
        elif e["type"] == "model_type":  # pydantic's message names the model class
            msg = not_a_mapping(model_at(JobSpec, parts), got)
        elif e["type"] == "literal_error":
            msg = f"invalid value {short_repr(got)}; {msg.lower()}"
        elif e["type"] in _RANGE_ERRORS or huge:
            allowed = numeric_range(model_at(JobSpec, parts[:-1]), str(parts[-1])) if parts else None
            what = "is not a finite number" if e["type"] == "finite_number" else "is out of range"
            msg = f"{short_repr(got)} {what} (allowed: {allowed or msg.removeprefix('Input should be ')})"
        elif e["type"] in _STRICT_FIXES:
            msg = f"{msg} (got {short_repr(got)}, a {type(got).__name__}; {_STRICT_FIXES[e['type']]})"
        lines.append(msg if loc == "(top level)" and _names_a_field(msg) else f"{loc}: {msg}")
    return "\n".join(lines)


def _names_a_field(msg: str) -> bool:
    """A cross-field message that starts with the field at fault (`rollout.max_workers > 0 but …`)
    needs no `(top level):` in front of it."""
    head = re.match(r"[a-z_]+", msg)
    return head is not None and head.group() in JobSpec.model_fields and msg[head.end() : head.end() + 1] in ".[: "


def load_yaml(text: str) -> object:
    """Parse a job file's YAML as YAML 1.2 within rlboost/contracts/job_yaml.py's limits (a size, a depth, a
    number of values with aliases expanded): a SpecError for those and for a duplicate key; a
    yaml.YAMLError for a syntax error."""
    try:
        return job_yaml.load(text)
    except job_yaml.JobYamlError as e:
        raise SpecError(str(e)) from None


_SET_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[0-9]{1,9}\])*")  # an index: no list is longer


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """`--set key.path=value` (value read as a YAML scalar: `3`, `1e-6`, `true`, `A100:8`), applied to the
    parsed file before validation so that a bad value is blamed on its field. Lists by index:
    `rollout.candidates[0].accelerator=H100`."""
    out = copy.deepcopy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(_SET_KEY.fullmatch(p) for p in parts):
            raise SpecError(f"--set {item}: expected KEY.PATH=VALUE (e.g. --set algorithm.steps=10)")
        if len(parts) > job_yaml.MAX_DEPTH:
            raise SpecError(f"--set {key}: more than {job_yaml.MAX_DEPTH} levels deep; no job-file key is")
        try:
            value = load_yaml(text) if text.strip() else None
        except SpecError as e:  # a limit or a duplicate key; a one-line value needs no line number
            raise SpecError(f"--set {key}: {str(e).removeprefix('line 1: ')}") from None
        except yaml.YAMLError as e:
            raise SpecError(f"--set {item}: the value is not a YAML scalar ({_yaml_problem(e)})") from None
        steps: list[str | int] = []
        for p in parts:
            name, *idx = p.replace("]", "").split("[")
            steps += [name, *map(int, idx)]
        _set_path(out, steps, value, item)
    return out


def _with_env_names(raw: dict, names: list[str]) -> dict:
    """The parsed job file with each `--env` name under `envs:` as null (its value is kept apart)."""
    envs = raw.get("envs")
    if envs is None:
        envs = {}
    if not isinstance(envs, dict):
        raise SpecError("envs: must be a mapping of NAME: value (got a list or a scalar)")
    return {**raw, "envs": {**envs, **dict.fromkeys(names)}}


def _set_path(node: object, steps: list[str | int], value: object, item: str) -> None:
    for depth, step in enumerate(steps[:-1]):
        at = _loc(tuple(steps[: depth + 1]))
        if isinstance(step, int):
            if not isinstance(node, list) or step >= len(node):
                raise SpecError(f"--set {item}: {at} is not in the job file (no such list item)")
            node = node[step]
        elif isinstance(node, dict):
            node = node.setdefault(step, {})
            if node is None:
                raise SpecError(f"--set {item}: {at} is empty in the job file")
        else:
            raise SpecError(f"--set {item}: {_loc(tuple(steps[:depth]))} is not a mapping")
    last = steps[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise SpecError(f"--set {item}: {_loc(tuple(steps))} is not in the job file (no such list item)")
        node[last] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise SpecError(f"--set {item}: {_loc(tuple(steps[:-1]))} is not a mapping")


def load_spec(
    path: str | Path, overrides: list[str] | None = None, *, env_names: list[str] | None = None, on_node: bool = False
) -> JobSpec:
    """Read and validate a job file (with `--set` overrides); raise SpecError with user-facing lines.

    `env_names`: `launch --env` names, recorded under `envs:` with a null value (theirs is secret).
    `on_node`: read on the trainer node, where file_mounts' sources are not (their destinations are)."""
    p = Path(path)
    if p.is_dir():
        raise SpecError(f"{p} is a directory; pass a job YAML file")
    if not p.is_file():
        raise SpecError(f"{p}: job file not found (check the path)")
    try:
        raw = load_yaml(job_yaml.read_job_file(p))
    except (SpecError, job_yaml.JobYamlError) as e:
        raise SpecError(f"{p}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{p}: not valid YAML{where} ({_yaml_problem(e)})") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{p}: the job file must be a YAML mapping with at least `name:`")
    if overrides:
        raw = apply_overrides(raw, overrides)
    if env_names:
        raw = _with_env_names(raw, env_names)
    spec = parse_spec(raw, source=str(p) + (" with --set" if overrides else ""))
    return resolve_paths(spec, p.parent, on_node=on_node)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's problem, without the context and the source line it quotes (those can be long)."""
    problem = getattr(e, "problem", None)
    return problem if isinstance(problem, str) else str(e).splitlines()[0]


def parse_spec(raw: dict, source: str = "job") -> JobSpec:
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as e:
        raise SpecError(f"{source}: invalid job file\n{format_validation_error(e)}") from None


def resolve_paths(spec: JobSpec, base: Path, *, on_node: bool = False) -> JobSpec:
    """Make relative paths in the spec relative to the job file, and check that they exist."""
    if not on_node:
        spec = _resolve_mount_sources(spec, base)
    local = spec.local
    updates = {}
    for field in ("trace", "catalog"):
        val = getattr(local, field)
        if val is None:
            continue
        if is_bundled(val):  # shipped with the package: kept by name, so a node reads its own copy
            try:
                bundled_path(val)
            except FileNotFoundError as e:
                raise SpecError(f"local.{field}: {e}; fix the name, or give a file path") from None
            continue
        full = val if val.is_absolute() else (base / val).resolve()
        if not full.is_file():
            raise SpecError(f"local.{field}: file {val} not found (resolved to {full}); fix the path")
        updates[field] = full
    if updates:
        spec = spec.model_copy(update={"local": local.model_copy(update=updates)})
    lens = spec.rollout.synthetic.lengths
    if lens.recorded is not None:
        full = lens.recorded if lens.recorded.is_absolute() else (base / lens.recorded).resolve()
        if not full.is_file():
            raise SpecError(
                f"rollout.synthetic.lengths.recorded: file {lens.recorded} not found (resolved to {full}); fix the path"
            )
        syn = spec.rollout.synthetic.model_copy(update={"lengths": lens.model_copy(update={"recorded": full})})
        spec = spec.model_copy(update={"rollout": spec.rollout.model_copy(update={"synthetic": syn})})
    return _resolve_hf_paths(spec, base, on_node)


def _resolve_mount_sources(spec: JobSpec, base: Path) -> JobSpec:
    """file_mounts' local sources and workdir, relative to the job file, must exist."""
    from rlboost.contracts.mounts import is_bucket

    mounts = {}
    for dest, source in spec.file_mounts.items():
        if is_bucket(source):
            mounts[dest] = source
            continue
        raw = Path(source).expanduser()
        full = raw if raw.is_absolute() else (base / raw).resolve()
        if not full.exists():
            raise SpecError(f"file_mounts.{dest}: {source} not found (resolved to {full}); fix the path")
        mounts[dest] = str(full)
    update: dict[str, object] = {"file_mounts": mounts}
    if spec.workdir is not None:
        raw = Path(spec.workdir).expanduser()
        full = raw if raw.is_absolute() else (base / raw).resolve()
        if not full.is_dir():
            raise SpecError(f"workdir: directory {spec.workdir} not found (resolved to {full}); fix the path")
        update["workdir"] = str(full)
    return spec.model_copy(update=update)


def _check_dataset(full: Path, task: TaskSpec, held_out: bool = False) -> None:
    """A dataset path that exists (task.path, or task.eval_path when `held_out`): a format rlboost reads,
    its split, and the libraries reading it needs (the `data` extra), all before anything launches."""
    from rlboost.contracts import dataset_files as datasets

    key, split_key = ("task.eval_path", "task.eval_split") if held_out else ("task.path", "task.split")
    split = task.eval_split if held_out else task.split
    default_split = datasets.DEFAULT_EVAL_SPLIT if held_out else datasets.DEFAULT_SPLIT

    if full.is_file() and full.suffix.lower() in (".arrow", ".csv", ".tsv"):
        raise SpecError(
            f"{key}: {full.name}: rlboost reads JSON Lines (.jsonl), parquet (.parquet) or a Hugging Face datasets "
            "directory (save_to_disk); convert it, e.g. pandas.read_csv(p).to_parquet(out)"
        )
    fmt = datasets.dataset_format(full)
    if fmt != "hf-dir" and split is not None:
        raise SpecError(f"{split_key}: applies to a Hugging Face datasets directory; {full.name} is {fmt} (remove it)")
    try:
        if fmt == "hf-dir":
            datasets.pick_split(full, split, default_split, split_key)
    except datasets.DatasetError as e:
        msg = str(e)
        raise SpecError(msg if msg.startswith(split_key) else f"{key}: {msg}") from None
    lib = datasets.missing_library(full)
    if lib is not None:
        what = "a Hugging Face datasets directory" if fmt == "hf-dir" else "a parquet file"
        raise SpecError(
            f"{key}: {full.name} is {what}; reading it needs {lib}, which is not installed "
            f"({datasets.INSTALL_HINT}, or give a .jsonl file)"
        )


def _path_in_mount(key: str, raw: str, spec: JobSpec, on_node: bool, check: Callable[[Path], None]) -> Path | None:
    """`key` (task.path, task.eval_path, model.path) written as a node path inside a file_mounts
    destination (`~/data/train.jsonl`): checked with `check` at its local source on the launching
    machine (a bucket cannot be checked), read on the node where the mount put it (the path returned
    there). None when it is an ordinary local path."""
    from rlboost.contracts.mounts import find_mount, node_path, source_path

    hit = find_mount(raw, spec.file_mounts)
    if hit is None:
        return None
    dest = hit[0]
    if on_node:
        full = node_path(raw)
        if not full.exists():
            raise SpecError(f"{key}: {raw} is not on this node ({full}); file_mounts.{dest} should have put it there")
        check(full)
        return full
    local = source_path(raw, spec.file_mounts)
    if local is not None and not local.exists():
        raise SpecError(
            f"{key}: {raw} lies in file_mounts.{dest}, but {local} is not there; fix {key} or the mount's source"
        )
    if local is not None:
        check(local)
    return Path(raw)  # kept as the node path: the node resolves it again


def _check_model_dir(full: Path) -> None:
    if not (full / "config.json").is_file():
        raise SpecError(f"model.path: {full} has no config.json (a Hugging Face model directory is needed)")


def _resolve_dataset(spec: JobSpec, base: Path, on_node: bool, held_out: bool) -> JobSpec:
    """task.path (or task.eval_path when `held_out`) must exist, here or in a mount, in a format rlboost reads."""
    task = spec.task
    key, path = ("task.eval_path", task.eval_path) if held_out else ("task.path", task.path)
    if path is None:
        return spec
    full = _path_in_mount(key, str(path), spec, on_node, lambda p: _check_dataset(p, task, held_out))
    if full is None:
        full = path if path.is_absolute() else (base / path).resolve()
        if not full.exists():
            raise SpecError(f"{key}: file {path} not found (resolved to {full}); fix the path")
        _check_dataset(full, task, held_out)
    field = "eval_path" if held_out else "path"
    return spec.model_copy(update={"task": task.model_copy(update={field: full})})


def _resolve_hf_paths(spec: JobSpec, base: Path, on_node: bool = False) -> JobSpec:
    """task.path and task.eval_path must exist; model.path is a local directory when it looks like a
    path or exists next to the job file, else a hub id (`org/name`, fetched by the trainer and the
    workers). Any of them may lie in a file_mounts destination (`_path_in_mount`)."""
    spec = _resolve_dataset(spec, base, on_node, held_out=False)
    spec = _resolve_dataset(spec, base, on_node, held_out=True)
    model = spec.model
    if model.kind == "hf" and model.path:
        mounted = _path_in_mount("model.path", model.path, spec, on_node, _check_model_dir)
        if mounted is not None:
            return spec.model_copy(update={"model": model.model_copy(update={"path": str(mounted)})})
        raw = Path(model.path).expanduser()
        full = raw if raw.is_absolute() else (base / raw).resolve()
        looks_local = model.path.startswith(("/", "./", "../", "~")) or model.path.count("/") != 1
        if full.is_dir():
            _check_model_dir(full)
            spec = spec.model_copy(update={"model": model.model_copy(update={"path": str(full)})})
        elif looks_local:
            raise SpecError(
                f"model.path: directory {model.path} not found (resolved to {full}); fix the path, "
                "or give a hub id as org/name"
            )
    return spec


def spec_to_yaml(spec: JobSpec) -> str:
    """The saved job file: reads the same with load_yaml (YAML 1.2) and yaml.safe_load (YAML 1.1)."""
    return yaml.dump(spec.model_dump(mode="json"), Dumper=job_yaml.JobFileDumper, sort_keys=False)
