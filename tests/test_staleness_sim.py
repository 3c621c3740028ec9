"""algorithm.max_staleness in a replay (rollout/policies/staleness.py): with k >= 1 the next step generates
on older weights while the trainer trains, never more than k versions behind; k = 0 is the on-policy
replay unchanged."""

from __future__ import annotations

from itertools import pairwise

import pytest

from rlboost.contracts.spec import parse_spec
from rlboost.rollout.policies.staleness import may_begin, staleness
from rlboost.simulator import PRESETS
from tests.test_simulator import job, run


def test_the_gate_lets_a_step_run_at_most_k_versions_ahead():
    assert may_begin(3, 3, 0) and not may_begin(4, 3, 0)  # on-policy: step n waits for version n
    assert may_begin(4, 3, 1) and not may_begin(5, 3, 1)
    assert may_begin(5, 3, 2) and staleness(5, 3) == 2 and staleness(3, 3) == 0


def _spec(k: int):
    return parse_spec(job(algorithm={"steps": 8, "max_staleness": k}))


@pytest.fixture(scope="module")
def replays():
    policies = [PRESETS["on-demand"], PRESETS["rlboost-fixed"]]
    return {k: {r.policy.name: r for r in run(_spec(k), policies)} for k in (0, 1, 2)}


def test_k0_replays_as_before_and_records_no_staleness(replays):
    for r in replays[0].values():
        assert all("staleness" not in s for s in r.step_log)


def test_with_remote_engines_the_next_step_generates_while_the_trainer_trains(replays):
    on, off = replays[0]["rlboost-fixed"], replays[1]["rlboost-fixed"]
    lags = [s["staleness"] for s in off.step_log]
    assert set(lags) <= {0, 1} and lags[0] == 0 and lags.count(1) >= len(lags) - 2
    assert off.steps == on.steps == 8
    assert off.trainer_busy_share > on.trainer_busy_share
    assert off.run_s < on.run_s  # the same steps, sooner
    # a step starts generating before the one before it has trained: their spans overlap
    spans = [(s["t0"], s["t0"] + s["step_s"]) for s in off.step_log]
    assert any(b0 < a1 for (_, a1), (b0, _) in pairwise(spans))
    for k in (1, 2):
        assert max(s["staleness"] for s in replays[k]["rlboost-fixed"].step_log) <= k


def test_without_remote_engines_nothing_runs_ahead(replays):
    """The trainer alone: its own engine shares its GPUs, so a step cannot generate while one trains."""
    on, off = replays[0]["on-demand"], replays[1]["on-demand"]
    assert [s["staleness"] for s in off.step_log] == [0] * 8
    assert [{k: v for k, v in s.items() if k != "staleness"} for s in off.step_log] == on.step_log
