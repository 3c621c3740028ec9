"""Where the CLI prints, and how a command fails: one console for output, one for errors, shared by
every command (rlboost/cli/commands/) and the helpers they call."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

# The terminal's width, or $COLUMNS, or 80 when piped; no colours unless stdout is a terminal (rich
# decides); progress lines name no source file. Tables fold long cells (ids, names) rather than cut them.
console = Console(log_path=False)
err = Console(stderr=True)


def fail(msg: str, code: int = 1) -> NoReturn:
    # messages quote user and provider text (`[local]`, paths, log lines): never markup
    err.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def examples(*lines: str) -> str:
    """A command's --help epilog: one example a line."""
    return "\n".join(("Examples:", *(f"  {line}" for line in lines)))
