"""`rlboost cost-report`: what a job (or every job) cost, and what spot saved."""

from __future__ import annotations

from typing import Annotated

import typer

from rlboost.cli.commands.common import AsJson, show_report
from rlboost.cli.output import examples

EXAMPLES = examples("rlboost cost-report", "rlboost cost-report my-job --json")


def cost_report(
    job: Annotated[
        str | None, typer.Argument(help="a job id, or a name (its newest run); every job and the total when omitted")
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Spend per spot/on-demand and accelerator, savings, $ per step, $ per 1M tokens."""
    from rlboost.cli.reports import cost_json, render_cost

    show_report(job, as_json, cost_json, render_cost)
