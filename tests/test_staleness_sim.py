"""algorithm.max_staleness in a replay (rollout/policies/staleness.py): with k >= 1 the next step generates
on older weights while the trainer trains, never more than k versions behind; k = 0 is the on-policy
replay unchanged."""

from __future__ import annotations

from itertools import accumulate, pairwise

import pytest

from rlboost.contracts.spec import parse_spec
from rlboost.rollout.policies.staleness import added_s, may_begin, staleness
from rlboost.simulator import PRESETS
from tests.test_simulator import job, run


def test_the_gate_lets_a_step_run_at_most_k_versions_ahead():
    assert may_begin(3, 3, 0) and not may_begin(4, 3, 0)  # on-policy: step n waits for version n
    assert may_begin(4, 3, 1) and not may_begin(5, 3, 1)
    assert may_begin(5, 3, 2) and staleness(5, 3) == 2 and staleness(3, 3) == 0


def test_a_step_adds_the_time_from_its_start_or_from_the_previous_steps_end():
    assert added_s(10.0, 25.0, 8.0) == 15.0  # began after the previous step ended: start -> end
    assert added_s(10.0, 25.0, 18.0) == 7.0  # began while it trained: only what it added after


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
    # step_s is the time a step adds to the run (as the live StepRecord's, which the fleet sizer reads):
    # the steps follow each other, so step n ends at the first start + the first n step_s; a step
    # starts generating before the one before it has trained
    t0 = [s["t0"] for s in off.step_log]
    ends = list(accumulate((s["step_s"] for s in off.step_log), initial=t0[0]))[1:]
    assert ends[-1] - t0[0] == pytest.approx(off.run_s, abs=1e-2)  # first start -> last end
    assert any(b0 < a1 for a1, b0 in zip(ends, t0[1:]))
    # strictly on-policy it is each step's own start -> end
    assert all(b["t0"] == pytest.approx(a["t0"] + a["step_s"], abs=2e-3) for a, b in pairwise(on.step_log))
    for k in (1, 2):
        assert max(s["staleness"] for s in replays[k]["rlboost-fixed"].step_log) <= k


def test_without_remote_engines_nothing_runs_ahead(replays):
    """The trainer alone: its own engine shares its GPUs, so a step cannot generate while one trains."""
    on, off = replays[0]["on-demand"], replays[1]["on-demand"]
    assert [s["staleness"] for s in off.step_log] == [0] * 8
    assert [{k: v for k, v in s.items() if k != "staleness"} for s in off.step_log] == on.step_log


def test_simulate_says_what_the_jobs_staleness_buys_over_on_policy(tmp_path, home):
    """`simulate --set algorithm.max_staleness=1`: each policy also replayed strictly on-policy, the
    comparison said in a line and given in --json."""
    import json

    import yaml

    from tests.conftest import run_cli

    jf = tmp_path / "job.yaml"
    jf.write_text(yaml.safe_dump(job(algorithm={"steps": 6})))
    args = ("simulate", str(jf), "--constant-workers", "4", "--policy", "rlboost-fixed")
    out = run_cli(*args, "--set", "algorithm.max_staleness=1", home=home, check=True)
    assert "max_staleness 1 against strictly on-policy (k=0) on the same trace: on-demand 1.00x" in out.stdout
    assert "rlboost-fixed " in out.stdout.split("max_staleness 1 against")[1]
    doc = json.loads(run_cli(*args, "--set", "algorithm.max_staleness=1", "--json", home=home, check=True).stdout)
    plain = json.loads(run_cli(*args, "--json", home=home, check=True).stdout)
    assert doc["max_staleness"] == 1 and plain["max_staleness"] == 0 and "on_policy_results" not in plain
    # the on-policy replay is the plain one, number for number
    assert doc["on_policy_results"] == plain["results"]
    stale = {r["policy"]: r for r in doc["results"]}
    assert stale["rlboost-fixed"]["trainer_busy_share"] > plain["results"][1]["trainer_busy_share"]
    assert "max_staleness" not in run_cli(*args, home=home, check=True).stdout


def test_the_trainers_engine_generates_again_once_the_trainer_waits():
    """Offloaded to train an older step, the trainer's engine takes the generating step back when the
    trainer has nothing left to train. Found on the shipped g4dn trace: with responses split up front
    (spot-restart) the engine's share waited for it while spot workers came and went, and the replay
    trained 6 steps in 10.8 h."""
    from pathlib import Path

    from rlboost.contracts.spec import load_spec
    from rlboost.simulator import cli as sim_cli

    spec = load_spec(Path("examples/simulate/aws-g4dn-t4.yaml"), ["algorithm.max_staleness=1"])
    rp = sim_cli.prepare(spec, None, catalog=None, hours=None, lengths=None, steps=12, constant_workers=None)
    stale = rp.replay(PRESETS["spot-restart"])
    on = rp.on_policy().replay(PRESETS["spot-restart"])
    assert on.steps == stale.steps == 12
    assert stale.run_s < 1.5 * on.run_s  # stuck, it ran to the trace's end: 34x
