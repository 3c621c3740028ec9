"""Adaptive offload: how long the reserved (trainer) cluster generates before it goes back to training.

Each step, the trainer cluster's engines generate with everyone else; when the policy says so, they
abort, their partial responses continue on remote (spot) engines, and the trainer trains on finished
groups while the remotes finish the tail. Two idle times measure the balance:

    T_b  trainer idle: after the switch, time the trainer waits for finished groups to train on
    R_b  remote idle:  step time - generation time (remotes wait for the next weights)

Policies (pure; the coordinator and the simulator feed them the same numbers):

- `none`       never offload (the trainer's engines generate until the step's last response).
- `rlboost`    RLBoost's published rule: a time box b adjusted after each step, shrink by
               (R_b - T_b)/3 when T_b < R_b, else grow by (T_b - R_b)/3, floor 5 s, and remember the
               best box per number of remote workers (resumed when that number comes back).
- `predictive` rlboost's own: decide online, during the step, from measured rates. Switch at the
               first moment the remotes alone are predicted to finish the remaining tokens
               (E[remaining | generated so far] from the learned length distribution; the aggregate
               remote rate and, for the tail, the per-sequence rate) no later than the trainer would
               finish training the whole step. That equalises both sides' finish times for this very
               step, reacts to workers joining or leaving mid-step, and needs no warm-up. Where the
               engines speculate, the remotes' tail is timed with their own drafting rule at the
               acceptance they measure (pool_finish_s), since drafting speeds up exactly that tail.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from rlboost.contracts.perf import EngineModel
from rlboost.contracts.speculation import draft_length, expected_yield
from rlboost.rollout.policies.lengths import LengthStats
from rlboost.rollout.policies.views import EngineView


@dataclass(frozen=True)
class Drafting:
    """How the pool's engines speculate (rollout.speculative): the per-token acceptance of their drafts,
    as measured from the drafted and accepted tokens they report, and the most tokens drafted per pass."""

    accept: float
    max_tokens: int


@dataclass(frozen=True)
class StepProgress:
    """What the coordinator knows mid-step (seconds and tokens)."""

    elapsed: float
    remote_engines: int  # ready remote engines holding the step's version
    remote_rate: float  # their aggregate decode tokens/s when full
    remote_seq_rate: float  # tokens/s of one sequence on a lightly loaded remote engine
    remaining_tokens: float  # expected tokens still to generate, all unfinished responses
    max_remaining: float  # expected remaining tokens of the longest unfinished response
    total_tokens: float  # expected tokens of the whole step (held + remaining)
    unfinished: int
    # a plausible draw of each unfinished response's remaining tokens (LengthStats.sample_remaining)
    remaining_sample: np.ndarray | None = None
    remote_models: tuple[EngineModel, ...] = ()  # models of the ready remote engines (when known)
    handoff_prefill_s: float = 0.0  # re-prefill of the reserved engine's partial responses, remotely
    reserved_rate: float = 0.0  # the reserved engine's decode tokens/s now
    drafting: Drafting | None = None  # the engines speculate (None: plain decoding)


@dataclass(frozen=True)
class StepOutcome:
    n_remote: int  # remote engines at the step's start
    step_s: float  # step start -> next weights published
    gen_s: float  # step start -> last response finished
    box_s: float | None  # step start -> offload (None: never offloaded)
    trainer_idle_s: float  # T_b
    train_tokens: int = 0
    train_busy_s: float = 0.0  # time the trainer spent training (for the rate estimate)

    @property
    def remote_idle_s(self) -> float:  # R_b
        return max(0.0, self.step_s - self.gen_s)

    @classmethod
    def from_marks(
        cls,
        n_remote: int,
        t0: float,
        now: float,
        gen_end: float,
        offload_at: float | None,
        busy_during_tail_s: float,
        train_tokens: int,
        train_busy_s: float,
    ) -> StepOutcome:
        """From one clock's marks of a step (the live coordinator and the simulator alike)."""
        return cls(
            n_remote=n_remote,
            step_s=now - t0,
            gen_s=gen_end - t0,
            box_s=None if offload_at is None else offload_at - t0,
            trainer_idle_s=trainer_idle(offload_at, gen_end, busy_during_tail_s),
            train_tokens=train_tokens,
            train_busy_s=train_busy_s,
        )


class OffloadPolicy(Protocol):
    name: str

    def start_step(self, n_remote: int) -> float | None:
        """The planned box for this step (None: no box planned)."""

    def should_offload(self, p: StepProgress) -> bool:
        """Called periodically until it says yes (or the step's generation ends)."""

    def next_check_s(self, p: StepProgress) -> float:
        """How long the answer cannot turn to yes (callers may skip checks until then)."""

    def end_step(self, o: StepOutcome) -> None:
        """Learn from the finished step."""


class NoOffload:
    name = "none"

    def start_step(self, n_remote: int) -> float | None:
        return None

    def should_offload(self, p: StepProgress) -> bool:
        return False

    def next_check_s(self, p: StepProgress) -> float:
        return float("inf")

    def end_step(self, o: StepOutcome) -> None:
        pass


@dataclass
class RLBoostOffload:
    """The published rule (see module docstring). The first step for a worker count runs unboxed and
    measures the generation time, which becomes the first box."""

    min_box_s: float = 5.0
    name: str = "rlboost"
    box: float | None = None
    current: dict[int, float] = field(default_factory=dict)  # box being tuned, per remote count
    best: dict[int, tuple[float, float]] = field(default_factory=dict)  # n -> (step time, box)
    _n: int = 0

    def start_step(self, n_remote: int) -> float | None:
        if n_remote != self._n or self.box is None:
            # worker count changed: resume from the best box seen with this many workers
            if n_remote in self.best:
                self.box = self.best[n_remote][1]
            elif n_remote in self.current:
                self.box = self.current[n_remote]
        self._n = n_remote
        return self.box if n_remote > 0 else None

    def should_offload(self, p: StepProgress) -> bool:
        return p.remote_engines > 0 and self.box is not None and p.elapsed >= self.box

    def next_check_s(self, p: StepProgress) -> float:
        return float("inf") if self.box is None else max(0.0, self.box - p.elapsed)

    def end_step(self, o: StepOutcome) -> None:
        if o.n_remote <= 0:
            return
        box = o.box_s if o.box_s is not None else o.gen_s
        t_b, r_b = o.trainer_idle_s, o.remote_idle_s
        if t_b < r_b:
            box -= (r_b - t_b) / 3.0
        else:
            box += (t_b - r_b) / 3.0
        self.box = max(self.min_box_s, box)
        self.current[o.n_remote] = self.box
        used = o.box_s if o.box_s is not None else o.gen_s
        prev = self.best.get(o.n_remote)
        if prev is None or o.step_s < prev[0]:
            self.best[o.n_remote] = (o.step_s, max(self.min_box_s, used))


@dataclass
class PredictiveOffload:
    """Switch when the remotes alone finish no later than the trainer's training would (module doc).

    train_tokens_per_s: prior for the trainer's training rate (replaced by measurement after a step).
    overhead_s: the step's fixed cost after the last group (optimizer step, publish).
    overlap: whether the trainer can train on finished groups while the tail generates. Without
    overlap (train only after the last response) offloading cannot shorten a step: never switch.
    """

    train_tokens_per_s: float
    overhead_s: float = 0.0
    overlap: bool = True
    margin: float = 0.0  # fraction: switch a little later (>0) or earlier (<0) than the balance point
    name: str = "predictive"
    _rate_samples: list[float] = field(default_factory=list)

    def start_step(self, n_remote: int) -> float | None:
        return None  # decided online

    def remote_finish_s(self, p: StepProgress) -> float:
        if p.remote_rate <= 0:
            return float("inf")
        if p.remaining_sample is not None and p.remote_models:
            return pool_finish_s(p.remaining_sample, p.remote_models, p.drafting) + p.handoff_prefill_s
        tail = p.max_remaining / p.remote_seq_rate if p.remote_seq_rate > 0 else 0.0
        return max(p.remaining_tokens / p.remote_rate, tail)

    def trainer_finish_s(self, p: StepProgress) -> float:
        return p.total_tokens / self.train_tokens_per_s

    def should_offload(self, p: StepProgress) -> bool:
        if not self.overlap or p.remote_engines <= 0 or p.unfinished <= 0:
            return False
        return self.remote_finish_s(p) <= self.trainer_finish_s(p) * (1.0 + self.margin)

    def next_check_s(self, p: StepProgress) -> float:
        """The gap between the two finish times closes at most at 1 + reserved/remote rate per second
        (the remotes work down their share; the reserved engine removes work they would have done);
        half of that bound leaves room for length predictions that grow as responses do."""
        if not self.overlap or p.unfinished <= 0:
            return float("inf")
        if p.remote_engines <= 0:
            return 0.0  # re-check as soon as any remote engine is ready
        gap = self.remote_finish_s(p) - self.trainer_finish_s(p) * (1.0 + self.margin)
        if gap <= 0:
            return 0.0
        return 0.5 * gap / (1.0 + p.reserved_rate / max(p.remote_rate, 1e-9))

    def end_step(self, o: StepOutcome) -> None:
        if o.train_busy_s > 0 and o.train_tokens > 0:
            self._rate_samples.append(o.train_tokens / o.train_busy_s)
            del self._rate_samples[:-5]
            self.train_tokens_per_s = sorted(self._rate_samples)[len(self._rate_samples) // 2]


def pool_finish_s(remaining: np.ndarray, models: Sequence[EngineModel], drafting: Drafting | None = None) -> float:
    """Seconds for a pool of engines to generate `remaining` tokens per sequence, all starting now,
    with continuous batching and the load kept balanced (tail migration): while k sequences are left,
    each advances one token per step_time(k spread over the pool's GPUs). Exact for a fluid pool:
        T = sum_k (r_(k) - r_(k+1)) * step_time(k)   over the remaining lengths sorted descending.

    Where the engines speculate (`drafting`), a sequence's time per token at load k is the engines' own
    rule's: K = draft_length(accept, k, max_tokens, pass cost), then pass_time(k * (K + 1)) /
    expected_yield(accept, K); a full batch drafts nothing, so this only shortens the tail."""
    if remaining.size == 0:
        return 0.0
    if not models:
        return float("inf")
    gpus = sum(m.replicas for m in models)
    w = np.array([m.replicas for m in models], dtype=np.float64) / gpus
    t1 = float(np.dot(w, [m._t1 / m.speed for m in models]))
    slope = float(np.dot(w, [m._slope / m.speed for m in models]))
    batch = float(np.dot(w, [m.max_batch for m in models]))
    r = np.sort(np.asarray(remaining, dtype=np.float64))[::-1]
    step = r - np.append(r[1:], 0.0)
    load = np.arange(1, r.size + 1, dtype=np.float64) / gpus
    st = t1 + slope * np.maximum(load - 1.0, 0.0)
    full = t1 + slope * (batch - 1.0)
    st = np.where(load <= batch, st, load / batch * full)  # beyond the batch: queueing at the full rate
    if drafting is not None:
        st = _speculative_times(st, load, drafting, (t1, slope, batch, full))
    return float(np.dot(step, st))


def _speculative_times(
    st: np.ndarray, load: np.ndarray, d: Drafting, shape: tuple[float, float, float, float]
) -> np.ndarray:
    """pool_finish_s's seconds per token at each load k/gpus when the engines draft. A pass over x tokens
    per GPU costs a decode step of x sequences (EngineModel.pass_time); a sequence's tokens stay on one
    GPU, so below one sequence per GPU each busy GPU runs one. The pass cost is flat and then linear in x,
    so the K the rule picks falls as the load rises: it is asked only where K may change (bisection),
    and where it is 0 st stands."""
    t1, slope, batch, full = shape
    per_seq = np.maximum(load, 1.0)

    def per_gpu(x: np.ndarray | float) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return np.where(x <= batch, t1 + slope * np.maximum(x - 1.0, 0.0), x / batch * full)

    def k_at(j: int) -> int:
        u = float(per_seq[j])
        return draft_length(d.accept, j + 1, d.max_tokens, lambda n, k=j + 1: float(per_gpu(n / k * u)))

    ks = np.zeros(load.size, dtype=np.int64)
    spans = [(0, load.size - 1, k_at(0), k_at(load.size - 1))]
    while spans:
        lo, hi, k_lo, k_hi = spans.pop()
        ks[lo], ks[hi] = k_lo, k_hi
        if k_lo == k_hi:
            ks[lo : hi + 1] = k_lo
        elif hi - lo > 1:
            mid = (lo + hi) // 2
            k_mid = k_at(mid)
            spans += [(lo, mid, k_lo, k_mid), (mid, hi, k_mid, k_hi)]
    drafting = ks > 0
    if not drafting.any():
        return st
    out = st.copy()
    k = ks[drafting]
    yields = np.array([expected_yield(d.accept, int(x)) for x in range(d.max_tokens + 1)])
    out[drafting] = per_gpu(per_seq[drafting] * (k + 1)) / yields[k]
    return out


def make_offload(name: str, *, train_tokens_per_s: float, overlap: bool, min_box_s: float = 5.0) -> OffloadPolicy:
    if name == "none":
        return NoOffload()
    if name == "rlboost":
        return RLBoostOffload(min_box_s=min_box_s)
    if name == "predictive":
        return PredictiveOffload(train_tokens_per_s=train_tokens_per_s, overlap=overlap)
    raise ValueError(f"unknown offload policy {name!r} (none, rlboost, predictive)")


def trainer_idle(box_at: float | None, gen_end: float, busy_during_tail: float) -> float:
    """T_b from marks on one clock: the time between the switch and the last response that the trainer
    spent without a finished group to train on."""
    if box_at is None:
        return 0.0
    return max(0.0, (gen_end - box_at) - busy_during_tail)


def remote_rates(remote: Sequence[EngineView]) -> tuple[list[float], list[float], tuple[EngineModel, ...]]:
    """The remote engines' full-batch and one-sequence rates, and their models (all or none): a
    measured rate is carried to a full batch by the model's shape (or linearly without one); an engine
    neither measured nor modelled counts as the mean of the others."""
    full_rates: list[float] = []
    seq_rates: list[float] = []
    for e in remote:
        if e.tokens_per_s > 0 and e.active > 0:
            scale = (e.model.rate(e.capacity) / e.model.rate(e.active)) if e.model else e.capacity / e.active
            full_rates.append(e.tokens_per_s * scale)
        elif e.model is not None:
            full_rates.append(e.model.rate(e.capacity))
        else:
            full_rates.append(-1.0)  # unknown: filled with the mean below
        seq_rates.append(1.0 / e.seq_time(1))
    known = [r for r in full_rates if r > 0]
    fill = sum(known) / len(known) if known else 0.0
    models = tuple(e.model for e in remote if e.model is not None)
    if len(models) != len(remote):
        models = ()  # some engine has no model: fall back to the measured-rate estimate
    return [r if r > 0 else fill for r in full_rates], seq_rates, models


def step_progress(
    *,
    elapsed: float,
    remote: Sequence[EngineView],
    generated: np.ndarray,
    budget_left: np.ndarray,
    held_tokens: float,
    reserved_context: float,
    reserved_rate: float,
    stats: LengthStats,
    drafting: Drafting | None = None,
) -> StepProgress:
    """What the offload policy sees, from one clock's measurements (the live coordinator's and the
    simulator's alike): the ready remote engines (remote_rates), every unfinished response's generated
    tokens and remaining budget, the step's tokens so far, and the context (prompt + partial) that
    would move off the reserved engine, and how the engines draft (None: they do not)."""
    unfinished = int(generated.size)
    exp = stats.expected_remaining(generated, budget_left) if unfinished else np.zeros(0)
    remote_full_rates, remote_seq_rates, models = remote_rates(remote)
    prefill_rate = sum(m.prefill_tokens_per_s * m.replicas * m.speed for m in models)
    return StepProgress(
        elapsed=elapsed,
        remote_engines=len(remote_full_rates),
        remote_rate=float(sum(remote_full_rates)),
        remote_seq_rate=sum(remote_seq_rates) / len(remote_seq_rates) if remote_seq_rates else 0.0,
        remaining_tokens=float(exp.sum()),
        max_remaining=float(exp.max()) if exp.size else 0.0,
        total_tokens=float(held_tokens + exp.sum()),
        unfinished=unfinished,
        remaining_sample=stats.sample_remaining(generated, budget_left) if unfinished else None,
        remote_models=models,
        handoff_prefill_s=reserved_context / prefill_rate if prefill_rate > 0 else 0.0,
        reserved_rate=reserved_rate,
        drafting=drafting,
    )


@dataclass(frozen=True)
class OffloadDecision:
    """One tick's offload decision: `offload` (the reserved engines hand their partial responses to the
    remotes now), `resume` (every remote engine is gone: the reserved engines generate again rather
    than stall the step), or `none`; `next_check` is when to ask the policy again."""

    action: Literal["none", "offload", "resume"]
    next_check: float


def offload_tick(
    policy: OffloadPolicy,
    now: float,
    *,
    offload_at: float | None,
    next_check: float,
    has_reserved: bool,
    remote_ready: bool,
    progress: Callable[[], StepProgress],
) -> OffloadDecision:
    """The offload decision of one tick, for the live coordinator and the simulator alike (pure;
    `progress` is called only when the policy is asked)."""
    if offload_at is None and now >= next_check:
        if not has_reserved:
            return OffloadDecision("none", next_check)
        p = progress()
        if not policy.should_offload(p):
            return OffloadDecision("none", now + policy.next_check_s(p))
        return OffloadDecision("offload", next_check)
    if not remote_ready:
        return OffloadDecision("resume", next_check)
    return OffloadDecision("none", next_check)
