"""Asking before a command spends money or deletes records: `launch` on a cloud provider, `rm`, and
`gc --older-than`. On a terminal the command shows what it will do and asks; anywhere else (a script,
CI, a pipe) it refuses unless `--yes` says so up front: nothing waits on an answer that cannot come."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rlboost.cli.output import console, fail

Yes = Annotated[
    bool, typer.Option("--yes", "-y", help="go ahead without asking (needed where stdin is not a terminal)")
]


def on_terminal() -> bool:
    """Can the user answer here? (stdin is a terminal; tests replace this to answer)"""
    return sys.stdin is not None and sys.stdin.isatty()


def confirm(summary: list[str], question: str, *, yes: bool) -> None:
    """Print `summary` and ask `question` (default no); refuse where nobody can answer. `yes`: go ahead."""
    if yes:
        return
    if not on_terminal():
        fail(f"{question.rstrip('?')}: stdin is not a terminal to ask on; pass --yes to go ahead", 2)
    for line in summary:
        console.print(line, markup=False, highlight=False)
    if not typer.confirm(question, default=False):
        fail("not confirmed; nothing was done", 1)
