"""`rlboost status`: jobs, workers, weight versions, throughput, preemptions."""

from __future__ import annotations

from typing import Annotated

import typer

from rlboost.cli.commands.common import AsJson, show_report
from rlboost.cli.output import examples

EXAMPLES = examples("rlboost status", "rlboost status my-job", "rlboost status 12 --json")


def status(
    job: Annotated[
        str | None, typer.Argument(help="a job id, or a name (its newest run); all jobs when omitted")
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Jobs, workers, weight versions, throughput, preemptions."""
    from rlboost.cli.reports import render_status, status_json

    show_report(job, as_json, status_json, render_status)
