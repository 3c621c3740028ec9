"""`rlboost rm`: remove an ended job's records and run directory."""

from __future__ import annotations

from typing import Annotated

import typer

from rlboost.cli.commands.common import named_job
from rlboost.cli.confirm import Yes, confirm
from rlboost.cli.output import console, fail
from rlboost.cli.state import StateStore


def rm(job: Annotated[str, typer.Argument(help="an ended job: its id or name (newest run)")], yes: Yes = False) -> None:
    """Remove an ended job: its records (status, ledger) and its run directory. Asks first (-y/--yes: do not ask)."""
    from rlboost.cli.housekeeping import NotRemovable, job_removable, remove_job

    store = StateStore()
    j = named_job(store, job)
    try:
        job_removable(store, j)  # a job that cannot be removed is refused before anything is asked
    except NotRemovable as e:
        fail(str(e))
    ref = f"{j.name} (id {j.id})"
    confirm([f"job {ref}: its records and run directory are deleted"], f"remove job {ref}?", yes=yes)
    try:
        remove_job(store, j)
    except NotRemovable as e:
        fail(str(e))
    console.print(f"removed job {j.name} (id {j.id})", markup=False, highlight=False)
