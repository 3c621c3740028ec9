"""Speculative decoding in the replay: how fast a modelled engine decodes when it drafts.

Where the job speculates (`rollout.speculative.method` group or ngram, and the policy does: `sync`
models veRL's default, no speculation), each engine, whenever its load changes, picks K with the live
engine's rule (rlboost/contracts/speculation.py `draft_length`) from the mean acceptance of the
responses it holds, its live count and the cost of a forward pass from the performance table
(contracts/perf.py `EngineModel.pass_time`). Each response's acceptance comes from the cited model
(contracts/speculation_perf.py): its method and the fraction of its siblings that have finished.
The engine then advances its responses by the mean expected yield per pass (`expected_yield`), the
same for all of them: its progress counter stays one count for the batch, as without speculation,
so a response ends at the pass where the batch's mean yield has given it its tokens (per engine, not
per response: in a step's tail an engine holds few responses, mostly with the same siblings done).
Deterministic: expected values, no random draws, so every replay reproduces.

A sibling finishing changes the acceptance of its group's other responses: ModelledPool calls
`siblings_changed` so that their engines re-pick K and re-time their next event at once.

The drafted and accepted tokens counted per engine also feed an `AcceptanceMeter` (the live
coordinator's estimator), which ModelledPool.drafting hands the offload policy: the acceptance measured
where engines draft, i.e. in a step's tail, where more siblings have finished than at its start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rlboost.contracts.spec import SimulateSpec
from rlboost.contracts.speculation import AcceptanceMeter, draft_length, expected_yield
from rlboost.contracts.speculation_perf import ACCEPTANCE, AcceptanceModel, measured

if TYPE_CHECKING:
    from rlboost.simulator.engines import ModelledEngine
    from rlboost.simulator.step_state import StepState


def acceptance_model(sim: SimulateSpec) -> AcceptanceModel:
    """The job's measured acceptance (simulate.acceptance, e.g. from a recorded run) where it gives one,
    else the cited model."""
    return ACCEPTANCE if sim.acceptance is None else measured(sim.acceptance)


@dataclass
class SpeculationTotals:
    """Counted over a replay: response-passes (one response in one verification pass, drafting or
    not), drafted and accepted tokens."""

    passes: float = 0.0
    drafted: float = 0.0
    accepted: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"passes": round(self.passes, 3), "drafted": round(self.drafted, 3), "accepted": round(self.accepted, 3)}


@dataclass
class _Load:
    """An engine's speculation since its load last changed."""

    decoded: float  # its progress count then
    live: int
    k: int
    tokens_per_pass: float  # mean expected yield of its responses


class Speculation:
    def __init__(
        self,
        method: str,
        max_tokens: int,
        step: Callable[[], StepState | None],
        acceptance: AcceptanceModel = ACCEPTANCE,
    ) -> None:
        self.method, self.max_tokens, self.step, self.acceptance = method, max_tokens, step, acceptance
        self.totals = SpeculationTotals()
        # what the engines' reports of drafted and accepted tokens measure, as the live coordinator's
        # meter would: the acceptance where drafting happens (a step's tail), for the offload policy
        self.meter = AcceptanceMeter(prior=acceptance.rate(method, 0.0))
        self._loads: dict[int, _Load] = {}
        self._yields: dict[tuple[float, int], float] = {}

    def _account(self, e: ModelledEngine) -> None:
        """Count the passes the engine ran at its previous load (its progress since is in tokens per
        response; `decoded` restarts at 0 when an empty engine takes work: ModelledEngine.rebase)."""
        prev = self._loads.get(e.idx)
        if prev is None or prev.live == 0:
            return
        gained = e.decoded - prev.decoded if e.decoded >= prev.decoded else e.decoded
        if gained <= 0:
            return
        passes = gained / prev.tokens_per_pass * prev.live
        t = self.totals
        t.passes += passes
        t.drafted += passes * prev.k
        t.accepted += gained * prev.live - passes
        if prev.k > 0:  # an engine that drafts nothing reports nothing
            self.meter.update(passes * prev.k, gained * prev.live - passes)

    def _yield(self, a: float, k: int) -> float:
        key = (a, k)
        y = self._yields.get(key)
        if y is None:
            y = self._yields[key] = expected_yield(a, k)
        return y

    def seconds_per_token(self, e: ModelledEngine) -> float:
        """Seconds per token of each live response at the engine's load now (before its CPU share);
        picks K and records the load for the totals."""
        self._account(e)
        s = self.step()
        n = e.batch_size()
        model = e.model
        if s is None or not e.live:
            self._loads[e.idx] = _Load(e.decoded, 0, 0, 1.0)
            return model.step_time(n)
        rates, counts = self._rates(s, e)
        live = len(e.live)
        accept = float(np.dot(rates, counts)) / live
        k = draft_length(accept, n, self.max_tokens, lambda tokens: model.pass_time(tokens, n))
        y = sum(self._yield(a, k) * c for a, c in zip(rates.tolist(), counts.tolist())) / live
        self._loads[e.idx] = _Load(e.decoded, live, k, y)
        return model.pass_time(n * (k + 1), n) / y

    def _rates(self, s: StepState, e: ModelledEngine) -> tuple[np.ndarray, np.ndarray]:
        """The distinct acceptance rates of the engine's live responses, and how many have each."""
        g = s.group_size
        if self.method != "group" or g < 2:
            return np.array([self.acceptance.rate(self.method, 0.0)]), np.array([len(e.live)])
        live = np.fromiter(e.live, np.int64, len(e.live))
        done = s.done.reshape(-1, g).sum(axis=1)[live // g]  # a live response is not done itself
        fracs, counts = np.unique(done, return_counts=True)
        rates = np.array([self.acceptance.rate("group", f / (g - 1)) for f in fracs.tolist()])
        return rates, counts

    def siblings(self, s: StepState, i: int) -> list[int]:
        """The engines holding response i's unfinished siblings (their acceptance just changed)."""
        if self.method != "group":
            return []
        g0 = i - i % s.group_size
        engines = s.engine_of[g0 : g0 + s.group_size]
        return sorted({int(x) for x in engines.tolist() if x >= 0})
