"""Sibling-aware scheduling (rollout.sibling_scheduling; rlboost/rollout/policies/siblings.py): the
predictor, the decisions it orders, and that the flag off leaves the coordinator as it was."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlboost.contracts.lengths import LengthModel
from rlboost.contracts.spec import load_spec
from rlboost.rollout import scheduling
from rlboost.rollout.coordinator import Coordinator, CoordinatorRules
from rlboost.rollout.policies.dispatch import plan_dispatch
from rlboost.rollout.policies.lengths import LengthStats
from rlboost.rollout.policies.offload import NoOffload
from rlboost.rollout.policies.siblings import GroupLengths, GroupSpread, SiblingModel, cdf, log_sf
from rlboost.rollout.policies.tick import TickCadence
from rlboost.rollout.policies.views import EngineView, ReqView

BUDGET = 14_336
GROUP = 8


def trained_model(median: float = 2500, sigma: float = 0.6, prompt_sigma: float = 0.45, groups: int = 300):
    """A SiblingModel that has seen `groups` complete groups of the synthetic workload's lengths."""
    lm = LengthModel(median=median, sigma=sigma, prompt_sigma=prompt_sigma)
    stats = LengthStats(BUDGET)
    spread = GroupSpread()
    for p in range(groups):
        lens = [min(BUDGET, n) for n in lm.lengths_from_key(1000 + p, [p * GROUP + g for g in range(GROUP)])]
        stats.add(lens)
        spread.add_group(lens)
    return SiblingModel(stats, spread)


MODEL = trained_model()


def predict(finished: Sequence[int], generated: int, model: SiblingModel = MODEL) -> float:
    book = GroupLengths({"p": GROUP})
    for n in finished:
        book.add("p", n)
    out = book.predict(model, ["p"], np.array([generated]), np.array([BUDGET - generated]))
    assert out is not None
    return float(out[0])


def test_the_normal_tails_are_accurate():
    x = np.array([-3.0, 0.0, 1.0, 3.0, 8.0])
    assert cdf(x) == pytest.approx([0.0013498980, 0.5, 0.8413447461, 0.9986501020, 1.0], rel=1e-6)
    assert log_sf(np.array([8.0]))[0] == pytest.approx(-35.013437, rel=1e-6)  # log P(Z > 8), far in the tail


def test_the_split_between_prompt_and_response_is_learned_from_complete_groups():
    prior = MODEL.prior()
    assert prior is not None
    assert prior.response_sd == pytest.approx(0.6, abs=0.06)
    assert prior.prompt_sd == pytest.approx(0.45, abs=0.1)
    assert np.exp(prior.mu) == pytest.approx(2500, rel=0.1)


def test_nothing_is_predicted_before_enough_groups_are_complete():
    assert SiblingModel(LengthStats(BUDGET)).prior() is None
    book = GroupLengths({"p": GROUP})
    assert book.predict(trained_model(groups=3), ["p"], np.array([0]), np.array([BUDGET])) is None


def test_finished_siblings_pull_the_prediction_toward_them():
    alone = predict([], 0)
    assert predict([9000, 11000], 0) > 1.5 * alone  # a long group
    assert predict([300, 400], 0) < 0.6 * alone  # a short one
    # a sibling cut at the budget says the group is long, more than any finished length below it
    assert predict([BUDGET], 0) > predict([12_000], 0)


@settings(max_examples=60, deadline=None)
@given(
    finished=st.lists(st.integers(1, BUDGET), min_size=0, max_size=GROUP - 1),
    generated=st.integers(0, BUDGET - 1),
    which=st.integers(0, GROUP - 2),
    longer=st.integers(1, 5000),
)
def test_monotone_in_the_siblings_lengths_and_never_below_what_is_generated(finished, generated, which, longer):
    rest = predict(finished, generated)
    assert 1.0 <= rest <= BUDGET - generated  # the response ends after what it holds, within its budget
    if finished:
        i = which % len(finished)
        more = [*finished]
        more[i] = min(BUDGET, more[i] + longer)
        assert predict(more, generated) >= rest * (1 - 1e-9)
    if len(finished) < GROUP - 1:  # one more sibling, cut at the budget: the group is no shorter
        assert predict([*finished, BUDGET], generated) >= rest * (1 - 1e-9)


def test_a_response_that_has_run_long_expects_to_run_longer():
    assert predict([2000], 6000) > predict([2000], 100)  # heavy tail: E[L - g | L > g] grows with g here


# ---- the decisions -----------------------------------------------------------------------------
def ev(eid: str, active: int, cap: int = 8, seq_s: float | None = None) -> EngineView:
    # seq_s: a measured engine's seconds per token of one sequence, whatever its load (no model)
    return EngineView(eid, "spot", cap, active, active / seq_s if seq_s else 0.0)


def rv(rid: str, expected: float) -> ReqView:
    return ReqView(rid, 0, 100, 8, expected)


def test_dispatch_spreads_a_group_over_engines_that_are_nearly_as_fast():
    reqs = [rv(f"g{g}-{s}", 10) for g in range(2) for s in range(4)]
    groups = {r.rid: r.rid.split("-")[0] for r in reqs}
    engines = [ev("a", 1, cap=9, seq_s=1.0), ev("b", 1, cap=9, seq_s=1.1)]
    plain = plan_dispatch(reqs, engines)
    assert {e for _, e in plain} == {"a"}  # a is always a little faster: it takes every group whole
    spread = plan_dispatch(reqs, engines, groups=groups)
    assert sorted(r for r, _ in spread) == sorted(groups)
    for g in ("g0", "g1"):
        assert sorted(e for r, e in spread if groups[r] == g) == ["a", "a", "b", "b"]
    # an engine far slower than the slack allows is not worth it: the group stays together
    far = [ev("a", 1, cap=9, seq_s=1.0), ev("b", 1, cap=9, seq_s=2.0)]
    assert {e for _, e in plan_dispatch(reqs, far, groups=groups)} == {"a"}


class FakePool:
    """Just enough of an EnginePool for dispatch: one queue of (rid, group, generated) and engines."""

    def __init__(self, items: list[tuple[str, str, int]], engines: list[EngineView]) -> None:
        self.items = {rid: (grp, gen) for rid, grp, gen in items}
        self.queue = [rid for rid, _, _ in items]
        self.engines = engines
        self.admitted: list[tuple[str, str]] = []

    def n_remote(self) -> int:
        return len(self.engines)

    def queue_len(self) -> int:
        return len(self.queue)

    def open_engines(self, now: float) -> list[EngineView]:
        return [e for e in self.engines if e.free > 0]

    def queue_head(self, n: int) -> list[str]:
        head, self.queue = self.queue[:n], self.queue[n:]
        return head

    def put_back(self, items: Sequence[str]) -> None:
        self.queue = [*items, *self.queue]

    def fresh(self, items: Sequence[str]) -> bool:
        return all(self.items[i][1] == 0 for i in items)

    def req_views(self, items: Sequence[str], now: float) -> list[ReqView]:
        return [ReqView(i, self.items[i][1], BUDGET - self.items[i][1], 8, 1000.0) for i in items]

    def groups(self, items: Sequence[str]) -> list[Hashable]:
        return [self.items[str(i)][0] for i in items]

    def avoid(self, items: Sequence[str]) -> dict[str, set[str]]:
        return {}

    def item(self, rid: str) -> str:
        return rid

    def admit(self, plan: Sequence[tuple[str, str]], now: float) -> None:
        self.admitted.extend(plan)


def coordinator(pool: FakePool, siblings: bool, model: SiblingModel = MODEL) -> Coordinator:
    rules = CoordinatorRules(NoOffload(), TickCadence(), None, model.stats, "rate", siblings=siblings)
    c = Coordinator(pool, rules)  # type: ignore[arg-type]
    if c.siblings is not None:
        c.siblings.spread = model.spread
    return c


def dispatch_one_round(siblings: bool) -> FakePool:
    """A queue whose head holds a short group's responses, a long group's waiting behind them; the
    first of each group finished (200 and 12,000 tokens); one engine with two free slots."""
    items = [(f"short-{s}", "short", 0) for s in range(3)] + [(f"long-{s}", "long", 0) for s in range(3)]
    pool = FakePool(items, [ev("a", 6)])
    c = coordinator(pool, siblings=siblings)
    c.begin_step(0, 0.0, {"short": 4, "long": 4})
    c.response_done("short", 200)
    c.response_done("long", 12_000)
    c.dispatch(1.0)
    return pool


def test_dispatch_starts_the_longest_predicted_of_the_whole_queue_first():
    pool = dispatch_one_round(siblings=True)
    assert sorted(r for r, _ in pool.admitted) == ["long-0", "long-1"]
    assert pool.queue == ["short-0", "short-1", "short-2", "long-2"]  # the rest keep their order
    # without sibling scheduling: the head of the queue, as before
    assert sorted(r for r, _ in dispatch_one_round(siblings=False).admitted) == ["short-0", "short-1"]


def test_off_by_default_and_set_from_the_job_file():
    assert CoordinatorRules(NoOffload(), TickCadence(), None, LengthStats(10)).siblings is False
    spec = load_spec("examples/simulate/paper-h100.yaml")
    assert scheduling.coordinator_rules(spec).siblings is False
    on = spec.model_copy(update={"rollout": spec.rollout.model_copy(update={"sibling_scheduling": True})})
    assert scheduling.coordinator_rules(on).siblings is True
    assert scheduling.coordinator_config(on, eos_id=0).sibling_scheduling is True


def test_the_simulator_replays_a_job_with_sibling_scheduling():
    from rlboost.providers.pricing import spot_offers, trainer_offer
    from rlboost.providers.spot_market import constant_trace
    from rlboost.simulator import PRESETS
    from rlboost.simulator.core import Simulation

    spec = load_spec("examples/simulate/paper-h100.yaml")
    ro = spec.rollout.model_copy(update={"sibling_scheduling": True, "max_workers": 2})
    spec = spec.model_copy(update={"rollout": ro})
    sim = Simulation(spec, constant_trace(2), PRESETS["rlboost"], trainer_offer(spec), spot_offers(spec), max_steps=3)
    assert sim.coordinator.siblings is not None
    r = sim.run()
    assert r.steps == 3 and r.trained_tokens > 0
    assert sim.coordinator.siblings.spread.groups >= 3 * spec.algorithm.prompts_per_step - 1
