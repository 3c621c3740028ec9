"""`rlboost simulate` piped (issue 40): progress as plain lines on stderr, at a bounded rate, while
stdout keeps only the results (the table, or the --json document)."""

from __future__ import annotations

import io
import json

import yaml
from rich.console import Console

from rlboost.cli.progress import ReplayLines
from tests.conftest import run_cli
from tests.test_simulator import job


def _lines(every: float = 10.0):
    now = [0.0]
    out = io.StringIO()
    lines = ReplayLines(Console(file=out, width=200), ["policy a", "policy b"], every=every, clock=lambda: now[0])
    return lines, now, out


def test_lines_are_bounded_by_the_clock_and_the_last_always_prints():
    lines, now, out = _lines()
    lines.update(0, 0.1)  # the first report prints
    for i in range(50):  # many reports inside 10 s: nothing more
        now[0] = 0.1 * i
        lines.update(1, i / 100)
    assert out.getvalue().splitlines() == ["simulate: 0/2 replays done (5%)"]
    now[0] = 10.0
    lines.update(0, 1.0)  # a replay finished, and 10 s passed
    now[0] = 10.5
    lines.update(1, 1.0)  # the last: prints within the 10 s
    lines.update(1, 1.0)  # once
    assert out.getvalue().splitlines() == [
        "simulate: 0/2 replays done (5%)",
        "simulate: policy a done, 1/2 replays done (74%)",
        "simulate: policy b done, 2/2 replays done (100%)",
    ]


def test_piped_simulate_reports_progress_on_stderr_and_keeps_stdout_the_results(tmp_path, home):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 30}, "data": [4, 4, 1, 4, 4, 4, 4, 4, 4, 4]}))
    jf = tmp_path / "job.yaml"
    jf.write_text(yaml.safe_dump(job(algorithm={"steps": 6}, local={"trace": str(trace)})))
    got = run_cli("simulate", str(jf), "--json", "--jobs", "2", home=home, check=True)
    doc = json.loads(got.stdout)  # stdout: the JSON document alone
    assert [r["policy"] for r in doc["results"]] == ["on-demand", "spot-restart", "rlboost-rule", "rlboost"]
    progress = [ln for ln in got.stderr.splitlines() if ln.startswith("simulate: ")]
    assert progress[0].startswith("simulate: 4 replays to run (policy on-demand, "), got.stderr
    assert progress[-1].endswith("4/4 replays done (100%)"), got.stderr
    assert "\x1b" not in got.stderr
    plain = run_cli("simulate", str(jf), "--sweep", "--sweep-workers", "1,2", home=home, check=True)
    assert "simulate: " not in plain.stdout and "max_workers" in plain.stdout
    sweep = [ln for ln in plain.stderr.splitlines() if ln.startswith("simulate: ")]
    assert sweep[0].startswith("simulate: 5 replays to run (sweep max_workers 2 "), plain.stderr
    assert sweep[-1].endswith("5/5 replays done (100%)"), plain.stderr
