"""`rlboost check`: which providers this machine can launch with."""

from __future__ import annotations

import json

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from rlboost.cli.commands.common import AsJson
from rlboost.cli.output import console
from rlboost.cli.tables import add_columns, narrow_table


def check(as_json: AsJson = False) -> None:
    """Which providers this machine can launch with: do their libraries import, are credentials found."""
    from rlboost.contracts.provider_kinds import provider_names
    from rlboost.providers import provider_check

    results = [provider_check(p) for p in provider_names()]
    if as_json:
        print(json.dumps(results, indent=2))
        return
    table = narrow_table("providers (credentials from files and environment only; nothing is called)")
    add_columns(table, "provider", "ready", "libraries", "credentials")
    for r in results:
        libs = ", ".join(f"{m} {'ok' if ok else 'missing'}" for m, ok in r["libraries"].items())
        creds = [f"{c}: {where or 'none'}" for c, where in r["credentials"].items()]
        creds += [f"{c}: see `sky check`" for c in r["unchecked_clouds"]]
        table.add_row(
            r["provider"],
            "[green]yes[/]" if r["ready"] else "[red]no[/]",
            escape(libs),
            escape("\n".join(creds) or "not needed"),
        )
    console.print(table)
    # the fixes are commands and variable names to copy: under the table, wrapped between words, never
    # folded inside a narrow cell; one item per fix, with the providers it readies
    fixes: dict[str, list[str]] = {}
    for r in results:
        for problem in r["problems"]:
            fixes.setdefault(problem, []).append(r["provider"])
    if fixes:
        console.print("\nto fix:", highlight=False)
        items = Table.grid(padding=(0, 1))
        items.add_column(justify="right", width=3)
        items.add_column(overflow="fold")
        for problem, providers in fixes.items():
            items.add_row("-", Text(f"{problem} (for {', '.join(providers)})"))
        console.print(items, highlight=False)
