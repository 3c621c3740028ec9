"""`rlboost status`: jobs, workers, weight versions, throughput, preemptions."""

from __future__ import annotations

from typing import Annotated

import typer

from rlboost.cli.commands.common import AsJson, show_report
from rlboost.cli.output import examples, fail

EXAMPLES = examples(
    "rlboost status",
    "rlboost status my-job",
    "rlboost status 12 --json",
    "rlboost status --watch",
    "rlboost status my-job --watch -n 2",
)


def status(
    job: Annotated[
        str | None, typer.Argument(help="a job id, or a name (its newest run); all jobs when omitted")
    ] = None,
    as_json: AsJson = False,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            "-w",
            help="redraw every --interval seconds until Ctrl-C (piped: a snapshot each time; --json: a line each)",
        ),
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", "-n", help="seconds between --watch refreshes", metavar="SECONDS")
    ] = 5.0,
    count: Annotated[int | None, typer.Option(hidden=True, help="--watch: stop after this many refreshes")] = None,
) -> None:
    """Jobs, workers, weight versions, throughput, preemptions."""
    from rlboost.cli.reports import render_status, status_json

    if interval <= 0:
        fail(f"--interval {interval:g}: give a number of seconds above 0", 2)
    show_report(job, as_json, status_json, render_status, watch=interval if watch else None, count=count)
