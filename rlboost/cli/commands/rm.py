"""`rlboost rm`: remove an ended job's records and run directory."""

from __future__ import annotations

from typing import Annotated

import typer

from rlboost.cli.commands.common import named_job
from rlboost.cli.output import console, fail
from rlboost.cli.state import StateStore


def rm(job: Annotated[str, typer.Argument(help="an ended job: its id or name (newest run)")]) -> None:
    """Remove an ended job: its records (status, ledger) and its run directory."""
    from rlboost.cli.housekeeping import NotRemovable, remove_job

    store = StateStore()
    j = named_job(store, job)
    try:
        remove_job(store, j)
    except NotRemovable as e:
        fail(str(e))
    console.print(f"removed job {j.name} (id {j.id})", markup=False, highlight=False)
