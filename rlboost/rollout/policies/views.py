"""Read-only views the policies decide on. The coordinator builds them from live connections and the
rollout book; the simulator builds them from its virtual engines. Nothing here does I/O."""

from __future__ import annotations

from dataclasses import dataclass

from rlboost.contracts.perf import EngineModel


@dataclass
class EngineView:
    id: str
    kind: str  # "reserved" (the trainer cluster's own engine) | "spot" | "on-demand"
    capacity: int
    active: int  # responses assigned to it now
    tokens_per_s: float = 0.0  # measured aggregate decode rate (0: not measured yet)
    model: EngineModel | None = None  # prior from the performance table
    accepting: bool = True  # holds the step's version, not draining, not offloaded

    @property
    def free(self) -> int:
        return self.capacity - self.active

    @property
    def remote(self) -> bool:
        return self.kind != "reserved"

    def seq_time(self, n: int, default: EngineModel | None = None) -> float:
        """Predicted seconds per token of one sequence when n sequences run here.

        A measurement at the current load wins; the model's shape carries it to another load."""
        model = self.model or default
        if self.tokens_per_s > 0 and self.active > 0:
            measured = self.active / self.tokens_per_s
            if model is None:
                return measured
            return measured * model.step_time(max(n, 1)) / model.step_time(self.active)
        if model is not None:
            return model.step_time(max(n, 1))
        return 1.0

    def prefill_s(self, tokens: int, default: EngineModel | None = None) -> float:
        model = self.model or default
        return model.prefill_time(tokens) if model is not None else 0.0


@dataclass
class ReqView:
    rid: str
    generated: int  # tokens already held (the prefix a new engine re-prefills)
    budget_left: int
    prompt_len: int
    expected_left: float  # predicted tokens still to generate
    engine: str | None = None
    since_dispatch_s: float = 0.0  # how long it has been on its current engine

    @property
    def context(self) -> int:
        return self.prompt_len + self.generated
