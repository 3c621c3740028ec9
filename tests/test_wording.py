"""Counts read as English (issue 40): "up to 1 spot worker", never "up to 1 spot workers"."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from rlboost.cli.progress import JobProgress
from rlboost.contracts.spec import parse_spec
from rlboost.contracts.wording import counted, spot_workers
from rlboost.rollout.scheduling import cores_note
from tests.test_simulator import job

ROOT = Path(__file__).resolve().parents[1] / "rlboost"


def test_counted_is_singular_for_one_only():
    assert [spot_workers(n) for n in (0, 1, 2)] == ["0 spot workers", "1 spot worker", "2 spot workers"]
    assert counted(3, "replica", "replicas") == "3 replicas"


def test_no_message_pastes_a_number_before_a_plural_spot_workers():
    """A count in a message goes through spot_workers(): `{n} spot workers` reads wrong for n = 1."""
    pasted = re.compile(r"\{[^{}]*\}\s*spot workers")
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in ROOT.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pasted.search(line)
    ]
    assert not found, found


def test_cores_note_and_the_launch_bar_say_one_spot_worker():
    spec = parse_spec(job(rollout={"max_workers": 4}))
    note = cores_note(spec, 2.0)
    assert note is not None and note.startswith("at most 1 spot worker of max_workers 4:"), note
    out = io.StringIO()
    bar = JobProgress(Console(file=out, width=200, force_terminal=False), steps=3)
    bar.update({"reward": 0.5, "version": 2}, ["w1"], 0)
    task = bar.progress.tasks[bar.train]
    assert "· 1 spot worker ·" in task.fields["info"], task.fields["info"]
