"""The job file's `model:` section."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from rlboost.contracts.spec.base import Strict, TokenRate


class LoraSpec(Strict):
    """LoRA adapters on an hf model (rlboost/models/lora.py, through peft): only the adapters train, and
    only they are published; engines keep the base weights and merge W = W_base + alpha/rank * B @ A."""

    rank: Annotated[int, Field(ge=1, le=4096)]
    # None = 2 * rank (a common choice; peft's own default is 8 whatever the rank)
    alpha: Annotated[float, Field(gt=0, le=1e6)] | None = None
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    # module names (suffixes, as peft matches them: q_proj, v_proj, ...) or "all-linear" (every linear
    # layer but the output head; veRL's default)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"

    @model_validator(mode="after")
    def _targets(self) -> LoraSpec:
        t = self.target_modules
        if isinstance(t, list) and (not t or not all(t)):
            raise ValueError("target_modules: list module names such as [q_proj, v_proj], or write all-linear")
        return self

    @property
    def scale(self) -> float:
        """alpha / rank: the factor of B @ A in the merged weight."""
        return (self.alpha if self.alpha is not None else 2.0 * self.rank) / self.rank


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
    # LoRA adapters instead of full fine-tuning (None: every weight trains)
    lora: LoraSpec | None = None

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSpec:
        # "set" = differs from the default, so a model_dump() round trip (the worker's welcome) validates
        changed = {k for k, f in type(self).model_fields.items() if getattr(self, k) != f.default}
        tiny_fields = {"n_layer", "n_head", "n_embd", "block_size"} & changed
        hf_fields = {"path", "dtype", "max_model_len", "trust_remote_code", "lora"} & changed
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
