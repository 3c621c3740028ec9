"""Tables at 80 columns (issue 40): a column narrows by folding its long ids, never by splitting a word
("on-demand trainer" read as "traine" / "r"). Rendered with a rich Console(width=80)."""

from __future__ import annotations

import io

from rich.console import Console

from rlboost.cli.reports import render_cost, render_status
from rlboost.cli.state import StateStore
from rlboost.cli.tables import WORD_MAX, add_columns, narrow_table
from tests.test_cli_output import NAME, _job_with_long_ids


def _render(thing) -> str:
    c = Console(width=80, file=io.StringIO(), force_terminal=False)
    thing(c) if callable(thing) else c.print(thing)
    return c.file.getvalue()


def _split_words(out: str, cells: list[str]) -> list[str]:
    """The cells' words of up to WORD_MAX characters that no rendered line holds whole."""
    lines = out.splitlines()
    words = {w for cell in cells for w in cell.split() if len(w) <= WORD_MAX}
    return sorted(w for w in words if not any(w in ln for ln in lines))


def test_a_crowded_table_folds_ids_and_keeps_words_whole():
    headers = ("instance", "kind", "where", "state", "job", "zone", "accel", "ver", "tok/s")
    row = (
        f"w0042-{NAME}-17",
        "on-demand trainer",
        "skypilot/us-central1-a/A100-80GB:8",
        "preempted\n(controller dead)",
        NAME,
        "europe-west4-a",
        "A100-80GB:8",
        "12",
        "1234.5",
    )
    table = narrow_table("workers")
    add_columns(table, *headers, numbers=("ver", "tok/s"))
    table.add_row(*row)
    out = _render(table)
    assert all(len(ln) <= 80 for ln in out.splitlines()), out
    assert "…" not in out
    assert _split_words(out, [*headers, *row]) == [], out
    # the ids still fold rather than being cut
    assert "".join(ln.split()[0] for ln in out.splitlines()[3:] if ln.strip() and not ln.startswith(" ")).startswith(
        "w0042-"
    )


def test_status_and_cost_report_keep_words_whole_at_80_columns(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("RLBOOST_HOME", str(home))
    _job_with_long_ids(home)
    store = StateStore()
    for render, ref in ((render_status, None), (render_status, NAME), (render_cost, NAME)):
        out = _render(lambda c, render=render, ref=ref: render(store, ref, c))
        assert all(len(ln) <= 80 for ln in out.splitlines()), out
        cells = ["on-demand trainer" if render is render_status and ref else "on-demand", "running", "spot", "local"]
        assert _split_words(out, cells) == [], out
