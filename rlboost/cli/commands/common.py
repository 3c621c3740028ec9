"""What several commands share: the `--json` option, naming a job, and the body of the two reports
(`status` and `cost-report`: the same argument, the same refresh of node-controlled jobs, JSON or tables)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console

from rlboost.cli.jobs_ref import resolve_job
from rlboost.cli.output import console, fail
from rlboost.cli.state import JobRow, StateStore, UnknownJobError

AsJson = Annotated[bool, typer.Option("--json", help="machine-readable output")]


def named_job(store: StateStore, ref: str) -> JobRow:
    """The job a command's argument names (an id, or a name: its newest run); an error if none."""
    try:
        return resolve_job(store, ref)
    except UnknownJobError as e:
        fail(str(e))


def sync_node_jobs(store: StateStore, ref: str | None) -> None:
    """Refresh the local copies of jobs whose controller runs on their trainer node (those named)."""
    from rlboost.cli.node_client import sync_all

    try:
        jobs = [resolve_job(store, ref)] if ref is not None else store.list_jobs()
    except UnknownJobError:
        return  # the report says so
    sync_all(store, jobs)


def show_report(
    ref: str | None,
    as_json: bool,
    as_doc: Callable[[StateStore, str | None], dict[str, Any]],
    render: Callable[[StateStore, str | None, Console], None],
    *,
    watch: float | None = None,
    count: int | None = None,
) -> None:
    """One job (`ref`) or all of them, as JSON or as tables; node-controlled jobs refreshed first.
    `watch` (seconds): again every `watch` seconds until Ctrl-C (`count`: that many times), watch.py."""
    if watch is not None:
        from rlboost.cli.watch import watch_report

        try:
            watch_report(ref, as_json, as_doc, render, console, interval=watch, refresh=sync_node_jobs, count=count)
        except UnknownJobError as e:
            fail(str(e))
        return
    store = StateStore()
    sync_node_jobs(store, ref)
    try:
        if as_json:
            print(json.dumps(as_doc(store, ref), indent=2, default=str))
        else:
            render(store, ref, console)
    except UnknownJobError as e:
        fail(str(e))
