"""The job file's top level (`JobSpec`): the sections assembled, the job-wide keys, and the rules
between sections."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from rlboost.contracts.env_names import PREFIX
from rlboost.contracts.provider_kinds import DEFAULT_PROVIDER, provider_kind, provider_names
from rlboost.contracts.spec.algorithm import AlgorithmSpec
from rlboost.contracts.spec.base import Hours, Strict
from rlboost.contracts.spec.local import LocalSpec
from rlboost.contracts.spec.model import ModelSpec
from rlboost.contracts.spec.rollout import RolloutSpec
from rlboost.contracts.spec.simulate import PerfSpec, SimulateSpec
from rlboost.contracts.spec.sinks import LoggingSpec, WeightsSpec
from rlboost.contracts.spec.task import TaskSpec
from rlboost.contracts.spec.text_limits import env_size_problem, nul_problem, setup_size_problem
from rlboost.contracts.spec.trainer import TrainerSpec
from rlboost.contracts.spec_hints import count_form, did_you_mean

_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,38}[a-z0-9]$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_name_problem(name: str) -> str | None:
    """Why `name` cannot be a job's environment variable, or None."""
    if not _ENV_NAME_RE.match(name):
        return f"{name!r} is not a valid environment variable name (letters, digits and '_', not starting with a digit)"
    if name.upper().startswith(PREFIX):
        return f"{name!r}: names starting with {PREFIX} are reserved for rlboost's own variables; rename it"
    return None


class JobSpec(Strict):
    name: str
    # a registered provider (rlboost/contracts/provider_kinds.py), validated when the file is read
    provider: str = DEFAULT_PROVIDER
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
    # shell commands run on every cloud node before rlboost starts there (SkyPilot's `setup`), in
    # rlboost's virtual environment and the workdir: install a reward package, dataset tooling. A list
    # runs as one script, line after line; a failing command stops the node. Not secret: it travels in
    # boot data (use `envs` with null values for tokens and read $NAME).
    setup: str | None = None

    @field_validator("provider", mode="before")
    @classmethod
    def _provider(cls, v: object) -> object:
        names = provider_names()
        if isinstance(v, str) and v in names:
            return v
        # worded as pydantic words a Literal's error, which errors.py phrases as "invalid value ..."
        expected = " or ".join(filter(None, [", ".join(map(repr, names[:-1])), repr(names[-1])]))
        raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, v: object) -> object:
        # a NUL ends a path, an argument or a variable in the kernel: refused wherever it is, by field
        problem = nul_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("setup", mode="before")
    @classmethod
    def _setup(cls, v: object) -> object:
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            return "\n".join(v)
        return v

    @field_validator("setup")
    @classmethod
    def _setup_size(cls, v: str | None) -> str | None:
        problem = setup_size_problem(v) if v else None
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("envs")
    @classmethod
    def _env_names(cls, v: dict[str, str | None]) -> dict[str, str | None]:
        for name in v:
            problem = env_name_problem(name)
            if problem:
                raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _env_sizes(self) -> JobSpec:
        problem = env_size_problem(self.envs)  # it names the variable: envs.NAME
        if problem:
            raise ValueError(problem)
        return self

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
        if m.lora is not None and self.rollout.engine == "vllm":
            raise ValueError("model.lora with rollout.engine vllm: not yet (its engine would need the base weights "
                             "and a merge per version); use engine: torch")
        if m.lora is not None and self.trainer.strategy == "fsdp":
            raise ValueError("model.lora with trainer.strategy fsdp: not supported (the adapters are small; "
                             "use strategy: ddp)")
        if self.rollout.engine_dtype == "float64" and self.rollout.engine == "vllm":
            raise ValueError("rollout.engine_dtype float64 is a torch-engine option (vLLM: float32, bfloat16, float16)")
        if m.kind == "tiny-gpt" and need > m.block_size:
            raise ValueError(
                f"model.block_size ({m.block_size}) is shorter than the longest prompt + "
                f"algorithm.max_new_tokens ({need}); raise model.block_size or lower max_new_tokens"
            )
        kind = provider_kind(self.provider)
        if kind.runs_here:  # its candidates are processes here: on its own cloud, and no other
            for i, c in enumerate(self.rollout.candidates):
                if c.clouds != list(kind.clouds):
                    elsewhere = "/".join(n for n in provider_names() if not provider_kind(n).runs_here)
                    raise ValueError(
                        f"rollout.candidates[{i}].clouds is {c.clouds} but provider is {self.provider!r} "
                        f"(use clouds: [{', '.join(kind.clouds)}], or provider: {elsewhere})"
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
                f"algorithm.{knobs[0]}: model.kind synthetic has no loss to shape or optimizer (its trainer only "
                "models time); "
                f"remove {', '.join('algorithm.' + k for k in knobs)}"
            )
        if a.ppo_mini_batch_size is not None and a.prompts_per_step % a.ppo_mini_batch_size:
            raise ValueError(
                f"algorithm.ppo_mini_batch_size ({a.ppo_mini_batch_size}) must divide algorithm.prompts_per_step "
                f"({a.prompts_per_step}): every update gets the same number of prompts"
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
                        f"file_mounts.{dest}: the {self.provider} provider copies local files only and cannot fetch "
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
