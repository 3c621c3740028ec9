"""The scheduling policies (rlboost/rollout/policies/): pure functions, checked on hand-made situations."""

from __future__ import annotations

import numpy as np
import pytest

from rlboost.contracts.lengths import LengthModel
from rlboost.contracts.perf import DEFAULT_PERF, EngineModel, engine_model
from rlboost.providers.pricing import Offer
from rlboost.rollout.policies.dispatch import plan_dispatch
from rlboost.rollout.policies.lengths import LengthStats
from rlboost.rollout.policies.migration import MigrationConfig, plan_migrations
from rlboost.rollout.policies.offload import (
    NoOffload,
    PredictiveOffload,
    RLBoostOffload,
    StepOutcome,
    StepProgress,
    pool_finish_s,
    trainer_idle,
)
from rlboost.rollout.policies.placement import PlacementTracker
from rlboost.rollout.policies.tail_batching import TailBatcher
from rlboost.rollout.policies.views import EngineView, ReqView

A100 = EngineModel(2500, 80, 15000, ref_batch=256, max_batch=256)


# ---- performance model --------------------------------------------------------------------
def test_engine_model_hits_both_reference_points():
    m = A100
    assert m.rate(1) == pytest.approx(80)  # one sequence alone
    assert m.rate(256) == pytest.approx(2500)  # a full reference batch
    assert m.step_time(10) < m.step_time(100)
    node = engine_model("A100:8", DEFAULT_PERF, max_batch=256)
    assert node.capacity == 8 * 256
    ref = DEFAULT_PERF["A100"].tokens_per_s
    assert node.rate(8 * 256) == pytest.approx(8 * ref)  # 8 GPUs, each with a full batch
    one = engine_model("A100:1", DEFAULT_PERF, max_batch=256)
    assert node.step_time(8) == pytest.approx(one.step_time(1))  # spread over 8 GPUs: one each
    with pytest.raises(ValueError):
        EngineModel(0, 1, 1)


# ---- offload ------------------------------------------------------------------------------
def outcome(step_s, gen_s, box, idle, n=4):
    return StepOutcome(n_remote=n, step_s=step_s, gen_s=gen_s, box_s=box, trainer_idle_s=idle)


def test_rlboost_rule_shrinks_and_grows_by_a_third_with_a_floor():
    p = RLBoostOffload()
    assert p.start_step(4) is None  # first step: no box yet, measure
    p.end_step(outcome(step_s=100, gen_s=70, box=None, idle=0))  # T_b 0 < R_b 30: shrink by 10
    assert p.box == pytest.approx(60)
    assert p.start_step(4) == pytest.approx(60)
    p.end_step(outcome(step_s=90, gen_s=80, box=60, idle=16))  # T_b 16 > R_b 10: grow by 2
    assert p.box == pytest.approx(62)
    p.end_step(outcome(step_s=100, gen_s=10, box=6, idle=0))  # shrink by 30 -> floor
    assert p.box == 5.0


def test_rlboost_rule_remembers_the_best_box_per_worker_count():
    p = RLBoostOffload()
    p.start_step(4)
    p.end_step(outcome(step_s=80, gen_s=70, box=None, idle=0, n=4))  # best for 4: box 70
    p.start_step(8)
    p.end_step(outcome(step_s=60, gen_s=50, box=None, idle=0, n=8))
    assert p.start_step(4) == pytest.approx(70)  # back to 4 workers: resume from the best box seen
    assert p.start_step(0) is None  # no remote worker: never box


def progress(remaining, total, models=(A100,), elapsed=10.0):
    rem = np.asarray(remaining, dtype=float)
    return StepProgress(
        elapsed=elapsed,
        remote_engines=len(models),
        remote_rate=sum(m.rate(m.capacity) for m in models),
        remote_seq_rate=80,
        remaining_tokens=float(rem.sum()),
        max_remaining=float(rem.max()) if rem.size else 0.0,
        total_tokens=total,
        unfinished=rem.size,
        remaining_sample=rem,
        remote_models=tuple(models),
    )


def test_pool_finish_time_is_exact_for_equal_sequences_and_bounded_by_the_longest():
    assert pool_finish_s(np.array([800.0]), [A100]) == pytest.approx(800 / 80)
    same = np.full(256, 100.0)
    assert pool_finish_s(same, [A100]) == pytest.approx(100 * A100.step_time(256))
    mixed = np.array([1000.0] + [10.0] * 255)
    # the long one runs alone after the short ones finish: close to its solo time, never below it
    assert 1000 / 80 < pool_finish_s(mixed, [A100]) < 1000 / 80 + 10 * A100.step_time(256) + 1e-9
    assert pool_finish_s(mixed, [A100, A100]) <= pool_finish_s(mixed, [A100])


def test_predictive_offloads_when_remotes_can_finish_before_the_trainer():
    p = PredictiveOffload(train_tokens_per_s=1000.0)
    # trainer needs 100k / 1k = 100 s; remotes finish 30 short sequences in seconds: switch now
    assert p.should_offload(progress([200.0] * 30, total=100_000))
    # a 4,000-token sequence alone needs 50 s on the remote pool; training 20k tokens takes 20 s: keep generating
    assert not p.should_offload(progress([4000.0] + [50.0] * 10, total=20_000))
    assert not PredictiveOffload(1000.0, overlap=False).should_offload(progress([10.0], total=1e9))
    assert not p.should_offload(progress([10.0], total=1e9, models=()))  # no remote engine


def test_predictive_learns_the_training_rate():
    p = PredictiveOffload(train_tokens_per_s=1000.0)
    for _ in range(3):
        p.end_step(StepOutcome(4, 10, 8, 5, 1, train_tokens=4000, train_busy_s=1.0))
    assert p.train_tokens_per_s == pytest.approx(4000)


def test_trainer_idle_counts_the_tail_minus_training():
    assert trainer_idle(None, 50.0, 0.0) == 0.0
    assert trainer_idle(10.0, 50.0, 25.0) == pytest.approx(15.0)
    assert NoOffload().should_offload(progress([1.0], 1.0)) is False


# ---- dispatch -----------------------------------------------------------------------------
def ev(eid, active, cap=4, rate=0.0, model=None, kind="spot", accepting=True):
    return EngineView(eid, kind, cap, active, rate, model, accepting)


def rv(rid, expected, generated=0):
    return ReqView(rid, generated, 100, 8, float(expected))


def test_rate_dispatch_puts_the_longest_work_on_the_fastest_engine():
    slow = EngineModel(100, 5, 1000, ref_batch=4, max_batch=4)
    fast = EngineModel(400, 40, 1000, ref_batch=4, max_batch=4)
    plan = dict(
        plan_dispatch([rv("short", 10), rv("long", 500)], [ev("slow", 0, model=slow), ev("fast", 0, model=fast)])
    )
    assert plan["long"] == "fast"
    assert set(plan) == {"short", "long"}


def test_dispatch_fills_free_slots_only_and_skips_engines_that_do_not_accept():
    engines = [ev("a", 3), ev("b", 0, accepting=False), ev("c", 4)]
    plan = plan_dispatch([rv(f"r{i}", 10) for i in range(5)], engines)
    assert [e for _, e in plan] == ["a"]  # one free slot in the whole pool
    assert plan_dispatch([rv("x", 1)], [ev("a", 0)], avoid={"x": {"a"}}) == []


def test_spread_dispatch_is_proportional_to_free_slots():
    plan = plan_dispatch([rv(f"r{i}", 1) for i in range(6)], [ev("a", 0, cap=4), ev("b", 2, cap=4)], mode="spread")
    counts = {e: sum(1 for _, x in plan if x == e) for e in ("a", "b")}
    assert counts == {"a": 4, "b": 2}
    with pytest.raises(ValueError):
        plan_dispatch([rv("r", 1)], [ev("a", 0)], mode="nope")


# ---- migration ----------------------------------------------------------------------------
def test_tail_migration_moves_long_work_off_a_crowded_engine():
    m = EngineModel(2500, 80, 15000, ref_batch=256, max_batch=256)
    crowded = ev("busy", 200, cap=256, model=m)
    idle = ev("idle", 0, cap=256, model=m)
    running = {"busy": [ReqView(f"r{i}", 100, 3000, 8, 2000.0, "busy", 5.0) for i in range(3)]}
    moves = plan_migrations([crowded, idle], running, queue_len=0)
    assert {rid for rid, _ in moves} == {"r0", "r1", "r2"} and all(src == "busy" for _, src in moves)
    assert plan_migrations([crowded, idle], running, queue_len=5) == []  # work still waits: no tail yet
    fresh = {"busy": [ReqView("r", 100, 3000, 8, 2000.0, "busy", 0.1)]}
    assert plan_migrations([crowded, idle], fresh, queue_len=0) == []  # just dispatched: let it settle
    short = {"busy": [ReqView("r", 100, 3000, 8, 3.0, "busy", 5.0)]}
    assert plan_migrations([crowded, idle], short, queue_len=0) == []  # gain below the re-prefill cost


def test_migration_stops_when_balanced():
    m = EngineModel(2500, 80, 15000, ref_batch=256, max_batch=256)
    a, b = ev("a", 1, cap=256, model=m), ev("b", 0, cap=256, model=m)
    running = {"a": [ReqView("r", 10, 3000, 8, 2000.0, "a", 5.0)]}
    assert plan_migrations([a, b], running, 0, MigrationConfig()) == []  # one sequence alone is already fast


# ---- tail batching ------------------------------------------------------------------------
def test_tail_batching_over_launches_parks_and_runs_long_rounds():
    tb = TailBatcher(prompts_per_step=4, over_launch=0.5)
    assert tb.launch_count() == 6
    r1 = tb.next_round(["a", "b", "c", "d", "e", "f"])
    assert not r1.long and r1.keep == 4
    tb.close_round(r1, ["e", "f"])
    r2 = tb.next_round(["g", "h", "i", "j", "k", "l"])
    tb.close_round(r2, ["k", "l"])
    assert tb.launch_count() == 0  # four parked: the next round is a long one
    r3 = tb.next_round([])
    assert r3.long and r3.prompts == ["e", "f", "k", "l"] and r3.keep == 4
    assert tb.long_rounds == 1 and tb.discarded_groups == 4


# ---- placement ----------------------------------------------------------------------------
def offer(acc, price, thr=1.0):
    return Offer("aws", "us-east-1", acc, price, price * 3, thr)


def test_placement_prefers_cheap_throughput_then_learns_preemptions_and_rates():
    a, b = offer("A", 1.0), offer("B", 1.2)
    pt = PlacementTracker(boot_s=600)
    assert [o.key for o in pt.order([a, b], 0.0)] == [a.key, b.key]
    for i in range(6):  # A gets preempted every few minutes
        pt.launched(f"a{i}", a.key, i * 600.0)
        pt.ended(f"a{i}", i * 600.0 + 300.0, preempted=True)
    assert pt.order([a, b], 4000.0)[0].key == b.key
    pt2 = PlacementTracker()
    pt2.launched("b1", b.key, 0.0)
    pt2.worker_rate("b1", 3000.0)  # B measured three times faster than the prior
    pt2.launched("a1", a.key, 0.0)
    pt2.worker_rate("a1", 1000.0)
    assert pt2.order([a, b], 10.0)[0].key == b.key



def test_placement_learns_the_boot_time_from_workers_dialling_in():
    a = offer("A", 1.0)
    pt = PlacementTracker(boot_s=120.0)
    assert pt.boot_estimate_s() == 120.0  # nothing seen: the prior
    pt.launched("w1", a.key, 100.0)
    pt.on_workers([{"worker_id": "w1", "tokens_per_s": 0.0}], 700.0)  # 600 s from launch to dialled in
    pt.on_workers([{"worker_id": "w1", "tokens_per_s": 50.0}], 900.0)  # seen again: not a second boot
    pt.joined("stranger", 900.0)  # never launched by us: no boot to count
    assert pt.boot_estimate_s() == pytest.approx((120.0 + 600.0) / 2)
    slow = pt.useful(a, 1000.0)
    pt2 = PlacementTracker(boot_s=120.0)
    pt2.launched("w1", a.key, 100.0)
    pt2.joined("w1", 160.0)
    assert pt2.useful(a, 1000.0) > slow  # a slow boot wastes more of a preempted worker's life

# ---- lengths ------------------------------------------------------------------------------
def test_length_model_is_deterministic_long_tailed_and_group_correlated():
    lm = LengthModel(median=100, sigma=0.8, prompt_sigma=0.6)
    assert lm.length([1, 2, 3], 42) == lm.length([1, 2, 3], 42)
    lens = np.array([lm.length([1, 2, s % 50], s) for s in range(4000)])
    assert 70 < np.median(lens) < 140 and lens.max() > 8 * np.median(lens)  # a long tail
    g1 = [lm.length([9, 9, 9], s) for s in range(50)]
    g2 = [lm.length([5, 5, 5], s) for s in range(50)]
    assert np.median(g1) != np.median(g2)  # the prompt shifts the whole group
    rec = LengthModel(recorded=(5, 6, 7))
    assert rec.length([1], 3) in (5, 6, 7)


def test_length_stats_predict_remaining_and_the_longest():
    st = LengthStats(budget=1000)
    st.add(np.concatenate([np.full(900, 50), np.full(100, 800)]))
    exp = st.expected_remaining(np.array([0, 60, 900]), np.array([1000, 940, 100]))
    assert exp[0] == pytest.approx(0.9 * 50 + 0.1 * 800, rel=0.01)
    assert exp[1] == pytest.approx(740)  # past 50 tokens: it is one of the long ones
    assert exp[2] == 100  # longer than anything seen: capped by its budget
    sample = st.sample_remaining(np.zeros(1000), np.full(1000, 1000))
    assert sample.max() == pytest.approx(800) and 100 < sample.mean() < 160
