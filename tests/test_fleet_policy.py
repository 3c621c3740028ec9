"""The fleet-size policy (trainer/policies/fleet.py): pure decisions from one measured step."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainer.policies.fleet import FleetGoal, FleetPolicy, StepSample

# a step measured with 2 workers: 300 s to generate, 120 s of training, 20 s after the last response
GEN_BOUND = StepSample(n_remote=2, step_s=320.0, gen_s=300.0, train_s=120.0, tokens=1_000_000)
POLICY = FleetPolicy(reserved_workers=1.0)


def size(sample=GEN_BOUND, objective="cost", worker=1.0, trainer=10.0, current=2, **goal) -> int:
    g = FleetGoal(objective=objective, max_workers=goal.pop("max_workers", 16), **goal)
    return POLICY.decide(sample, g, trainer_per_h=trainer, worker_per_h=worker, current=current).workers


def test_the_step_model_stops_at_the_trainer():
    # generation 300 s with 1 + 2 workers' worth: 9 workers' worth would make it 100 s, but training is 120 s
    assert POLICY.predict_step_s(GEN_BOUND, 2) == 320.0
    assert POLICY.predict_step_s(GEN_BOUND, 5) == 300.0 * 3 / 6 + 20.0
    assert POLICY.predict_step_s(GEN_BOUND, 16) == 120.0


def test_throughput_stops_at_the_trainer_bottleneck():
    # 300*3/(1+n) + 20 <= 120*1.02 first at n = 8 (9 workers' worth: 100 + 20 = 120)
    assert size(objective="throughput") == 8
    assert size(objective="throughput", max_workers=4) == 4


def test_cost_adds_workers_only_while_tokens_per_dollar_rise():
    cheap = size(worker=0.5)
    dear = size(worker=30.0)
    assert cheap > 2  # a cheap worker next to a $10/h trainer pays for itself
    assert dear == 0  # a worker dearer than the trainer buys less than it costs
    assert size(objective="cost", worker=0.5) <= size(objective="throughput", worker=0.5)


@given(
    p1=st.floats(0.05, 40.0),
    p2=st.floats(0.05, 40.0),
    gen=st.floats(10.0, 1000.0),
    train=st.floats(10.0, 1000.0),
    n0=st.integers(0, 8),
)
def test_monotone_in_price_and_throughput_at_least_cost(p1, p2, gen, train, n0):
    s = StepSample(n_remote=n0, step_s=gen + 5.0, gen_s=gen, train_s=train, tokens=100_000)
    lo, hi = sorted((p1, p2))
    cheap = size(s, worker=lo, current=0)
    dear = size(s, worker=hi, current=0)
    assert dear <= cheap  # a dearer spot offer never buys more workers
    assert size(s, objective="throughput", worker=lo, current=0) >= cheap  # speed first buys at least as many


def test_hysteresis_keeps_a_size_within_min_gain():
    # at the trainer's floor with 9 workers, 8 would be as fast: throughput keeps the fewest (8) only when
    # that is a real gain, which it is not (same speed): no change
    assert size(objective="throughput", current=9) == 9
    at_floor = StepSample(n_remote=8, step_s=121.0, gen_s=100.0, train_s=120.0, tokens=1_000_000)
    assert size(at_floor, objective="throughput", current=8) == 8


def test_deadline_buys_speed_only_when_needed():
    slack = size(steps_left=10, time_left_s=10 * 400.0, worker=30.0)  # 400 s a step: 0 workers do 620 s
    assert slack > 0  # even dear workers, since the deadline needs them
    loose = size(steps_left=10, time_left_s=10 * 1000.0, worker=30.0)
    assert loose == 0  # enough time without them: the cheapest way
    d = POLICY.decide(GEN_BOUND, FleetGoal("cost", 16, steps_left=10, time_left_s=10 * 60.0), 10.0, 1.0, 2)
    assert d.deadline_at_risk and d.workers == 8  # cannot be met: as fast as it gets, and says so


def test_budget_caps_the_fleet():
    # $8/h workers next to a $10/h trainer, 100 steps to go: 8 workers (120 s a step, $74/h) cost $247 to
    # finish, 6 workers (149 s, $58/h) $239, 2 workers (320 s, $26/h) $231, none (920 s, $10/h) $256.
    assert size(objective="throughput", worker=8.0) == 8
    assert size(objective="throughput", worker=8.0, steps_left=100, budget_left=240.0) == 6  # fastest that fits
    # nothing fits $200: the cheapest way per token
    assert size(objective="throughput", worker=8.0, steps_left=100, budget_left=200.0) == 2
    assert size(objective="throughput", worker=8.0, steps_left=100, budget_left=1000.0) == 8
