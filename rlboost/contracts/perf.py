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


# Per-GPU figures for a 7-8B dense model in bf16 (Llama-3/3.1-8B, Mistral-7B, Qwen3-8B class). H100 and
# A100 are calibrated from the public measurements cited beside each number; the other rows are rough
# ratios to those (override any of them under `perf:` in the job file). Nothing here is fitted to the
# RLBoost paper's throughput figures that BENCHMARKS.md checks the simulator against.
#
# H100 (80 GB SXM):
#   tokens_per_s 8088: vLLM v0.6.0, Llama-3.1-8B, 1xH100, max-num-seqs 256, num-scheduler-steps 10,
#     5000 ShareGPT prompts at rps=inf: 8,088.35 output tok/s (Lambda Labs, "LLMs inference benchmarks,
#     using vLLM", github.com/LambdaLabsML/vllm-benchmark benchmark_v0.md). Measured at max-seq-len 2048:
#     at RL-length contexts the KV-cache reads lower it (not modelled; see BENCHMARKS.md).
#   seq_tokens_per_s 133: vLLM, Meta-Llama-3-8B-Instruct, 1xH100, 10 concurrent requests: median TPOT
#     7.50 ms (Lambda Labs vllm-benchmark results/prompt_10/1xH100-80GB-SXM/..._tp1_len8192.json).
#   prefill_tokens_per_s 22000: same run, 1,369 prompt tokens prefilled with a 62 ms mean TTFT
#     (a lower bound: a small prefill batch).
#   train_tokens_per_s 5762: torchtitan, Llama-3.1-8B, 8xH100, FSDP, bf16, selective activation
#     checkpointing, no torch.compile: 5,762 tokens/s/GPU, 33-39% MFU (pytorch/torchtitan
#     docs/performance.md, Table 1; 96 GB H100 at the default 500 W). 6*N*tokens at that rate is
#     6 * 8.03e9 * 5762 = 278 TFLOP/s = 28% of the 989 TFLOP/s bf16 dense peak (the 33-39% counts
#     attention FLOPs at 8k context).
# A100 (40 GB) / A100-80GB (SXM):
#   tokens_per_s 3926: H100's 8,088 / 2.06, the H100:A100-80GB output-throughput ratio Lambda Labs
#     measured for Mistral-7B-Instruct-v0.3 bf16 on one GPU (3,281 vs 1,591 tok/s, same report).
#   seq_tokens_per_s 75 (A100 40 GB): vLLM 0.23.0, Llama-3.1-8B-Instruct bf16, concurrency 1: "about 75
#     tokens/sec, roughly 77% of the memory-bandwidth ceiling" (johnmusgrave.com, "vLLM throughput-latency
#     sweep on NVIDIA A100"); A100-80GB: 75 * 2.039 / 1.555 TB/s = 98 (HBM bandwidth ratio).
#   prefill_tokens_per_s: the H100 figure / 2.06 (the same ratio).
#   train_tokens_per_s 2876: torchtitan, Llama-3-8B, 64xA100-80GB, FSDP2, selective layer AC: 2,876
#     WPS/GPU, 56.3% MFU (pytorch/torchtitan docs/performance.md, earlier revision). Used for both A100s.
DEFAULT_PERF: dict[str, AcceleratorPerf] = {
    "H100": AcceleratorPerf(8088, 133, 22000, 5762),
    "H200": AcceleratorPerf(9900, 160, 24000, 6300),  # rough: H100 scaled by HBM bandwidth (4.8/3.35), capped
    "A100": AcceleratorPerf(3926, 75, 10700, 2876),
    "A100-80GB": AcceleratorPerf(3926, 98, 10700, 2876),
    "L40S": AcceleratorPerf(1600, 60, 9000, 1400),
    "A10G": AcceleratorPerf(700, 35, 4000, 600),
    "L4": AcceleratorPerf(600, 30, 3500, 500),
    "V100": AcceleratorPerf(900, 45, 5000, 900),
    "T4": AcceleratorPerf(300, 20, 1500, 250),
    "cpu": AcceleratorPerf(40, 10, 400, 40, ref_batch=64),
}


@dataclass(frozen=True)
class SyncStepCosts:
    """What a synchronous colocated RL step (veRL / TRL with vLLM on the training GPUs) pays beyond
    generating and training, for a 7-9B model on 8 GPUs (public measurements; the `sync` simulator
    baseline uses them).

    forward_passes 2: veRL recomputes the old-policy logprobs with the actor (always, with the hybrid
      engine: verl-project/verl#51) and computes reference logprobs for the KL loss (use_kl_loss=True in
      its GRPO examples). Each is a forward pass, 2*N FLOPs per token against training's 6*N: charged
      at 1/3 of the training time per token each, i.e. at training's MFU. That favours the baseline:
      verl-project/verl#7203 (Qwen3.5-9B, 8xH800) measured old_log_prob 84 s and ref 82 s against
      update_actor 91 s.
    weight_sync_s 3.5: update_weights ~3.5 s per step, Megatron -> SGLang, Qwen3.5-9B, 8xH800
      (verl-project/verl#7203).
    wake_s 0.29: vLLM sleep mode's 0.29 s to wake weights + KV cache (huggingface/trl#4086 logs, GRPO
      colocate mode). Freeing the KV cache (51.57 GiB) before the optimizer step "took 1.30-1.60 seconds
      to fall asleep" there; both policies pay that in `simulate.step_overhead_s`, so it is not here.
    """

    forward_passes: int = 2
    weight_sync_s: float = 3.5
    wake_s: float = 0.29

    def forward_s(self, tokens: float, train_tokens_per_s: float) -> float:
        """Seconds of the old-logprob (+ ref) forward passes over `tokens` (forward = 1/3 of training)."""
        return self.forward_passes * tokens / (3.0 * train_tokens_per_s)


SYNC_COSTS = SyncStepCosts()


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

    def pass_time(self, tokens: int | float, live: int) -> float:
        """Seconds of one forward pass over `tokens` tokens of `live` sequences (a speculative
        verification pass: each sequence's last token and its drafted ones), costed as a decode step of
        that many sequences (an upper bound: contracts/speculation_perf.py says why). A sequence's tokens
        stay on one GPU: with fewer sequences than replicas each busy GPU runs tokens / live of them.
        With one token per sequence it is step_time(live)."""
        live = max(1, live)
        return self.step_time(tokens * max(live, self.replicas) / live)

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
