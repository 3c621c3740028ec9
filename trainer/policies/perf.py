"""Performance models per accelerator: how fast an engine decodes and prefills, how fast a trainer trains.

Used by the synthetic engine (to emit tokens at a modelled rate), by the simulator (to replay a job on
a virtual clock) and by policies as a prior before anything was measured.

Decode model (continuous batching): one decode step of a batch of n sequences takes
    step_time(n) = 1/seq_tokens_per_s + slope * (n - 1)
so a lone sequence runs at seq_tokens_per_s and a batch of `ref_batch` yields tokens_per_s in total.
A node with k GPUs is k such engines behind one connection (n spread evenly over them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class AcceleratorPerf:
    """One GPU (or CPU) of one kind, for a given model size (the defaults: a ~7B model in bf16)."""

    tokens_per_s: float  # aggregate decode tokens/s at a batch of ref_batch
    seq_tokens_per_s: float  # decode tokens/s of one sequence alone
    prefill_tokens_per_s: float  # prompt (+ migrated prefix) tokens/s
    train_tokens_per_s: float  # GRPO training tokens/s (forward + backward + logprob recompute)
    ref_batch: int = 256


# Rough public figures for a 7B model (vLLM-class decode, bf16 training at ~35-40% MFU). They set
# ratios between accelerators more than absolute numbers; override them under `perf:` in the job file.
DEFAULT_PERF: dict[str, AcceleratorPerf] = {
    "H100": AcceleratorPerf(4500, 130, 30000, 6000),
    "H200": AcceleratorPerf(5500, 150, 32000, 6500),
    "A100": AcceleratorPerf(2500, 80, 15000, 2500),
    "A100-80GB": AcceleratorPerf(2700, 85, 15000, 2600),
    "L40S": AcceleratorPerf(1600, 60, 9000, 1400),
    "A10G": AcceleratorPerf(700, 35, 4000, 600),
    "L4": AcceleratorPerf(600, 30, 3500, 500),
    "V100": AcceleratorPerf(900, 45, 5000, 900),
    "T4": AcceleratorPerf(300, 20, 1500, 250),
    "cpu": AcceleratorPerf(40, 10, 400, 40, ref_batch=64),
}


def split_accelerator(acc: str | None) -> tuple[str, int]:
    """'A100:8' -> ('A100', 8); None -> ('cpu', 1)."""
    if not acc:
        return "cpu", 1
    name, _, n = acc.partition(":")
    return name, int(n) if n else 1


def lookup_perf(name: str, table: dict[str, AcceleratorPerf]) -> AcceleratorPerf | None:
    for src in (table, DEFAULT_PERF):
        for k, v in src.items():
            if k.lower() == name.lower():
                return v
    return None


@dataclass(frozen=True)
class EngineModel:
    """A whole engine (one node): `replicas` GPUs of one kind, `max_batch` sequences per GPU."""

    tokens_per_s: float
    seq_tokens_per_s: float
    prefill_tokens_per_s: float
    ref_batch: int = 256
    max_batch: int = 256
    replicas: int = 1
    speed: float = 1.0  # multiplies every rate (e.g. a candidate's relative throughput)

    def __post_init__(self) -> None:
        if min(self.tokens_per_s, self.seq_tokens_per_s, self.prefill_tokens_per_s, self.speed) <= 0:
            raise ValueError("engine rates and speed must be > 0")
        if self.ref_batch < 1 or self.max_batch < 1 or self.replicas < 1:
            raise ValueError("ref_batch, max_batch and replicas must be >= 1")
        # step_time(n) is on every scheduling path: precompute its two coefficients
        t1 = 1.0 / self.seq_tokens_per_s
        # a batch can never be slower per step than running its sequences one by one
        slope = (
            max(0.0, (self.ref_batch / self.tokens_per_s - t1) / (self.ref_batch - 1)) if self.ref_batch > 1 else 0.0
        )
        object.__setattr__(self, "_t1", t1)
        object.__setattr__(self, "_slope", slope)

    @classmethod
    def for_accelerator(
        cls, perf: AcceleratorPerf, count: int = 1, max_batch: int = 256, speed: float = 1.0
    ) -> EngineModel:
        return cls(
            perf.tokens_per_s, perf.seq_tokens_per_s, perf.prefill_tokens_per_s, perf.ref_batch, max_batch, count, speed
        )

    @property
    def capacity(self) -> int:
        return self.max_batch * self.replicas

    def step_time(self, n: int | float) -> float:
        """Seconds per decode step with n live sequences on this node."""
        per_gpu = n / self.replicas
        if per_gpu < 1.0:
            per_gpu = 1.0
        return (self._t1 + self._slope * (per_gpu - 1.0)) / self.speed

    def rate(self, n: int | float) -> float:
        """Aggregate tokens/s with n live sequences."""
        return 0.0 if n <= 0 else n / self.step_time(n)

    def full_rate(self) -> float:
        return self.rate(self.capacity)

    def prefill_time(self, tokens: int) -> float:
        return tokens / (self.prefill_tokens_per_s * self.replicas * self.speed)

    def scaled(self, speed: float) -> EngineModel:
        return replace(self, speed=self.speed * speed)


def engine_model(
    accelerator: str | None, table: dict[str, AcceleratorPerf], max_batch: int, nodes: int = 1, speed: float = 1.0
) -> EngineModel:
    name, count = split_accelerator(accelerator)
    perf = lookup_perf(name, table)
    if perf is None:
        raise KeyError(f"no performance model for accelerator {name!r}")
    return EngineModel.for_accelerator(perf, count * nodes, max_batch, speed)


def train_rate(accelerator: str | None, table: dict[str, AcceleratorPerf], nodes: int = 1) -> float:
    """Training tokens/s of a trainer cluster."""
    name, count = split_accelerator(accelerator)
    perf = lookup_perf(name, table)
    if perf is None:
        raise KeyError(f"no performance model for accelerator {name!r}")
    return perf.train_tokens_per_s * count * nodes
