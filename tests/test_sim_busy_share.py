"""The trainer's busy share in a replay (SimResult.trainer_busy_share): seconds training over the seconds
the trainer is billed, the same span trainer_dollars prices."""

from __future__ import annotations

import pytest

from rlboost.contracts.spec import parse_spec
from rlboost.simulator import PRESETS
from tests.test_simulator import job, run

POLICIES = ("on-demand", "sync", "rlboost-fixed")


@pytest.fixture(scope="module")
def results():
    spec = parse_spec(job(algorithm={"steps": 8}))
    return spec, {r.policy.name: r for r in run(spec, [PRESETS[p] for p in POLICIES])}


def test_busy_share_is_the_steps_training_seconds_over_the_trainers_billed_seconds(results):
    spec, res = results
    for r in res.values():
        assert r.steps == 8
        train_s = sum(s["train_s"] for s in r.step_log)
        assert r.trainer_train_s == pytest.approx(train_s, abs=1e-3 * r.steps)  # step_log rounds to ms
        # the denominator is what the trainer's dollars pay for, at its hourly price
        billed = r.trainer_dollars / spec.trainer.hourly_price * 3600 / r.time_scale
        assert r.trainer_billed_s == pytest.approx(billed, rel=1e-9)
        assert r.trainer_busy_share == pytest.approx(train_s / billed, rel=1e-4)
        assert 0 < r.trainer_busy_share <= 1


def test_spot_workers_raise_it_and_a_synchronous_step_waits_for_generation(results):
    _, res = results
    od, fixed, sync = res["on-demand"], res["rlboost-fixed"], res["sync"]
    # the same tokens at the same training rate: the overlapped policies train for as long
    assert fixed.trainer_train_s == pytest.approx(od.trainer_train_s, rel=1e-3)
    # ... in fewer billed seconds, with spot workers generating for it
    assert fixed.trainer_busy_share > od.trainer_busy_share
    # a synchronous step trains only after its last response: generation is billed, not training
    gen_s = sum(s["gen_s"] for s in sync.step_log)
    assert sync.trainer_busy_share <= 1 - gen_s / sync.trainer_billed_s + 1e-6


def test_a_warm_start_is_billed_without_training():
    spec = parse_spec(job(algorithm={"steps": 4}))
    warm = parse_spec(job(algorithm={"steps": 4}, simulate={"warm_start_s": 100.0}))
    [a] = run(spec, [PRESETS["on-demand"]])
    [b] = run(warm, [PRESETS["on-demand"]])
    assert b.trainer_train_s == pytest.approx(a.trainer_train_s, rel=1e-9)
    # billed from serving: the warm start adds its seconds outside the steps (its first step is shorter:
    # the reserved engine booted during the warm start, not during the step)
    def outside(r) -> float:
        return r.trainer_billed_s - sum(s["step_s"] for s in r.step_log)

    assert outside(b) == pytest.approx(outside(a) + 100.0, abs=1e-2)
    assert b.trainer_busy_share < a.trainer_busy_share
