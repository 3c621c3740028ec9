"""Engines a worker can run; built lazily so a synthetic worker never imports torch."""

from __future__ import annotations

from worker.engines.base import Engine, GenRequest


def make_engine(name: str, model: dict, dtype: str, max_batch: int) -> Engine:
    if name in ("torch", "vllm"):
        from rlboost_cli.spec import ModelSpec

        spec = ModelSpec.model_validate(model)
        if dtype == "auto":  # an hf model runs in its own dtype, tiny-gpt in float32
            dtype = spec.dtype if spec.kind == "hf" else "float32"
        if name == "vllm":
            from worker.engines.vllm_engine import VllmEngine

            return VllmEngine(spec, dtype=dtype, max_batch=max_batch)
        from worker.engines.torch_engine import TorchEngine

        return TorchEngine(spec, dtype=dtype, max_batch=max_batch)
    if name == "synthetic":
        from worker.engines.synthetic import engine_from_welcome

        return engine_from_welcome(model, max_batch)
    raise ValueError(f"unknown engine {name!r} (available: torch, vllm, synthetic)")


__all__ = ["Engine", "GenRequest", "make_engine"]
