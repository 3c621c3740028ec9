"""Modelled engines: what the replay runs instead of a vLLM, torch or synthetic engine.

An engine decodes its live responses together: one decode step takes `model.step_time(batch)`, and a
prefill pauses decoding (`stall`). Progress is counted in decode steps (`decoded`), so a response
admitted when the engine had run `p` steps and needing `m` more tokens ends when `decoded` reaches
`p + m`: each engine keeps those targets in a heap and the replay schedules one event, its next end.
A static engine (torch, rlboost/contracts/engine.py STATIC_BATCH_ENGINES) takes a batch only when empty and
decodes at the batch's size until its last response ends. Where the job speculates
(simulator/speculation.py) a step is a verification pass and `decoded` counts tokens per response: the
engine's `step_s` is then seconds per token at its load (`spec`), the rest unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlboost.contracts.perf import EngineModel
from rlboost.providers.pricing import Offer
from rlboost.rollout.policies.views import EngineView

INF = float("inf")


class MemoView(EngineView):
    """An EngineView that remembers its seq_time answers: the policies ask the same view for the same
    load many times per plan, and a view never changes (the replay makes a new one per load)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self._st: dict[int, float] = {}

    def seq_time(self, n: int, default: EngineModel | None = None) -> float:
        if default is not None:
            return super().seq_time(n, default)
        st = self._st.get(n)
        if st is None:
            st = self._st[n] = super().seq_time(n)
        return st


class ModelledEngine:
    """One engine: the reserved cluster's own, or a spot worker's. Its states are booting, pulling,
    ready, draining (lost, or leaving: holds nothing more) and gone (no longer billed)."""

    __slots__ = (
        "batch_n",
        "capacity",
        "decoded",
        "epoch",
        "heap",
        "id",
        "idx",
        "kill_at",
        "killed_at",
        "kind",
        "last",
        "live",
        "model",
        "noticed",
        "offer",
        "offloaded",
        "spec",
        "speed",
        "stall",
        "started",
        "state",
        "static",
        "step_s",
        "version",
        "victim",
        "views",
    )

    def __init__(
        self, idx: int, eid: str, kind: str, model: EngineModel, offer: Offer | None, t: float, static: bool
    ) -> None:
        self.idx, self.id, self.kind, self.model, self.offer = idx, eid, kind, model, offer
        self.static = static
        self.batch_n = 0  # a static engine: the size of the batch it runs
        self.state = "booting"
        self.version = -1
        self.offloaded = False
        self.decoded = 0.0  # decode steps run since the last rebase
        self.last = t  # when `decoded` was last brought up to date
        self.stall = t  # decoding resumes then (a prefill, or a static batch's round trip, until then)
        self.live: set[int] = set()  # the step's responses it holds
        self.heap: list[tuple[float, int]] = []  # (decoded count at which response i ends, i); may hold stale entries
        self.epoch = 0  # its pending engine event; a newer one makes older ones stale
        self.capacity = model.capacity
        self.speed = 1.0  # its share of a CPU core when the job's processes share a machine (local)
        self.step_s = model.step_time(1)  # seconds per decode step at its load now
        self.started = t
        self.victim = False
        self.noticed = False
        self.kill_at = INF  # when the market kills it (notice lead over)
        self.killed_at = INF  # the poll that killed it; the next poll reaps it and billing ends
        self.views: dict[tuple[int, bool], Any] = {}  # (load, accepting) -> ModelledPool.view_info
        # where the job speculates: seconds per token of each live response at its load
        # (simulator/speculation.py); None: one token per decode step
        self.spec: Callable[[ModelledEngine], float] | None = None

    def advance(self, t: float) -> None:
        start = max(self.last, self.stall)
        if self.live and t > start:
            self.decoded += (t - start) / self.step_s
        if t > self.last:
            self.last = t

    def progress_at(self, t: float) -> float:
        start = max(self.last, self.stall)
        return self.decoded + (t - start) / self.step_s if self.live and t > start else self.decoded

    def set_load(self) -> None:
        if self.spec is None:
            self.step_s = self.model.step_time(self.batch_size()) / self.speed
        else:  # `decoded` then counts tokens per response, not decode steps
            self.step_s = self.spec(self) / self.speed

    def batch_size(self) -> int:
        """Sequences a decode step runs: the live ones, or a static engine's whole batch while it runs."""
        return max(1, self.batch_n if self.static and self.live else len(self.live))

    def rebase(self, t: float) -> None:
        """Restart the progress count while the engine holds nothing: `decoded` counts decode steps, and
        over a long replay a lifetime count grows until its float spacing exceeds the finish tolerance;
        an event then finds no progress and is scheduled again at the same instant, forever."""
        assert not self.live
        self.advance(t)
        self.decoded = 0.0
        self.heap.clear()


class Fleet:
    """Every engine of the replay, by launch order (`engines[e.idx] is e`), and the ones not gone.

    A long replay launches hundreds of workers; every event that looks at the fleet walks `alive`."""

    def __init__(self, static: bool) -> None:
        self.static = static  # the job's engine batches statically (torch)
        self.spec: Callable[[ModelledEngine], float] | None = None  # given to every engine (ModelledEngine.spec)
        self.engines: list[ModelledEngine] = []
        self.alive: list[ModelledEngine] = []
        self.by_id: dict[str, ModelledEngine] = {}  # the coordinator names engines by id

    def add(self, eid: str, kind: str, model: EngineModel, offer: Offer | None, t: float) -> ModelledEngine:
        assert eid not in self.by_id, f"two engines named {eid}"
        e = ModelledEngine(len(self.engines), eid, kind, model, offer, t, self.static)
        e.spec = self.spec
        self.engines.append(e)
        self.alive.append(e)
        self.by_id[eid] = e
        return e

    def busy(self) -> int:
        """Engines using a core: starting up, pulling weights, or holding responses."""
        return sum(1 for e in self.alive if e.live or e.state in ("booting", "pulling"))
