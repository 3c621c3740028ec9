"""Engines a worker can run; built lazily so a synthetic worker never imports torch."""

from __future__ import annotations

import logging

from rlboost.contracts.engine import Engine, GenRequest

log = logging.getLogger(__name__)


def model_on_this_node(model: dict) -> dict:
    """The welcome's model with model.path where this node has it: a path in a file_mounts destination
    is this node's own copy of the mount."""
    from rlboost.contracts.mounts import node_path
    from rlboost.contracts.protocol import MOUNTED_PATH_KEY

    out = dict(model)
    if not out.pop(MOUNTED_PATH_KEY, False):
        return out
    full = node_path(out["path"])
    if not full.is_dir():
        raise ValueError(
            f"model.path: {out['path']} is not on this node ({full}); its file_mounts entry should put it there"
        )
    log.info("model.path %s: this node's copy at %s", out["path"], full)
    out["path"] = str(full)
    return out


def make_engine(name: str, model: dict, dtype: str, max_batch: int, speculative: dict | None = None) -> Engine:
    """The worker's engine; `speculative`: rollout.speculative (method, max_tokens), None for none."""
    if name in ("torch", "vllm"):
        from rlboost.contracts.spec import ModelSpec, SpeculativeSpec

        spec = ModelSpec.model_validate(model_on_this_node(model))
        drafting = SpeculativeSpec.model_validate(speculative or {})
        if dtype == "auto":  # an hf model runs in its own dtype, tiny-gpt in float32
            dtype = spec.dtype if spec.kind == "hf" else "float32"
        if name == "vllm":
            from rlboost.worker.engines.vllm_engine import VllmEngine

            return VllmEngine(spec, dtype=dtype, max_batch=max_batch, speculative=drafting)
        from rlboost.models.torch_engine import TorchEngine

        return TorchEngine(spec, dtype=dtype, max_batch=max_batch, speculative=drafting)
    if name == "synthetic":
        from rlboost.worker.engines.synthetic import engine_from_welcome

        return engine_from_welcome(model, max_batch)
    raise ValueError(f"unknown engine {name!r} (available: torch, vllm, synthetic)")


__all__ = ["Engine", "GenRequest", "make_engine"]
