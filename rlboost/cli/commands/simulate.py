"""`rlboost simulate`: what would spot save? Parses the options and prints; the replays themselves are
rlboost/simulator/cli.py's."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Annotated

import typer

from rlboost.cli.commands.common import AsJson
from rlboost.cli.output import console, err, examples, fail
from rlboost.contracts.spec import JobSpec, SpecError, load_spec
from rlboost.providers.pricing import PricingError

EXAMPLES = examples(
    "rlboost simulate examples/simulate/aws-p3-v100.yaml",
    "rlboost simulate job.yaml --trace trace.csv --hours 12 --policy rlboost --json",
    "rlboost simulate job.yaml --sweep --plot sweep.png",
    "rlboost simulate job.yaml --sweep --sweep-trainer H100:4,H100:8",
)

# simulator.PRESETS' names and simulator.cli.DEFAULT_POLICIES, written out: importing the simulator (numpy
# and all) would slow every command's start for a help line; a test keeps them the same
SIM_POLICIES = (
    "on-demand",
    "sync",
    "spot-restart",
    "rlboost-rule",
    "rlboost",
    "rlboost-fixed",
    "rlboost-cost",
    "rlboost-throughput",
    "rlboost-tail",
    "job",
)
DEFAULT_SIM_POLICIES = ("on-demand", "spot-restart", "rlboost-rule", "rlboost")


def simulate(
    job_file: Annotated[Path, typer.Argument(help="the job YAML")],
    trace: Annotated[
        Path | None,
        typer.Option(
            help="availability trace (Bamboo CSV, GCP count lines, JSON count series) or a shipped one, "
            "bundled:traces/p3-trace.csv; default: local.trace"
        ),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(help=f"{', '.join(SIM_POLICIES)} (repeatable; default: {', '.join(DEFAULT_SIM_POLICIES)})"),
    ] = None,
    catalog: Annotated[
        Path | None,
        typer.Option(
            help="a SkyPilot vms.csv to price from, or bundled:aws_vms.csv / bundled:gcp_vms.csv "
            "(overrides local.catalog)"
        ),
    ] = None,
    hours: Annotated[
        float | None,
        typer.Option(
            help="hours of trace to replay (default: the job's steps; the trace, where they outlast it by far)"
        ),
    ] = None,
    steps: Annotated[
        int | None, typer.Option(help="stop after this many steps (default: the job's; 0: no limit)")
    ] = None,
    lengths: Annotated[
        Path | None, typer.Option(help="sample response lengths from a recorded run (rollouts.jsonl)")
    ] = None,
    constant_workers: Annotated[
        int | None,
        typer.Option(help="a constant spot market: exactly N workers available all along (instead of a trace)"),
    ] = None,
    sweep: Annotated[
        bool, typer.Option("--sweep", help="replay max_workers 1, 2, 4, ... x objectives cost and throughput")
    ] = False,
    sweep_workers: Annotated[
        str | None, typer.Option(help="the max_workers values --sweep tries, comma-separated (e.g. 1,2,4,8)")
    ] = None,
    sweep_trainer: Annotated[
        str | None,
        typer.Option(
            help="trainer shapes --sweep also tries, ACCELERATOR:GPUS comma-separated (e.g. H100:4,H100:8); "
            "recommends the cheapest trainer + fleet meeting rollout.objective (and deadline_hours)"
        ),
    ] = None,
    jobs: Annotated[
        int | None, typer.Option(help="replays (policies, sweep points) run in parallel processes (default: CPU count)")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="write a PNG: throughput and spot workers over time (--sweep: by max_workers)")
    ] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="override a job-file field, KEY.PATH=VALUE (a YAML scalar), e.g. --set algorithm.max_staleness=1; "
            "repeatable; validated with the file",
        ),
    ] = None,
    as_json: AsJson = False,
) -> None:
    """What would spot save? Replay a spot trace and prices through the scheduling policies on a virtual clock."""
    from rlboost.cli import sim_report as report
    from rlboost.providers.spot_market import TraceError
    from rlboost.simulator import cli as sim_cli

    # usage errors before anything loads or replays
    wrong = sim_cli.option_error(
        hours=hours,
        steps=steps,
        jobs=jobs,
        constant_workers=constant_workers,
        sweep=sweep,
        sweep_workers=sweep_workers,
        sweep_trainer=sweep_trainer,
    )
    if wrong:
        fail(wrong, 2)
    try:
        spec = load_spec(job_file, overrides or [])
    except SpecError as e:
        fail(str(e), 2)
    if plot is not None and importlib.util.find_spec("matplotlib") is None:
        fail("--plot needs matplotlib: pip install 'rlboost[plot]'", 2)
    if plot is not None and (unwritable := report.plot_path_error(plot)):
        fail(unwritable, 2)
    if sweep and policy:
        fail("--sweep replays objectives cost and throughput by max_workers: leave --policy out", 2)
    from rlboost.simulator import trainer_sweep

    if sweep_trainer is not None and (local := trainer_sweep.sweep_trainer_error(spec)):
        fail(local, 2)
    t0 = time.monotonic()
    try:
        points = _sweep_workers(sweep_workers) if sweep_workers else None
        shapes = trainer_sweep.parse_trainers(sweep_trainer, spec) if sweep_trainer is not None else None
        # a local job whose model runs here measures this machine first (~10 s): say so meanwhile
        measuring = (
            err.status("calibrating this machine for a local job (its model's rates and timings, ~10 s)")
            if not as_json and sim_cli.needs_calibration(spec)
            else contextlib.nullcontext()
        )
        with measuring:
            rp = sim_cli.prepare(
                spec,
                trace,
                catalog=catalog,
                hours=hours,
                lengths=lengths,
                steps=(10**9 if steps == 0 else steps),
                constant_workers=constant_workers,
            )
        from rlboost.rollout.scheduling import cores_note, most_workers

        cores = rp.spec.simulate.cpu_cores
        if not as_json:
            if rp.calibration is not None:
                err.print(rp.calibration.describe(), markup=False, highlight=False)
            if note := cores_note(rp.spec, cores):
                err.print(note, markup=False, highlight=False)
            if rp.outlasts_h is not None:
                err.print(_outlasts_note(rp), markup=False, highlight=False)
        base, swept, on_policy = None, [], None
        if sweep:
            most = most_workers(rp.spec, cores) if cores is not None else None
            base, swept = _run_sweep(
                rp, points or sim_cli.sweep_points(rp.spec.rollout.max_workers, most), jobs, shapes
            )
            results = [base, *(p.result for p in swept)]
            choices = [report.Choice(p.label, p.result) for p in swept]
        else:
            picked = sim_cli.pick_policies(policy, rp.spec)
            results = _run_policies(rp, picked, jobs)
            choices = [report.Choice(_policy_setting(r.policy, rp.spec), r) for r in results]
            # with staleness, each policy also strictly on-policy: what k buys on this trace
            on_policy = _run_policies(rp.on_policy(), picked, jobs) if rp.spec.algorithm.max_staleness else None
        sim_cli.check_steps(rp, results)
    except (PricingError, TraceError, ValueError) as e:
        fail(str(e), 2)
    took = time.monotonic() - t0
    replayed = max(r.job_s for r in results) * results[0].time_scale / 3600
    trace_h = rp.trace.duration / 3600
    # a replay longer than its trace holds the last count (the market does not wrap around)
    length = (
        f" ({trace_h:.1f} h trace{', its last count held after' if replayed > trace_h + 0.05 else ''})"
        if len(set(rp.trace.counts)) > 1
        else ""
    )
    shown = f"{replayed:.1f} h" if replayed >= 1 else f"{replayed * 60:.0f} min"
    title = f"{spec.name}: {_shown_path(rp.trace.source)}{length}, {shown} replayed in {took:.1f}s"
    rec = report.recommend(results[0], choices, min((o.hourly_price for o in rp.spots), default=0.0))
    job_trainer = trainer_sweep.job_shape(rp.spec) if shapes is not None else None
    base_label = "on-demand" if job_trainer is None else f"trainer {job_trainer} alone"
    sized = (
        _pick_trainer(rp.spec, [report.Choice(base_label, base), *choices])
        if job_trainer is not None and base is not None
        else None
    )
    verdict = (
        report.DeadlineVerdict.of(
            spec.deadline_hours,
            rp.spec.algorithm.steps,
            [report.Choice(base_label, base), *choices] if base is not None else choices,
        )
        if spec.deadline_hours is not None
        else None
    )
    if as_json:
        doc: dict = {"title": title, "recommendation": rec.as_json() if rec else None}
        doc["deadline"] = verdict.as_json() if verdict else None
        if sized is not None:
            doc["trainer"] = sized.as_json()
        doc["trainer_alone_hours"] = None if rp.outlasts_h is None else round(rp.outlasts_h, 1)
        if rp.calibration is not None:
            doc["calibration"] = rp.calibration.as_json()
        doc["results"] = report.sweep_json(base, swept, job_trainer) if sweep else report.results_json(results)
        doc["max_staleness"] = rp.spec.algorithm.max_staleness
        if on_policy is not None:
            doc["on_policy_results"] = report.results_json(on_policy)
        print(json.dumps(doc, indent=2))
    else:
        said = [*(rec.lines() if rec else []), *(verdict.lines() if verdict else []), *(sized.lines() if sized else [])]
        if on_policy is not None:
            said += report.staleness_lines(rp.spec.algorithm.max_staleness, results, on_policy)
        for line in said:
            console.print(line, markup=False, highlight=False)
        table = report.sweep_table(base, swept, title, job_trainer) if sweep else report.results_table(results, title)
        if shapes is not None:  # each shape's $/h and its source: a comparison across sources says so
            table.caption = f"{table.caption}; {trainer_sweep.price_note(rp, shapes)}"
        console.print(table)
    if plot is not None:
        try:
            if sweep:
                report.plot_sweep(base, swept, plot, title)
            else:
                report.plot(results, plot, title)
        except OSError as e:  # checked up front; the disk can still fill or the directory go
            fail(f"--plot {plot}: {e.strerror or e}", 1)
        if not as_json:
            console.print(f"plot: {plot}", markup=False)


def _outlasts_note(rp) -> str:
    from rlboost.simulator.cli import OUTLAST

    steps, trace_h = rp.spec.algorithm.steps, rp.trace.duration / 3600
    return (
        f"the job's {steps:,} steps would take the trainer alone ~{rp.outlasts_h:,.0f} h, over {OUTLAST:g}x this "
        f"{trace_h:.1f} h trace: replaying the trace (--hours for longer, its last count held; --steps to stop "
        "after fewer)"
    )


def _pick_trainer(spec: JobSpec, choices):
    """The cheapest trainer + fleet meeting rollout.objective (and deadline_hours) of `choices`: every sweep
    setting and the job's trainer alone."""
    from rlboost.cli.sim_trainer import pick_trainer

    return pick_trainer(choices, spec.rollout.objective, deadline_h=spec.deadline_hours, steps=spec.algorithm.steps)


def _sweep_workers(text: str) -> list[int]:
    try:
        pts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--sweep-workers {text!r}: give whole numbers separated by commas, e.g. 1,2,4,8") from None
    if not pts or pts[0] < 1:
        raise ValueError(f"--sweep-workers {text!r}: give at least one value, each 1 or more (0 is on-demand)")
    return pts


def _replay_bars():
    """Progress bars on stderr while replays run (none when it is not a terminal); they vanish after."""
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn())
    return Progress(*columns, console=err, transient=True, disable=not err.is_terminal)


# seconds between two piped progress lines (the last, every replay done, always prints)
PIPED_PROGRESS_EVERY = 10.0


def _replay_lines(names: list[str]):
    """Progress as plain lines on stderr, where bars cannot draw (rlboost/cli/progress.py)."""
    from rlboost.cli.progress import ReplayLines

    lines = ReplayLines(err, names, every=PIPED_PROGRESS_EVERY)
    started = f"simulate: {len(names)} replays to run ({', '.join(names)})"
    err.print(started, markup=False, highlight=False, soft_wrap=True)
    return lines


def _run_policies(rp, policies, jobs: int | None):
    """One bar per policy, each at the fraction of its replay done (trace hours or steps, whichever ends it)."""
    from rlboost.simulator import cli as sim_cli

    if not err.is_terminal:
        lines = _replay_lines([f"policy {p.name}" for p in policies])
        return sim_cli.simulate_policies(rp, policies, jobs=jobs, on_progress=lines.update)
    with _replay_bars() as bars:
        ids = [bars.add_task(f"replaying {p.name}", total=1.0) for p in policies]
        return sim_cli.simulate_policies(
            rp, policies, jobs=jobs, on_progress=lambda k, f: bars.update(ids[k], completed=f)
        )


def _run_sweep(rp, points: list[int], jobs: int | None, shapes: list[str] | None = None):
    """One bar for the whole sweep: the sum of its replays' fractions done. `shapes`: --sweep-trainer's."""
    from functools import partial

    from rlboost.simulator import cli as sim_cli
    from rlboost.simulator import trainer_sweep

    if shapes is None:
        order = sim_cli.sweep_order(points)
        names = [f"sweep max_workers {w} {o}" for w, o in order]
        run = partial(sim_cli.sweep, rp, points, jobs=jobs)
    else:
        # each shape priced before anything replays: a shape with no price fails at once
        for t in shapes:
            trainer_sweep.with_trainer(rp, t)
        each = trainer_sweep.trainer_sweep_order(shapes, points, rp.spec.trainer.accelerators)
        names = [
            f"sweep trainer {t} alone" if o == trainer_sweep.ALONE else f"sweep trainer {t} max_workers {w} {o}"
            for t, w, o in each
        ]
        run = partial(trainer_sweep.sweep_trainers, rp, shapes, points, jobs=jobs)
    n = len(names) + 1  # and the on-demand baseline
    if not err.is_terminal:
        lines = _replay_lines([*names, "sweep on-demand"])
        return run(on_progress=lines.update)
    done = [0.0] * n

    def moved(k: int, fraction: float) -> None:
        done[k] = fraction  # a replay's reports arrive in order (rlboost/simulator/parallel.py)
        finished = sum(1 for f in done if f >= 1.0)
        bars.update(bar, completed=sum(done), description=f"sweep: {finished}/{n} replays done")

    with _replay_bars() as bars:
        bar = bars.add_task(f"sweep: 0/{n} replays done", total=n)
        return run(on_progress=moved)


def _policy_setting(p, spec: JobSpec) -> str:
    """A policy row as a setting a user can write down: its name, and the objective it sized the fleet by."""
    objective = spec.rollout.objective if p.objective == "job" else p.objective
    if not p.spot:
        return p.name
    fleet = f"objective {objective}" if objective else "fixed fleet"
    return f"{p.name} ({fleet}, max_workers {spec.rollout.max_workers})"


def _shown_path(source: str) -> str:
    """A trace file as the user would type it here (relative), not the absolute path the spec resolved."""
    return os.path.relpath(source) if Path(source).is_absolute() else source
