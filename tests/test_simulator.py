"""`rlboost simulate`: the replay runs the real policies on a virtual clock, deterministically and fast."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from rlboost.contracts.spec import parse_spec
from rlboost.providers.pricing import spot_offers, trainer_offer
from rlboost.providers.spot_market import AvailabilityTrace
from rlboost.simulator import PRESETS, simulate_job
from rlboost.simulator.presets import policy_from_spec
from rlboost.simulator.result import SimResult
from tests.conftest import run_cli


def job(**over) -> dict:
    raw = {
        "name": "simjob",
        "model": {"kind": "synthetic", "train_tokens_per_s": 4000},
        "algorithm": {
            "prompts_per_step": 16,
            "group_size": 8,
            "max_new_tokens": 512,
            "steps": 20,
            "warm_start_steps": 0,
        },
        "trainer": {"accelerators": "A100:1", "hourly_price": 4.0},
        "rollout": {
            "engine": "synthetic",
            "engine_batch": 64,
            "max_workers": 4,
            "candidates": [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.2, "on_demand_price": 3.6}],
            "synthetic": {"lengths": {"median_tokens": 60, "sigma": 0.8, "prompt_sigma": 0.5}},
        },
        "perf": {"A100": {"tokens_per_s": 800, "seq_tokens_per_s": 40, "ref_batch": 64}},
        "local": {"time_scale": 1.0, "notice_seconds": 2.0, "notice_fraction": 0.5},
        "simulate": {"boot_s": 5.0, "pull_s": 0.5, "reserved_pull_s": 0.2, "step_overhead_s": 0.5},
    }
    for k, v in over.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return raw


# capacity 4 with drops to 1 (at 60 s, 93 s, 127 s and 161 s, for 15 s each)
TRACE = AvailabilityTrace(
    [0.0, 60.0, 75.0, 93.0, 108.0, 127.0, 142.0, 161.0, 176.0, 3600.0], [4, 1, 4, 1, 4, 1, 4, 1, 4, 4], "t"
)


def run(spec, policies, trace=TRACE, **kw):
    return simulate_job(spec, trace, policies, trainer_offer(spec), spot_offers(spec), **kw)


def test_replay_is_deterministic_and_complete():
    spec = parse_spec(job())
    a = run(spec, [PRESETS["rlboost"]])[0]
    b = run(spec, [PRESETS["rlboost"]])[0]
    assert a.steps == b.steps == 20
    assert (a.trained_tokens, a.dollars, a.run_s, a.preemptions) == (
        b.trained_tokens,
        b.dollars,
        b.run_s,
        b.preemptions,
    )
    assert a.preemptions >= 3 and a.migrations > 0  # the drop at 60 s took workers mid-step
    assert [s["step"] for s in a.step_log] == list(range(20))


def test_every_policy_trains_the_same_tokens_and_spot_helps():
    spec = parse_spec(job())
    res = {
        r.policy.name: r
        for r in run(spec, [PRESETS[p] for p in ("on-demand", "spot-restart", "rlboost-rule", "rlboost-fixed")])
    }
    tokens = {r.trained_tokens for r in res.values()}
    assert len(tokens) == 1  # same prompts, same lengths: only time and money differ
    od = res["on-demand"]
    assert od.spot_dollars == 0 and od.preemptions == 0
    assert res["rlboost-fixed"].tokens_per_s > 1.3 * od.tokens_per_s  # spot capacity is used
    assert res["rlboost-fixed"].tokens_per_s >= res["spot-restart"].tokens_per_s
    assert res["spot-restart"].restarted_tokens > 0 and res["rlboost-fixed"].restarted_tokens == 0


def test_tail_batching_keeps_prompts_and_drops_tail_tokens():
    spec = parse_spec(job(algorithm={"steps": 12}))
    r = run(spec, [PRESETS["rlboost-tail"]])[0]
    assert r.steps == 12 and r.restarted_tokens > 0
    assert any(s["long"] for s in r.step_log)  # parked prompts came back as a long round


def test_policy_from_the_job_file_and_horizon():
    spec = parse_spec(job(rollout={"offload_policy": "rlboost", "dispatch_policy": "spread", "migration": False}))
    p = policy_from_spec(spec)
    assert (p.offload, p.dispatch, p.migration, p.spot) == ("rlboost", "spread", False, True)
    r = run(spec, [p], max_steps=10**9, horizon_s=300.0)[0]
    assert 0 < r.steps < 10**9 and r.job_s == pytest.approx(300.0)


def test_a_day_of_trace_runs_in_seconds():
    """A day of an LLM-sized job (built-in A100 model, minute-long steps) replays in seconds."""
    spec = parse_spec(
        job(
            algorithm={"max_new_tokens": 4096},
            rollout={"synthetic": {"lengths": {"median_tokens": 500, "sigma": 0.8, "prompt_sigma": 0.5}}},
            model={"train_tokens_per_s": 2500},
            perf={},
            simulate={"boot_s": 120, "pull_s": 5, "reserved_pull_s": 1, "step_overhead_s": 2},
        )
    )
    day = AvailabilityTrace([0.0, 3600.0 * 6, 3600.0 * 7, 86400.0], [4, 0, 4, 4], "day")
    t0 = time.process_time()
    r = run(spec, [PRESETS["rlboost-fixed"]], trace=day, max_steps=10**9)[0]
    took = time.process_time() - t0
    assert r.job_s == pytest.approx(86400.0) and r.steps > 500 and r.preemptions >= 4
    assert took < 45, f"a day took {took:.1f} CPU seconds"


def test_fleet_objectives_in_the_replay():
    """The simulator sizes the fleet with the controller's policy: `cost` releases workers that do not
    pay for themselves ($3/h A100 workers next to a $4/h trainer), `throughput` keeps every worker
    that makes the step faster."""
    cand = {"accelerator": "A100", "clouds": ["local"], "spot_price": 3.0, "on_demand_price": 3.6}
    spec = parse_spec(job(algorithm={"steps": 60}, rollout={"candidates": [cand]}))
    names = ("rlboost-fixed", "rlboost-cost", "rlboost-throughput")
    res = {r.policy.name: r for r in run(spec, [PRESETS[p] for p in names])}
    fixed, cost, fast = res["rlboost-fixed"], res["rlboost-cost"], res["rlboost-throughput"]
    assert cost.trained_tokens / cost.dollars > 1.5 * fixed.trained_tokens / fixed.dollars
    assert cost.spot_dollars < 0.5 * fixed.spot_dollars
    assert fast.tokens_per_s >= 0.98 * fixed.tokens_per_s


@pytest.mark.timeout(120)  # ~2 s here; before the fix it never returned
def test_a_week_of_trace_finishes():
    """Late in a long replay the clock's float spacing (~1e-10 s after a week) exceeds what is left of a
    response's decode time: the engine's next event landed on the same instant, made no progress, and was
    scheduled again, forever (`rlboost-rule` on a 48 h trace). A week of hour-long steps must replay."""
    spec = parse_spec(
        job(
            algorithm={"max_new_tokens": 4096},
            rollout={"synthetic": {"lengths": {"median_tokens": 500, "sigma": 0.8, "prompt_sigma": 0.5}}},
            model={"train_tokens_per_s": 100},
            perf={},
            simulate={"boot_s": 120, "pull_s": 5, "reserved_pull_s": 1, "step_overhead_s": 2},
        )
    )
    week = 7 * 86400.0
    h = 3600.0
    trace = AvailabilityTrace([0.0, 30 * h, 31 * h, 100 * h, 101 * h, week], [4, 0, 4, 1, 4, 4], "week")
    r = run(spec, [PRESETS["rlboost-rule"]], trace=trace, max_steps=10**9)[0]
    assert r.job_s == pytest.approx(week) and r.preemptions >= 4
    first_day = sum(1 for s in r.step_log if s["t0"] + s["step_s"] <= 86400.0)
    assert r.steps >= 6 * first_day  # the pace holds to the end (~86 steps a day)


def test_cli_prints_a_table_json_and_a_plot(tmp_path, home):
    import yaml

    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 30}, "data": [4, 4, 1, 4, 4, 4, 4, 4, 4, 4]}))
    jf = tmp_path / "job.yaml"
    jf.write_text(yaml.safe_dump(job(algorithm={"steps": 6})))
    out = run_cli("simulate", str(jf), "--trace", str(trace), "--json", "--plot", str(tmp_path / "p.png"), home=home)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    names = [r["policy"] for r in doc["results"]]
    assert names == ["on-demand", "spot-restart", "rlboost-rule", "rlboost"]
    assert doc["results"][0]["throughput_vs_on_demand"] == 1.0
    assert all(0 < r["trainer_busy_share"] <= 1 for r in doc["results"])
    assert (tmp_path / "p.png").stat().st_size > 1000
    table = run_cli("simulate", str(jf), "--trace", str(trace), "--policy", "rlboost", home=home)
    assert table.returncode == 0 and "rlboost" in table.stdout and "tokens/$" in table.stdout
    assert "busy" in table.stdout
    bad = run_cli("simulate", str(jf), "--policy", "magic", home=home)
    assert bad.returncode == 2 and "unknown policy" in bad.stderr


def test_plotted_throughput_is_a_rate_over_time_not_over_records():
    """A step of 6,000 tokens a minute, and the fleet changing a millisecond before each step ends (its
    own record, tokens unchanged): the line is 100 tokens/s. Counted over records, a window that began at
    such a change divided a step's tokens by a millisecond (peaks of 1.5 million tokens/s on p3)."""
    from rlboost.cli.sim_report import windowed_rate

    timeline = [(0.0, 0, 0)]
    for k in range(1, 121):
        timeline += [(60.0 * k - 0.001, k % 3, 6000 * (k - 1)), (60.0 * k, k % 3, 6000 * k)]
    r = SimResult(PRESETS["rlboost"], 120, 7200.0, 7200.0, 6000 * 120, 1.0, 0.5, 0.5, 0, 0, 0, 1.0, timeline)
    xs, rates = windowed_rate(r)
    assert len(xs) == len(rates) > 100 and xs == sorted(xs) and xs[-1] == pytest.approx(2.0)
    assert rates == pytest.approx([100.0] * len(rates), rel=1e-6)
    # on another clock (local.time_scale 360: trace hours, job seconds) the rate is the job's
    fast = SimResult(PRESETS["rlboost"], 120, 20.0, 20.0, 6000 * 120, 1.0, 0.5, 0.5, 0, 0, 0, 360.0,
                     [(t / 360, n, k) for t, n, k in timeline])
    assert windowed_rate(fast)[1] == pytest.approx([36_000.0] * len(rates), rel=1e-6)
    assert windowed_rate(replace(r, timeline=[(0.0, 0, 0)])) == ([], [])


def test_a_fleet_raised_after_a_step_launches_at_the_next_poll(monkeypatch):
    """The live controller sizes the fleet at the poll that sees a step and launches in that same poll.
    The replay skips polls that can change nothing: one must still come right after the size rises, on
    a market that never changes (before, the launch waited for the next trace change: here, never)."""
    from rlboost.rollout.policies import fleet

    plan = iter([0, 0, 0] + [2] * 100)  # release every worker after the first step, then ask for two

    def scripted(self, s, goal, *a, **k):
        n = next(plan)
        return fleet.FleetDecision(n, self.predict_step_s(s, n), why="scripted")

    monkeypatch.setattr(fleet.FleetPolicy, "decide", scripted)
    spec = parse_spec(job(algorithm={"steps": 8}))
    flat = AvailabilityTrace([0.0, 3600.0], [4, 4], "flat")
    r = run(spec, [PRESETS["rlboost-cost"]], trace=flat)[0]
    assert r.steps == 8
    decided = r.step_log[3]["t0"] + r.step_log[3]["step_s"]  # the fourth step's end: hold two
    p = spec.simulate.poll_s
    rises = [(t, n) for t, n, _ in r.timeline if t > decided - p and n > 0]
    # one launch per candidate per poll (reconcile_fleet), so the next poll and the one after
    assert rises[:2] == [(pytest.approx(decided, abs=p), 1), (pytest.approx(decided + p, abs=p), 2)], rises
