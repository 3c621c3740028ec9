"""`rlboost gc`: find and terminate orphans; `--older-than` removes old ended jobs. Its report of
what it found (`report_gc`) is also what `down --all` and a launch over a dead job print."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from rlboost.cli.confirm import Yes, confirm
from rlboost.cli.output import console, err, examples, fail
from rlboost.cli.state import StateStore

if TYPE_CHECKING:
    from rlboost.cli.reconcile import GcResult

EXAMPLES = examples("rlboost gc", "rlboost gc --older-than 7d --yes")


def gc(
    wait: Annotated[float, typer.Option(help="seconds to wait for each provider to confirm terminations")] = 600.0,
    older_than: Annotated[
        str | None,
        typer.Option(help="also remove ended jobs older than this (e.g. 7d, 12h): records and run dirs"),
    ] = None,
    all_stores: Annotated[
        bool,
        typer.Option(
            "--all-stores",
            help="also terminate rlboost instances of OTHER state stores (other machines, other "
            "RLBOOST_HOMEs, colleagues on the same cloud account) in the clouds and regions this "
            "store's jobs used, after asking (-y/--yes: do not ask); a job whose controller may still "
            "run is kept and said why; without it they are listed and left alone",
        ),
    ] = False,
    yes: Yes = False,
) -> None:
    """Find and terminate orphans: instances of this store's jobs whose controller is gone (crashed,
    killed) that a provider still lists under the job's id, or that the state store still calls live.
    Instances of other stores are listed, never touched unless --all-stores (asked first; a job whose
    controller may still run is kept all the same). `--older-than 7d` also
    removes ended jobs older than that, after asking (-y/--yes: do not ask)."""
    from rlboost.cli.housekeeping import NotRemovable, ended_before, parse_age, remove_job

    try:
        age = parse_age(older_than) if older_than is not None else None
    except ValueError as e:
        fail(f"--older-than: {e}", 2)
    store = StateStore()
    if all_stores:  # another store's job is someone's: never ended unasked
        confirm(
            [
                "rlboost instances of OTHER state stores in the clouds this store's jobs used are terminated, "
                "except those of a job whose controller may still run"
            ],
            "terminate other stores' instances?",
            yes=yes,
        )
    if age is not None:  # asked before the sweep: a refusal changes nothing
        confirm(
            [f"ended jobs older than {older_than} are deleted (records and run directories), after the orphan sweep"],
            f"remove ended jobs older than {older_than}?",
            yes=yes,
        )
    results = run_gc(store, wait, all_stores=all_stores)
    report_gc(results)
    if age is not None:
        removed = []
        for j in ended_before(store, age):
            try:
                remove_job(store, j)
                removed.append(f"{j.name} (id {j.id})")
            except NotRemovable as e:
                err.print(f"kept: {e}", markup=False, highlight=False)
        console.print(
            f"removed {len(removed)} ended job(s) older than {older_than}"
            + (f": {', '.join(removed)}" if removed else ""),
            markup=False,
            highlight=False,
        )
    if not results.clean:
        raise typer.Exit(1)


def run_gc(store: StateStore, wait: float = 600.0, *, all_stores: bool = False) -> GcResult:
    from rlboost.cli.reconcile import gc as reconcile_all

    return reconcile_all(store, wait_s=wait, all_stores=all_stores)


def report_gc(results: GcResult) -> None:
    if not results.jobs and not results.foreign:
        console.print("no orphans: every recorded instance is accounted for")
    for k in results.foreign_kept:
        t = k.foreign.instance
        console.print(
            f"kept {t.instance_id} of another store's job {t.job or '?'} (store {t.store or '?'}): {k.why}",
            markup=False,
            highlight=False,
        )
    for r in [*results.jobs, *results.foreign_ended]:
        if r.error:
            err.print(f"[bold red]error:[/] job {escape(r.job)}: {escape(r.error)}", highlight=False)
            continue
        line = f"job {r.job}: terminated {len(r.terminated)} orphan(s)"
        if r.unconfirmed:
            line += f"; NOT confirmed gone: {', '.join(r.unconfirmed)} (run `rlboost gc` again)"
        console.print(line, markup=False)
    ended = {i for r in results.foreign_ended for i in r.terminated}
    ended |= {k.foreign.instance.instance_id for k in results.foreign_kept}  # said above
    left = [f for f in results.foreign if f.instance.instance_id not in ended]
    if left:
        console.print(
            f"{len(left)} instance(s) of other rlboost state stores (another machine or RLBOOST_HOME, or a "
            "colleague on the same cloud account) left alone; `rlboost gc --all-stores` terminates them:",
            markup=False,
            highlight=False,
        )
        for f in left:
            t = f.instance
            console.print(
                f"  {f.provider}: {t.instance_id} (job {t.job or '?'}, uid {t.uid or 'none'}, store {t.store or '?'})",
                markup=False,
                highlight=False,
            )
