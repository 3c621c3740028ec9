"""Hugging Face causal LMs (`model: {kind: hf, path: ...}`) for the learner and the torch engine.

Any local directory (config.json + *.safetensors + tokenizer files) or hub id that
`AutoModelForCausalLM` loads. The learner loads the pretrained weights; engines build the same
architecture from the config alone and receive every weight version from the trainer, so a spot
worker needs only the config and tokenizer (the weights it pulls are the ones that are trained).
With `model.lora` (rlboost/models/lora.py) the engine loads the pretrained weights too: versions carry
only the adapters, merged into them.

Weight names are the model's own `named_parameters()` names (checkpoint names, e.g.
`model.layers.0.self_attn.q_proj.weight`; a tied `lm_head.weight` is left out), which is what
vLLM's `load_weights` accepts too.

`forward` gives an HF model TinyGPT's calling convention (left padding, explicit positions, a key
mask over cached + new tokens, an optional KV cache), so the learner and the torch engine drive both
model kinds with the same code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rlboost.contracts.spec import ModelSpec

TORCH_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
DEFAULT_MAX_MODEL_LEN = 4096


def _transformers():
    try:
        import transformers
    except ImportError as e:  # a clear message instead of a bare ModuleNotFoundError deep in a worker
        raise ImportError("model kind 'hf' needs transformers: pip install 'rlboost[hf]'") from e
    return transformers


def load_tokenizer(spec: ModelSpec) -> Any:
    assert spec.path is not None
    return _transformers().AutoTokenizer.from_pretrained(spec.path, trust_remote_code=spec.trust_remote_code)


def load_config(spec: ModelSpec) -> Any:
    assert spec.path is not None
    return _transformers().AutoConfig.from_pretrained(spec.path, trust_remote_code=spec.trust_remote_code)


def eos_token_id(tokenizer: Any) -> int:
    """The one id that ends a response (a chat model's end-of-turn token is its tokenizer's eos).

    One id, because the coordinator's rollout book recognises a finished response by its last token."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer defines no eos_token; set one in tokenizer_config.json")
    return int(eos)


def max_model_len(spec: ModelSpec, config: Any | None = None) -> int:
    if spec.max_model_len is not None:
        return spec.max_model_len
    config = config if config is not None else load_config(spec)
    return min(int(getattr(config, "max_position_embeddings", DEFAULT_MAX_MODEL_LEN)), DEFAULT_MAX_MODEL_LEN)


def from_pretrained(spec: ModelSpec, dtype: torch.dtype, device: torch.device | str = "cpu") -> nn.Module:
    """The pretrained model (the learner's starting point), in `dtype` on `device`."""
    tf = _transformers()
    model = tf.AutoModelForCausalLM.from_pretrained(
        spec.path, dtype=dtype, trust_remote_code=spec.trust_remote_code, attn_implementation="sdpa"
    )
    return _finish(model, device)


def from_config(spec: ModelSpec, dtype: torch.dtype, device: torch.device | str = "cpu", seed: int = 0) -> nn.Module:
    """The architecture with a seeded random init: an engine's body before its first weight load."""
    tf = _transformers()
    config = load_config(spec)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = tf.AutoModelForCausalLM.from_config(
            config, dtype=dtype, trust_remote_code=spec.trust_remote_code, attn_implementation="sdpa"
        )
    return _finish(model, device)


def _finish(model: nn.Module, device: torch.device | str) -> nn.Module:
    model.to(device)
    model.config.use_cache = False  # the learner never caches; the engine asks for a cache explicitly
    return model


def forward(
    model: nn.Module,
    idx: Tensor,
    positions: Tensor,
    attn_mask: Tensor,
    past: Any | None = None,
    use_cache: bool = False,
    last_only: bool | int = False,
) -> tuple[Tensor, Any]:
    """TinyGPT's convention over an HF model: returns (logits [B, T or last_only, V], cache or None).
    last_only: True or n keeps the logits of the last n positions (the engine verifying n - 1 drafted
    tokens needs all n), False every position's."""
    if use_cache and past is None:
        from transformers import DynamicCache

        past = DynamicCache()
    kwargs: dict[str, Any] = {}
    if last_only:
        kwargs["logits_to_keep"] = int(last_only)  # prefill of a long prompt needs only the last row's logits
    out = model(
        input_ids=idx,
        attention_mask=attn_mask.long(),
        position_ids=positions,
        past_key_values=past,
        use_cache=use_cache,
        **kwargs,
    )
    return out.logits, out.past_key_values if use_cache else None


def save_pretrained(model: nn.Module, tokenizer: Any, out_dir: Path | str) -> None:
    """A checkpoint any HF tool (or `model: {kind: hf, path: out_dir}`) can load."""
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
