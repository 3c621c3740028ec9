"""`simulate --plot` (issue 40): a dollars panel beside throughput and workers, and every y axis from 0.
The figures are built by the functions `simulate` saves (sim_report.figure / sweep_figure) on the Agg
backend and inspected, never shown."""

from __future__ import annotations

import pytest

from rlboost.cli import sim_report as report
from rlboost.contracts.spec import parse_spec
from rlboost.simulator import PRESETS
from tests.test_simulator import job, run

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def results():
    spec = parse_spec(job(algorithm={"steps": 6}))
    return run(spec, [PRESETS["on-demand"], PRESETS["spot-restart"], PRESETS["rlboost"]])


def test_policy_plot_has_a_dollars_panel_and_every_axis_from_zero(results, tmp_path, monkeypatch):
    import matplotlib

    built = []
    figure = report.figure
    monkeypatch.setattr(report, "figure", lambda *a: built.append(figure(*a)) or built[-1])
    report.plot(results, tmp_path / "p.png", "t")  # what `simulate --plot` calls
    assert matplotlib.get_backend().lower() == "agg"
    assert (tmp_path / "p.png").stat().st_size > 1000
    [fig] = built
    axes = fig.get_axes()
    assert [ax.get_ylabel() for ax in axes] == ["trained tokens/s", "spot workers held", "dollars"]
    for ax in axes:
        assert ax.get_ylim()[0] == 0, ax.get_ylabel()
    dollars = axes[2]
    # one stacked bar per policy: trainer, then spot on top, summing to the replay's dollars
    tops = {}
    for patch in dollars.patches:
        x = round(patch.get_x(), 6)
        tops[x] = max(tops.get(x, 0.0), patch.get_y() + patch.get_height())
    assert sorted(tops.values()) == pytest.approx(sorted(float(r.dollars) for r in results))
    labels = [t.get_text() for t in dollars.texts]
    assert all(lbl.endswith("/1M tok") and lbl.startswith("$") for lbl in labels) and len(labels) == len(results)
    assert labels[0] == f"${report.per_million(results[0]):,.2f}/1M tok"


def test_sweep_plot_has_a_dollars_panel_and_every_axis_from_zero(results):
    from rlboost.simulator.cli import SweepPoint

    base, spot = results[0], results[2]
    points = [SweepPoint(n, o, spot, 1.0) for n in (1, 2) for o in ("cost", "throughput")]
    fig = report.sweep_figure(base, points, "t")
    axes = fig.get_axes()
    assert [ax.get_ylabel() for ax in axes] == ["speed vs on-demand", "tokens/$ vs on-demand", "$ per 1M tokens"]
    for ax in axes:
        assert ax.get_ylim()[0] == 0, ax.get_ylabel()
