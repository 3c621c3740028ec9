"""Engines a worker can run; built lazily so a synthetic worker never imports torch."""

from __future__ import annotations

from worker.engines.base import Engine, GenRequest


def make_engine(name: str, model: dict, dtype: str, max_batch: int) -> Engine:
    if name == "torch":
        from rlboost_cli.spec import ModelSpec
        from worker.engines.torch_engine import TorchEngine

        return TorchEngine(ModelSpec.model_validate(model), dtype=dtype, max_batch=max_batch)
    if name == "synthetic":
        from worker.engines.synthetic import SyntheticEngine, model_from_welcome

        return SyntheticEngine(*model_from_welcome(model, max_batch))
    raise ValueError(f"unknown engine {name!r} (available: torch, synthetic)")


__all__ = ["Engine", "GenRequest", "make_engine"]
