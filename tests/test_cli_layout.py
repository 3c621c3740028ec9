"""The CLI's layout (README, "A command is a module"): every command is a module of rlboost/cli/commands/,
the entry module only builds the app and registers them, and no module of the CLI is a big room."""

from __future__ import annotations

from pathlib import Path

import rlboost.cli
from rlboost.cli import main

CLI = Path(rlboost.cli.__file__).parent


def test_every_command_lives_in_a_module_of_its_own() -> None:
    where = {c.name or c.callback.__name__: c.callback.__module__ for c in main.app.registered_commands}
    assert {"launch", "status", "cost-report", "down", "gc", "rm", "logs", "simulate", "check"} <= set(where)
    assert all(m.startswith("rlboost.cli.commands.") for m in where.values()), where
    shared = {m for m in where.values() if list(where.values()).count(m) > 1}
    assert shared == {"rlboost.cli.commands.controller_process"}  # _controller and _node-controller only


def test_the_entry_module_only_wires_and_no_cli_module_is_a_big_room() -> None:
    assert len(Path(main.__file__).read_text().splitlines()) <= 300
    big = {p.relative_to(CLI).as_posix(): n for p in CLI.rglob("*.py") if (n := len(p.read_text().splitlines())) > 700}
    assert big == {}, f"modules over 700 lines: split what reads as its own room ({big})"
