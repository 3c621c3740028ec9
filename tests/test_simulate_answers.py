"""`rlboost simulate` answers "what does spot save me": a recommendation first, a sweep over
max_workers x objectives (in parallel processes, the same numbers as one at a time), a clear error
when nothing trains, and plots whose every line is named."""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace

import pytest
import yaml

from rlboost.cli import sim_report as report
from rlboost.contracts.spec import parse_spec
from rlboost.providers.spot_market import AvailabilityTrace
from rlboost.simulator import PRESETS
from rlboost.simulator import cli as sim_cli
from rlboost.simulator.result import SimResult
from tests.conftest import run_cli
from tests.test_simulator import TRACE, job, run


def result(policy: str, *, tokens: int, run_s: float, trainer: float, spot: float) -> SimResult:
    return SimResult(
        policy=PRESETS[policy],
        steps=10,
        run_s=run_s,
        job_s=run_s,
        trained_tokens=tokens,
        dollars=trainer + spot,
        spot_dollars=spot,
        trainer_dollars=trainer,
        preemptions=0,
        migrations=0,
        restarted_tokens=0,
        time_scale=1.0,
    )


def test_recommendation_names_the_cheapest_and_the_fastest():
    base = result("on-demand", tokens=1000, run_s=100, trainer=10, spot=0)
    cheap = result("rlboost-cost", tokens=1000, run_s=80, trainer=8, spot=1)  # 1.25x speed, 1.11x tok/$
    fast = result("rlboost-throughput", tokens=1000, run_s=50, trainer=5, spot=6)  # 2x speed, 0.91x tok/$
    rec = report.recommend(base, [report.Choice("cheap", cheap), report.Choice("fast", fast)], 1.0)
    assert rec is not None and rec.cheapest.label == "cheap" and rec.fastest.label == "fast"
    text = rec.lines()
    assert text[0].startswith("Cheapest per token: cheap: 1.11x") and "at 1.25x its speed" in text[0]
    assert text[1].startswith("Fastest: fast: 2.00x") and len(text) == 2  # no "why": spot pays here


def test_when_spot_costs_more_it_says_why_and_the_price_that_pays():
    base = result("on-demand", tokens=1000, run_s=100, trainer=10, spot=0)  # 100 tokens/$
    # 5 % faster for 3 $ of spot: 95.2 tokens/$; at 2 $ of spot (2/3 of today's price) it breaks even
    slow = result("rlboost-cost", tokens=1000, run_s=95.238, trainer=8, spot=3)
    rec = report.recommend(base, [report.Choice("two workers", slow)], 1.5)
    assert rec is not None and rec.cheapest is None and rec.best_spot.label == "two workers"
    assert rec.breakeven_fraction() == pytest.approx(2 / 3)
    why = rec.lines()[-1]
    assert why.startswith("Why: spot workers add +5% tokens/s") and "the trainer is the bottleneck" in why
    assert "under 67% of today's price (about $1.00/h a worker, now $1.50)" in why
    # a spot result that trains no faster has no price at which it pays
    flat = result("rlboost-cost", tokens=1000, run_s=100, trainer=10, spot=1)
    assert "No spot price pays here" in report.recommend(base, [report.Choice("x", flat)], 1.0).lines()[-1]


def test_sweep_in_parallel_processes_matches_one_at_a_time():
    spec = parse_spec(job(algorithm={"steps": 6}))
    rp = replace(sim_cli.prepare(spec, None), trace=TRACE)
    base1, one = sim_cli.sweep(rp, [1, 4], jobs=1)
    base2, two = sim_cli.sweep(rp, [1, 4], jobs=2)
    pairs = [(1, "cost"), (1, "throughput"), (4, "cost"), (4, "throughput")]
    assert [(p.max_workers, p.objective) for p in two] == pairs
    key = [(p.result.steps, p.result.trained_tokens, round(p.result.dollars, 9), p.mean_workers) for p in one]
    assert key == [(p.result.steps, p.result.trained_tokens, round(p.result.dollars, 9), p.mean_workers) for p in two]
    assert base1.dollars == base2.dollars and all(p.mean_workers <= p.max_workers for p in two)
    assert two[0].mean_workers < two[2].mean_workers  # a bigger cap holds more on this trace
    # the busy share crosses the process boundary without the step log a sweep drops
    assert [p.result.trainer_busy_share for p in one] == [p.result.trainer_busy_share for p in two]
    assert all(0 < p.result.trainer_busy_share <= 1 for p in two) and not two[0].result.step_log


def test_policies_in_parallel_processes_match_one_at_a_time_and_report_progress(monkeypatch):
    import rlboost.simulator.core

    monkeypatch.setattr(rlboost.simulator.core, "PROGRESS_REPORTS", 2000)  # several reports from a short replay
    spec = parse_spec(job(algorithm={"steps": 6}))
    rp = replace(sim_cli.prepare(spec, None), trace=TRACE)
    policies = sim_cli.pick_policies(["rlboost", "rlboost-rule"], rp.spec)
    here = rp.simulate(policies)
    seen: dict[int, list[float]] = {}
    apart = sim_cli.simulate_policies(rp, policies, jobs=2, on_progress=lambda k, f: seen.setdefault(k, []).append(f))
    assert [r.policy.name for r in apart] == ["on-demand", "rlboost", "rlboost-rule"]  # in the order asked
    for a, b in zip(here, apart):
        assert (a.steps, a.trained_tokens, a.dollars, a.migrations, a.step_log) == (
            b.steps,
            b.trained_tokens,
            b.dollars,
            b.migrations,
            b.step_log,
        )
    # each replay reported from its process, moving forward, and ended at 1
    assert sorted(seen) == [0, 1, 2] and all(len(f) > 2 for f in seen.values())
    assert all(f == sorted(f) and any(0 < x < 1 for x in f) and f[-1] == 1.0 for f in seen.values())


def test_the_policy_help_names_every_preset():
    from rlboost.cli.commands import simulate

    assert (*PRESETS, "job") == simulate.SIM_POLICIES
    assert simulate.DEFAULT_SIM_POLICIES == sim_cli.DEFAULT_POLICIES


def test_a_job_whose_steps_outlast_the_trace_by_far_replays_the_trace():
    """`steps: 100000` on an 11 h trace replayed ~5,000 h of its last count: the README's first simulate
    command never returned. A job the trainer alone finishes within twice the trace still runs to its
    last step, holding the trace's last count, as a live job would."""
    short = AvailabilityTrace([0.0, 60.0, 600.0], [4, 1, 4], "ten minutes")  # the trainer alone: ~26 s a step
    endless = replace(sim_cli.prepare(parse_spec(job(algorithm={"steps": 100_000})), None), trace=short)
    endless = sim_cli.bound_to_trace(endless)
    assert endless.outlasts_h is not None and endless.outlasts_h > 500  # ~100,000 steps of ~26 s
    r = endless.replay(PRESETS["rlboost"])
    assert r.job_s == pytest.approx(600.0) and 0 < r.steps < 1000
    # asked for too few hours, it says that leaving --hours out replays the trace, not 100,000 steps
    sim = endless.spec.simulate.model_copy(update={"hours": 0.001})
    tiny = replace(endless, spec=endless.spec.model_copy(update={"simulate": sim}), hours=0.001)
    with pytest.raises(sim_cli.NoStepError, match=r"or leave --hours out to replay the whole trace \(0\.2 h\)$"):
        sim_cli.check_steps(tiny, tiny.simulate([PRESETS["on-demand"]]))
    # 30 steps need ~13 min of the trainer alone, under 2 x 10 min: all of them, the last count held
    finite = sim_cli.bound_to_trace(replace(endless, spec=parse_spec(job(algorithm={"steps": 30})), outlasts_h=None))
    assert finite.outlasts_h is None and finite.spec.simulate.hours is None
    done = finite.replay(PRESETS["rlboost"])
    assert done.steps == 30 and done.job_s > 600.0


def test_sweep_points_cover_the_job_and_twice_it():
    assert sim_cli.sweep_points(3) == [1, 2, 3, 4]
    assert sim_cli.sweep_points(4) == [1, 2, 4, 8]
    assert sim_cli.sweep_points(0) == [1, 2]


def test_workers_held_never_exceed_max_workers():
    # notice preemptions: a draining worker and its replacement overlap, but only one is held
    spec = parse_spec(job(local={"notice_fraction": 1.0}))
    r = run(spec, [PRESETS["rlboost-fixed"]])[0]
    assert r.preemptions > 0
    assert max(n for _, n, _ in r.timeline) == spec.rollout.max_workers


@pytest.fixture
def jobfile(tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 30}, "data": [4, 4, 1, 4, 4, 4, 4, 4, 4, 4]}))
    jf = tmp_path / "job.yaml"
    jf.write_text(yaml.safe_dump(job(algorithm={"steps": 6}, local={"trace": str(trace)})))
    return jf


def test_cli_sweep_prints_the_recommendation_first_then_the_table(jobfile, tmp_path, home):
    png = tmp_path / "sweep.png"
    out = run_cli("simulate", str(jobfile), "--sweep", "--sweep-workers", "1,4", "--plot", str(png), home=home)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("Cheapest per token: ") and lines[1].startswith("Fastest: objective ")
    assert "max_workers" in out.stdout and "throughput" in out.stdout and png.stat().st_size > 1000
    # the title names the trace as given, not the absolute path the spec resolved
    assert f"simjob: {os.path.relpath(tmp_path / 'trace.json')} (" in out.stdout
    doc = json.loads(
        run_cli("simulate", str(jobfile), "--sweep", "--sweep-workers", "2", "--json", home=home, check=True).stdout
    )
    assert [(r.get("max_workers"), r["policy"]) for r in doc["results"]] == [
        (None, "on-demand"),
        (2, "rlboost-cost"),
        (2, "rlboost-throughput"),
    ]
    assert doc["recommendation"]["fastest"]["setting"].startswith("objective ")
    bad = run_cli("simulate", str(jobfile), "--sweep", "--sweep-workers", "1,x", home=home)
    assert bad.returncode == 2 and "--sweep-workers" in bad.stderr


def test_cli_says_when_the_replay_trains_nothing_and_the_hours_that_would(jobfile, home):
    out = run_cli("simulate", str(jobfile), "--hours", "0.001", home=home)
    assert out.returncode == 2 and "no step finished in 0.001 h of trace" in out.stderr and out.stdout == ""
    # the hours it names are enough for every policy it replayed, and leaving --hours out runs the job
    hint = re.search(r"--hours ([0-9.]+) or more \((.+?) ends its first step", out.stderr)
    assert hint is not None, out.stderr
    assert "leave --hours out to run the job's" in out.stderr
    again = run_cli("simulate", str(jobfile), "--hours", hint[1], "--json", home=home)
    assert again.returncode == 0, again.stderr
    assert all(r["steps"] >= 1 for r in json.loads(again.stdout)["results"])


def test_deadline_verdict_names_who_meets_it_and_the_cheapest():
    base = result("on-demand", tokens=1000, run_s=3600 * 12, trainer=120, spot=0)  # 12 h: misses 10 h
    cheap = result("rlboost-cost", tokens=1000, run_s=3600 * 9.5, trainer=95, spot=10)
    fast = result("rlboost-throughput", tokens=1000, run_s=3600 * 8, trainer=80, spot=40)
    rows = [report.Choice("on-demand", base), report.Choice("cheap", cheap), report.Choice("fast", fast)]
    v = report.DeadlineVerdict.of(10.0, 10, rows)
    text = v.lines()
    assert text[0] == (
        "Deadline 10 h for 10 steps: met by 2 of 3 settings; the cheapest, cheap, finishes in 9.50 h for $105.00."
    )
    assert text[1] == "The trainer alone (on-demand) 12.00 h (misses it) for $120.00."
    assert [s["meets"] for s in v.as_json()["settings"]] == [False, True, True]
    # 7 h: nobody makes it; the fastest is named with its hours. More steps than replayed: not finished
    assert report.DeadlineVerdict.of(7.0, 10, rows).lines() == [
        "Deadline 7 h for 10 steps: cannot be met on this trace; the fastest, fast, needs 8.00 h."
    ]
    assert "no setting finished them" in report.DeadlineVerdict.of(7.0, 11, rows).lines()[0]


def test_simulate_and_dryrun_say_up_front_whether_a_deadline_can_be_met(tmp_path):
    # the trainer alone runs ~4 steps a minute here (tests/test_simulator.py's job); 1 minute for
    # 20 steps cannot be met, a day is met without spot
    for hours, verdict in ((1 / 60, "cannot be met"), (24.0, "met")):
        jf = tmp_path / "job.yaml"
        jf.write_text(yaml.safe_dump(job(algorithm={"steps": 20}, deadline_hours=hours)))
        (tmp_path / "trace.json").write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [3] * 600}))
        proc = run_cli("simulate", str(jf), "--trace", str(tmp_path / "trace.json"), "--json", home=tmp_path / "h")
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)["deadline"]
        assert doc["deadline_hours"] == hours and any(s["meets"] for s in doc["settings"]) == (verdict == "met")
        plan = run_cli("launch", str(jf), "--dryrun", home=tmp_path / "h")
        assert plan.returncode == 0, plan.stderr
        line = next(x for x in plan.stdout.splitlines() if x.startswith(f"deadline {hours:g} h:"))
        assert ("cannot be met" in line) == (verdict == "cannot be met"), line
