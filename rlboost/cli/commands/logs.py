"""`rlboost logs`: a job's controller and trainer logs (rlboost/cli/logs.py reads and follows them)."""

from __future__ import annotations

from typing import Annotated

import typer

from rlboost.cli.commands.common import named_job
from rlboost.cli.output import console, err, examples, fail
from rlboost.cli.state import StateStore

EXAMPLES = examples("rlboost logs my-job -f", "rlboost logs my-job --instance w0003-my-job -n 200")


def logs(
    job: Annotated[str, typer.Argument(help="the job: its id or name (newest run)")],
    instance: Annotated[
        str | None, typer.Option(help="one instance's log, e.g. a worker (default: controller + trainers)")
    ] = None,
    lines: Annotated[int, typer.Option("-n", help="how many lines of each log")] = 40,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new lines until the job ends")] = False,
    show_all: Annotated[bool, typer.Option("--all", help="include aiohttp.access request lines")] = False,
) -> None:
    """The job's controller log (detached runs) and its trainer's, restarts included (local provider)."""
    from rlboost.cli import logs as job_logs

    store = StateStore()
    j = named_job(store, job)
    try:
        srcs = job_logs.readers(store, j, instance)
    except job_logs.NoLog as e:
        fail(str(e))
    if not srcs and not follow:
        fail(f"job {j.name} (id {j.id}) has no logs here (only local jobs and detached controllers keep them)")
    read = job_logs.show_tail(console, srcs, lines, show_all)
    if follow:
        why = job_logs.follow(job_logs.Follower(console, show_all, offsets=dict(read)), store, j, instance)
        err.print(why, markup=False, highlight=False)
