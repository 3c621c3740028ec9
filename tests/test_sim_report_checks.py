"""`rlboost simulate` refuses bad options before it replays anything (exit 2, one line naming the
option), never calls a spot setting slower than on-demand the fastest, and gives money as floats."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from rlboost.cli import sim_report as report
from rlboost.simulator import cli as sim_cli
from tests.test_simulate_answers import result
from tests.test_simulator import job


def test_plot_path_error_names_what_stops_the_write(tmp_path):
    assert report.plot_path_error(tmp_path / "x.png") is None
    missing = report.plot_path_error(Path("/nonexistent/dir/x.png"))
    assert missing == (
        "--plot /nonexistent/dir/x.png: no directory /nonexistent/dir; create it first, or give a path in an "
        "existing directory"
    )
    assert report.plot_path_error(tmp_path) == (
        f"--plot {tmp_path}: is a directory; give a file in it, e.g. --plot {tmp_path / 'simulate.png'}"
    )


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"hours": 0.0}, "--hours 0: must be > 0"),
        ({"hours": -1.0}, "--hours -1: must be > 0"),
        ({"hours": float("nan")}, "--hours nan: must be > 0"),
        ({"hours": float("inf")}, "--hours inf: must be a finite number"),
        ({"steps": -3}, "--steps -3: must be >= 0 (the steps to stop after; 0: no limit)"),
        ({"jobs": 0}, "--jobs 0: must be >= 1"),
        ({"constant_workers": -1}, "--constant-workers -1: must be >= 0"),
        ({"sweep_workers": "1,2"}, "--sweep-workers needs --sweep"),
    ],
)
def test_option_error_names_the_option_and_its_range(option, message):
    said = sim_cli.option_error(**option)
    assert said is not None and said.startswith(message), said


def test_option_error_lets_good_values_through():
    assert sim_cli.option_error() is None
    assert sim_cli.option_error(hours=0.01, steps=0, jobs=1, constant_workers=0) is None  # steps 0: no limit
    assert sim_cli.option_error(sweep=True, sweep_workers="1,2") is None


def test_cli_usage_errors_exit_2_before_anything_replays(tmp_path, home, monkeypatch):
    from typer.testing import CliRunner

    from rlboost.cli.main import app

    def replayed(*a, **k):
        raise AssertionError("a usage error replayed the job")

    monkeypatch.setattr(sim_cli, "prepare", replayed)
    monkeypatch.setattr(sim_cli, "simulate_policies", replayed)
    jf = tmp_path / "job.yaml"
    jf.write_text(yaml.safe_dump(job()))
    cases = [
        (["--hours", "0"], "error: --hours 0: must be > 0"),
        (["--hours", "-1"], "error: --hours -1: must be > 0"),
        (["--steps", "-3"], "error: --steps -3: must be >= 0"),
        (["--jobs", "0"], "error: --jobs 0: must be >= 1"),
        (["--sweep-workers", "1,2"], "error: --sweep-workers needs --sweep"),
    ]
    if importlib.util.find_spec("matplotlib") is not None:  # else --plot says it needs matplotlib
        bad = "/nonexistent/dir/x.png"
        cases.append((["--plot", bad, "--json"], f"error: --plot {bad}: no directory /nonexistent/dir; create it"))
    for args, message in cases:
        r = CliRunner().invoke(app, ["simulate", str(jf), *args], catch_exceptions=False)
        # stdout and stderr together: the one error line, no table or JSON (nothing replayed)
        assert r.exit_code == 2, (args, r.output)
        assert r.output.startswith(message) and len(r.output.strip().splitlines()) == 1, r.output


def test_on_demand_alone_is_fastest_when_every_spot_setting_is_slower():
    base = result("on-demand", tokens=1000, run_s=100, trainer=10, spot=0)  # 10 tokens/s
    slow = result("spot-restart", tokens=1000, run_s=125, trainer=12.5, spot=6)  # 0.80x speed, 0.54x tok/$
    rec = report.recommend(base, [report.Choice("spot-restart", slow)], 1.0)
    assert rec is not None and rec.fastest is None and rec.fastest_spot.label == "spot-restart"
    text = rec.lines()
    assert text[1] == (
        "Fastest: on-demand alone (no spot). The fastest spot setting, spot-restart: 0.80x on-demand's speed at "
        "0.54x its tokens/$."
    )
    assert text[2].startswith("Why: with spot workers it trains 20% fewer tokens/s at +48% dollars per hour")
    assert "the trainer is the bottleneck" not in text[2]
    doc = rec.as_json()
    assert doc["fastest"] is None and doc["cheapest"] is None
    assert doc["fastest_spot"] == {
        "setting": "spot-restart",
        "throughput_vs_on_demand": 0.8,
        "tokens_per_dollar_vs_on_demand": 0.5405,
    }
    assert doc["text"] == " ".join(text)
    # as fast as on-demand and dearer: on-demand still wins the tie; faster: the spot setting is named
    tie = result("rlboost", tokens=1000, run_s=100, trainer=10, spot=2)
    assert report.recommend(base, [report.Choice("tie", tie)], 1.0).fastest is None
    quick = result("rlboost", tokens=1000, run_s=90, trainer=9, spot=2)
    assert report.recommend(base, [report.Choice("quick", quick)], 1.0).fastest.label == "quick"


def test_results_json_gives_money_as_floats():
    base = result("on-demand", tokens=1000, run_s=100, trainer=10, spot=0)  # int dollars, as a sum of ints
    spot = result("rlboost", tokens=1000, run_s=90, trainer=9, spot=2.5)
    rows = json.loads(json.dumps(report.results_json([base, spot])))
    for row in rows:
        for key in ("dollars", "spot_dollars", "trainer_dollars", "tokens_per_dollar"):
            assert isinstance(row[key], float), (row["policy"], key, row[key])
    assert rows[0]["spot_dollars"] == 0.0
