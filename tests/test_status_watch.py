"""`rlboost status --watch` (issue 40): the status view again every N seconds. Piped, each refresh is a
new snapshot after a timestamp line; `--json --watch` is one JSON object a line; Ctrl-C exits 0. The
waits go through rlboost.cli.watch.sleep, replaced here: no test waits on real time."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlboost.cli import watch
from rlboost.cli.main import app
from rlboost.cli.state import StateStore


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("RLBOOST_HOME", str(h))
    with StateStore(h / "state.db") as store:
        job = store.create_job("watched", "name: watched\n", "local")
        store.update_job(job, status="running", started_at=1000.0, step=1, reward=0.25, clock=60.0)
    return h


def _sleeps(monkeypatch, home, steps: list[int] | None = None) -> list[float]:
    """Record each wait; between refreshes the job moves on a step (so each snapshot is a new state)."""
    waited: list[float] = []

    def fake(s: float) -> None:
        waited.append(s)
        if steps:
            with StateStore(home / "state.db") as store:
                store.update_job(store.list_jobs()[0].id, step=steps.pop(0))

    monkeypatch.setattr(watch, "sleep", fake)
    return waited


def test_piped_watch_prints_a_snapshot_per_refresh_after_a_timestamp(home, monkeypatch):
    waited = _sleeps(monkeypatch, home, steps=[2, 3])
    r = CliRunner().invoke(app, ["status", "--watch", "-n", "2", "--count", "3"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert waited == [2.0, 2.0]  # between refreshes, not after the last
    stamps = [ln for ln in r.output.splitlines() if ln.startswith("--- ") and ln.endswith(" UTC ---")]
    assert len(stamps) == 3, r.output
    assert r.output.count("rlboost jobs") == 3
    parts = r.output.split("--- ")[1:]
    assert ["1/" in parts[0], "2/" in parts[1], "3/" in parts[2]] == [True, True, True], r.output


def test_watch_defaults_to_five_seconds(home, monkeypatch):
    waited = _sleeps(monkeypatch, home)
    r = CliRunner().invoke(app, ["status", "--watch", "--count", "2"])
    assert r.exit_code == 0, r.output
    assert waited == [5.0]


def test_json_watch_prints_one_object_per_line_per_refresh(home, monkeypatch):
    _sleeps(monkeypatch, home, steps=[7])
    r = CliRunner().invoke(app, ["status", "--json", "--watch", "--count", "2"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert len(lines) == 2, r.output
    docs = [json.loads(ln) for ln in lines]
    assert [d["jobs"][0]["step"] for d in docs] == [1, 7]


def test_ctrl_c_ends_the_watch_with_status_0(home, monkeypatch):
    def interrupted(s: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(watch, "sleep", interrupted)
    r = CliRunner().invoke(app, ["status", "--watch"])  # no --count: only Ctrl-C ends it
    assert r.exit_code == 0, r.output
    assert r.output.count("rlboost jobs") == 1


def test_terminal_watch_redraws_in_place(home, monkeypatch):
    """On a terminal: rich.live redraws the view rather than printing snapshot after snapshot."""
    import io

    from rich.console import Console

    _sleeps(monkeypatch, home, steps=[2])
    out = io.StringIO()
    term = Console(file=out, force_terminal=True, width=80, log_path=False)
    from rlboost.cli.commands.common import sync_node_jobs
    from rlboost.cli.reports import render_status, status_json

    watch.watch_report(None, False, status_json, render_status, term, interval=1, refresh=sync_node_jobs, count=2)
    text = out.getvalue()
    assert "UTC ---" not in text  # no snapshot separators
    assert "\x1b[" in text and "rlboost jobs" in text
    assert "\x1b[1A" in text or "\x1b[2K" in text  # the cursor moves back up over the last view


def test_unknown_job_fails_under_watch(home, monkeypatch):
    _sleeps(monkeypatch, home)
    r = CliRunner().invoke(app, ["status", "nope", "--watch", "--count", "1"])
    assert r.exit_code == 1
