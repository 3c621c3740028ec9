"""`rlboost`: launch / status / cost-report / down / logs."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from rlboost_cli.pricing import PricingError, spot_offers, trainer_offer
from rlboost_cli.spec import JobSpec, SpecError, load_spec, spec_to_yaml
from rlboost_cli.state import JobExistsError, StateStore, UnknownJobError, rlboost_home

if TYPE_CHECKING:
    from providers.spot_market import SpotMarket
    from rlboost_cli.pricing import Offer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="RL post-training on an on-demand trainer plus harvested spot GPUs.",
)
console = Console()
err = Console(stderr=True)

ACTIVE = ("pending", "running")


def fail(msg: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _store() -> StateStore:
    return StateStore()


def _market(spec: JobSpec):
    from providers.spot_market import BUILTIN_TRACE, SpotMarket, TraceError, load_trace

    loc = spec.local
    try:
        trace = load_trace(loc.trace) if loc.trace else BUILTIN_TRACE
    except TraceError as e:
        fail(f"local.trace: {e}", 2)
    if loc.capacity_scale != 1.0:
        trace = trace.scaled(loc.capacity_scale)
    return SpotMarket(trace, notice_fraction=loc.notice_fraction, seed=spec.algorithm.seed)


def _check_provider(spec: JobSpec, dryrun: bool = False) -> None:
    """Clouds, regions, SDKs and (unless it is a dry run) credentials: before anything is launched."""
    from providers import PreflightError, preflight

    try:
        preflight(spec, check_credentials=not dryrun)
    except PreflightError as e:
        fail(str(e), 2)


def _spent_before(name: str) -> float:
    """Dollars already spent by earlier runs of this job name (0 without a state file)."""
    if not (rlboost_home() / "state.db").exists():
        return 0.0
    from rlboost_cli.ledger import summarize

    store = _store()
    return sum(summarize(store, j.id).total_dollars for j in store.list_jobs() if j.name == name)


def _check_budget(spec: JobSpec) -> None:
    if spec.budget_usd is None:
        return
    spent = _spent_before(spec.name)
    if spent >= spec.budget_usd:
        fail(
            f"budget_usd: ${spec.budget_usd:.2f} is already spent (earlier runs of job {spec.name!r} cost "
            f"${spent:.2f}; see `rlboost cost-report {spec.name}`); raise budget_usd or use another job name",
            2,
        )


@app.command()
def launch(
    job_file: Annotated[
        str, typer.Argument(help="the job YAML, e.g. examples/local.yaml (with --resume: the job's name or YAML)")
    ],
    dryrun: Annotated[bool, typer.Option("--dryrun", help="print the plan (offers, prices) and exit")] = False,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="continue a job whose controller died or was stopped: reattach to what still runs, "
            "relaunch the rest; the trainer continues from its last checkpoint",
        ),
    ] = False,
    record_rollouts: Annotated[
        bool, typer.Option(help="write every response and the final weights to the trainer's run dir")
    ] = False,
) -> None:
    """Provision the trainer, train, and keep bidding for spot rollout workers until the job ends."""
    if resume:
        _resume(job_file, record_rollouts)
        return
    try:
        spec = load_spec(Path(job_file))
    except SpecError as e:
        fail(str(e), 2)
    _check_provider(spec, dryrun)
    if not dryrun:
        _check_budget(spec)
    t_offer, s_offers, prices = _offers(spec)  # before any record exists: bad prices or traces fail here
    market = _market(spec)
    if dryrun:
        _print_plan(spec, t_offer, s_offers, prices)
        return
    store = _store()
    try:
        job_id = store.create_job(spec.name, spec_to_yaml(spec), spec.provider)
    except JobExistsError:
        job_id = _replace_dead_job(store, spec)
    if job_id is None:
        job = store.get_job(spec.name)
        fail(
            f"job {spec.name!r} is already {job.status} (controller pid {job.controller_pid}); "
            f"watch it with `rlboost status {spec.name}`, stop it with `rlboost down {spec.name}`, "
            "or give the new job another name"
        )
    store.update_job(job_id, controller_pid=os.getpid())  # at once: `rlboost gc` tells live from dead by it
    run_dir = rlboost_home() / "jobs" / f"{spec.name}-{job_id}"
    run_dir.mkdir(parents=True, mode=0o700)
    (run_dir / "spec.yaml").write_text(spec_to_yaml(spec))
    token = secrets.token_urlsafe(32)
    token_file = run_dir / "token"
    token_file.touch(mode=0o600)
    token_file.write_text(token)
    console.print(
        f"[bold]rlboost[/] job [cyan]{spec.name}[/] (#{job_id}) on provider [cyan]{spec.provider}[/]: "
        f"{spec.algorithm.steps} GRPO steps × {spec.algorithm.prompts_per_step} prompts × "
        f"group {spec.algorithm.group_size}, up to {spec.rollout.max_workers} spot workers"
    )
    _run_controller(spec, store, job_id, run_dir, token, record_rollouts, (t_offer, s_offers), market, resume=False)


def _offers(spec: JobSpec):
    from providers import price_lookup

    prices = price_lookup(spec)
    try:
        return trainer_offer(spec, prices), spot_offers(spec, prices), prices
    except PricingError as e:
        fail(str(e), 2)


def _run_controller(
    spec: JobSpec,
    store: StateStore,
    job_id: int,
    run_dir: Path,
    token: str,
    record_rollouts: bool,
    offers: tuple[Offer, list[Offer]],
    market: SpotMarket,
    resume: bool,
) -> None:
    from providers import make_provider
    from rlboost_cli.controller import Controller

    t_offer, s_offers = offers
    try:
        provider = make_provider(spec, run_dir, market=market)
    except Exception as e:
        store.update_job(job_id, status="failed", ended_at=time.time(), error=str(e))
        fail(f"provider {spec.provider}: {e}", 2)
    cloud = spec.provider != "local"
    ctl = Controller(
        spec=spec,
        store=store,
        job_id=job_id,
        run_dir=run_dir,
        provider=provider,
        token=token,
        trainer_offer=t_offer,
        spot_offers=s_offers,
        console=console,
        record_rollouts=record_rollouts,
        # a cloud node boots, installs and starts in minutes; capacity comes back in minutes too
        trainer_boot_timeout_s=1800.0 if cloud else 300.0,
        backoff_cap_s=600.0 if cloud else 30.0,
        teardown_wait_s=600.0 if cloud else 60.0,
    )
    status = ctl.run(resume=resume)
    provider.close()
    job = store.job_by_id(job_id)
    _print_outcome(store, job_id)
    if status != "succeeded":
        fail(f"job {spec.name} {status}: {job.error}")


def _resume(ref: str, record_rollouts: bool) -> None:
    """`launch --resume NAME|FILE`: the same job id, run dir, token and ledger; a new controller."""
    from rlboost_cli.reconcile import controller_alive
    from rlboost_cli.state import UnknownJobError

    name = ref
    if ref.endswith((".yaml", ".yml")) and Path(ref).is_file():
        try:
            name = load_spec(Path(ref)).name
        except SpecError as e:
            fail(str(e), 2)
    store = _store()
    try:
        job = store.get_job(name)
    except UnknownJobError:
        fail(f"no job named {name!r} to resume; `rlboost status` lists jobs", 2)
    if job.status == "succeeded":
        fail(f"job {name!r} already succeeded; nothing to resume", 2)
    if job.active and controller_alive(job.controller_pid):
        fail(f"job {name!r} is still running (controller pid {job.controller_pid}); watch it with `rlboost status`")
    run_dir = rlboost_home() / "jobs" / f"{job.name}-{job.id}"
    try:
        spec = load_spec(run_dir / "spec.yaml")  # the job as launched, not a file edited since
        token = (run_dir / "token").read_text().strip()
    except (OSError, SpecError) as e:
        fail(f"job {name!r} cannot be resumed: its run dir {run_dir} is incomplete ({e})", 2)
    _check_provider(spec)
    t_offer, s_offers, _ = _offers(spec)  # before the job record is touched: bad prices fail cleanly
    market = _market(spec)
    store.update_job(job.id, controller_pid=os.getpid())
    console.print(f"[bold]rlboost[/] resuming job [cyan]{spec.name}[/] (#{job.id}) at step {job.step or 0}")
    _run_controller(spec, store, job.id, run_dir, token, record_rollouts, (t_offer, s_offers), market, resume=True)


def _replace_dead_job(store: StateStore, spec: JobSpec) -> int | None:
    """A job of this name is still 'running' but its controller is gone (killed, crashed): reconcile
    what it left behind, then start anew. None while its controller is alive."""
    from rlboost_cli.reconcile import gc as reconcile_all

    results = reconcile_all(store, names=[spec.name])
    if store.get_job(spec.name).active:
        return None  # its controller is alive
    console.print(
        f"job {spec.name!r}: an earlier controller died; reconciled what it left behind and starting over "
        f"(`rlboost launch --resume {spec.name}` continues a job from its last checkpoint instead)"
    )
    _report_gc(results)
    try:
        return store.create_job(spec.name, spec_to_yaml(spec), spec.provider)
    except JobExistsError:
        return None


def _print_plan(spec: JobSpec, t_offer, s_offers, prices=None) -> None:
    console.print(f"[bold]plan for job {spec.name}[/] (provider {spec.provider}; nothing launched)")
    n = spec.trainer.nodes
    where = t_offer.cloud + (f"/{t_offer.region}" if t_offer.region else "")
    console.print(
        f"trainer: {n} × {t_offer.accelerator or 'cpu'} on {where} (on-demand): "
        f"${t_offer.hourly_price / n:.3f}/h per node, ${t_offer.hourly_price:.2f}/h in all"
    )
    table = Table(title="spot candidates, in bidding order (cheapest $ per unit of throughput first)")
    for col in ("cloud", "region", "accelerator", "spot $/h", "on-demand $/h", "throughput", "$/h ÷ thr"):
        table.add_column(col)
    for o in s_offers:
        table.add_row(
            o.cloud,
            o.region or "any",
            o.accelerator or "-",
            f"{o.hourly_price:.3f}",
            f"{o.on_demand_price:.3f}" if o.on_demand_price is not None else "-",
            f"{o.throughput:g}",
            f"{o.dollars_per_unit_throughput:.3f}",
        )
    console.print(table)
    mw = spec.rollout.max_workers
    if s_offers:
        worst = t_offer.hourly_price + mw * max(o.hourly_price for o in s_offers)
        console.print(f"at most {mw} spot workers: up to ${worst:.2f}/h with the trainer")
    for cloud, source in sorted(getattr(prices, "sources", {}).items()):
        console.print(f"prices for {cloud}: {source}")
    if spec.provider != "local":
        from providers import CREDENTIAL_HINTS, credentials, job_clouds

        for cloud, found in credentials(job_clouds(spec)).items():
            state = f"found ({found})" if found else f"[red]missing[/]: {CREDENTIAL_HINTS[cloud]}; launch will refuse"
            console.print(f"credentials for {cloud}: {state}")
    if spec.budget_usd is not None:
        spent = _spent_before(spec.name)
        before = f" (${spent:.2f} spent by earlier runs)" if spent else ""
        console.print(f"budget cap: ${spec.budget_usd:.2f}{before}")


def _print_outcome(store: StateStore, job_id: int) -> None:
    from rlboost_cli.ledger import summarize

    job = store.job_by_id(job_id)
    steps = store.steps(job_id)
    cost = summarize(store, job_id)
    if steps:
        console.print(
            f"reward: step 1 {steps[0].reward:.3f} → step {len(steps)} {steps[-1].reward:.3f}  "
            f"({sum(s.migrated for s in steps)} responses migrated)"
        )
    console.print(
        f"job {job.name}: {job.status}; cost ${cost.total_dollars:.2f} (see `rlboost cost-report {job.name}`)"
    )


@app.command()
def status(
    job: Annotated[str | None, typer.Argument(help="a job name; all jobs when omitted")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Jobs, workers, weight versions, throughput, preemptions."""
    from rlboost_cli.reports import render_status, status_json

    store = _store()
    try:
        if as_json:
            print(json.dumps(status_json(store, job), indent=2, default=str))
        else:
            render_status(store, job, console)
    except UnknownJobError as e:
        fail(str(e))


@app.command("cost-report")
def cost_report(
    job: Annotated[str | None, typer.Argument(help="a job name; every job and the total when omitted")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Spend per spot/on-demand and accelerator, savings, $ per step, $ per 1M tokens."""
    from rlboost_cli.reports import cost_json, render_cost

    store = _store()
    try:
        if as_json:
            print(json.dumps(cost_json(store, job), indent=2, default=str))
        else:
            render_cost(store, job, console)
    except UnknownJobError as e:
        fail(str(e))


@app.command()
def down(
    job: Annotated[str | None, typer.Argument(help="the job to stop")] = None,
    all_jobs: Annotated[bool, typer.Option("--all", help="stop every active job")] = False,
) -> None:
    """Stop a job and terminate every instance it owns."""
    store = _store()
    if all_jobs:
        names = [j.name for j in store.list_jobs() if j.status in ACTIVE]
    elif job:
        try:
            j = store.get_job(job)
        except UnknownJobError as e:
            fail(str(e))
        names = [j.name]
    else:
        fail("name a job (`rlboost down NAME`) or pass --all; `rlboost status` lists jobs", 2)
    for name in names:
        _down_one(store, name)
    if all_jobs:  # and whatever any ended or crashed job left behind
        _report_gc(_run_gc(store))


@app.command()
def gc(
    wait: Annotated[float, typer.Option(help="seconds to wait for each provider to confirm terminations")] = 600.0,
) -> None:
    """Find and terminate orphans: instances of jobs whose controller is gone (crashed, killed) that a
    provider still lists, or that the state store still calls live."""
    results = _run_gc(_store(), wait)
    _report_gc(results)
    if any(r.unconfirmed or r.error for r in results):
        raise typer.Exit(1)


def _run_gc(store: StateStore, wait: float = 600.0) -> list:
    from rlboost_cli.reconcile import gc as reconcile_all

    return reconcile_all(store, wait_s=wait)


def _report_gc(results: list) -> None:
    if not results:
        console.print("no orphans: every recorded instance is accounted for")
    for r in results:
        if r.error:
            err.print(f"[bold red]error:[/] job {r.job}: {r.error}", highlight=False)
            continue
        line = f"job {r.job}: terminated {len(r.terminated)} orphan(s)"
        if r.unconfirmed:
            line += f"; NOT confirmed gone: {', '.join(r.unconfirmed)} (run `rlboost gc` again)"
        console.print(line)


def _down_one(store: StateStore, name: str) -> None:
    job = store.get_job(name)
    pid = job.controller_pid
    if job.status in ACTIVE and pid and _pid_alive(pid):
        os.kill(pid, signal.SIGTERM)  # the controller tears down and records it
        deadline = time.time() + (60 if job.provider == "local" else 900)  # a cloud confirms in minutes
        while time.time() < deadline and store.get_job(name).status in ACTIVE:
            time.sleep(0.2)
    job = store.get_job(name)
    leftovers = _teardown_orphans(store, job)
    if job.status in ACTIVE:
        store.update_job(job.id, status="stopped", ended_at=time.time(), error="stopped by `rlboost down`")
    console.print(f"job {name}: stopped" + (f"; terminated {leftovers} leftover instance(s)" if leftovers else ""))


def _teardown_orphans(store: StateStore, job) -> int:
    """Terminate what the store still calls live or the provider still lists (controller gone)."""
    from providers.base import InstanceState
    from rlboost_cli.reconcile import provider_for, reconcile

    try:
        prov = provider_for(job)
    except Exception as e:
        fail(f"job {job.name}: cannot reach provider {job.provider} to terminate its instances: {e}")
    if prov is None:  # nothing was ever started
        for inst in store.live_instances(job.id):
            store.update_instance(inst.id, InstanceState.TERMINATED, job.clock or 0.0, "never started")
        return 0
    try:
        res = reconcile(store, prov, job, wait_s=60 if job.provider == "local" else 600)
    finally:
        prov.close()
    if res.unconfirmed:
        err.print(f"job {job.name}: not confirmed gone: {', '.join(res.unconfirmed)}; run `rlboost gc`")
    return len(res.terminated)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@app.command()
def logs(
    job: Annotated[str, typer.Argument(help="the job")],
    instance: Annotated[str | None, typer.Option(help="an instance id (default: the trainer)")] = None,
    lines: Annotated[int, typer.Option("-n", help="how many lines")] = 40,
) -> None:
    """Show the tail of an instance's log (local provider)."""
    store = _store()
    try:
        j = store.get_job(job)
    except UnknownJobError as e:
        fail(str(e))
    iid = instance or f"{j.name}-{j.id}-trainer"
    path = rlboost_home() / "jobs" / f"{j.name}-{j.id}" / "instances" / iid / "log"
    if not path.exists():
        known = ", ".join(i.id for i in store.instances(j.id)) or "none"
        fail(f"no log for instance {iid!r} of job {job} (instances: {known})")
    console.print("".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:]), end="")


@app.command()
def simulate(
    job_file: Annotated[Path, typer.Argument(help="the job YAML")],
    trace: Annotated[
        Path | None,
        typer.Option(help="availability trace (Bamboo CSV, GCP count lines, JSON count series); default: local.trace"),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(help="on-demand, sync, spot-restart, rlboost-rule, rlboost, rlboost-tail, job (repeatable)"),
    ] = None,
    catalog: Annotated[
        Path | None, typer.Option(help="a SkyPilot vms.csv to price from (overrides local.catalog)")
    ] = None,
    hours: Annotated[float | None, typer.Option(help="hours of trace to replay (default: all of it)")] = None,
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
    plot: Annotated[Path | None, typer.Option(help="write a PNG: throughput and live spot workers over time")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """What would spot save? Replay a spot trace and prices through the scheduling policies on a virtual clock."""
    from providers.spot_market import TraceError
    from simulator import cli as sim_cli
    from simulator.report import plot as plot_results
    from simulator.report import results_json, results_table

    try:
        spec = load_spec(job_file)
    except SpecError as e:
        fail(str(e), 2)
    if plot is not None and importlib.util.find_spec("matplotlib") is None:
        fail("--plot needs matplotlib: pip install 'rlboost[plot]'", 2)
    t0 = time.monotonic()
    try:
        tr, results = sim_cli.run(
            spec,
            trace,
            policy,
            catalog=catalog,
            hours=hours,
            lengths=lengths,
            steps=(10**9 if steps == 0 else steps),
            constant_workers=constant_workers,
        )
    except (PricingError, TraceError, ValueError) as e:
        fail(str(e), 2)
    took = time.monotonic() - t0
    title = (
        f"{spec.name}: {tr.source}, {max(r.job_s for r in results) * results[0].time_scale / 3600:.1f} h of trace, "
        f"simulated in {took:.1f}s"
    )
    if as_json:
        print(json.dumps({"title": title, "results": results_json(results)}, indent=2))
    else:
        console.print(results_table(results, title))
    if plot is not None:
        plot_results(results, plot, title)
        if not as_json:
            console.print(f"plot: {plot}")


if __name__ == "__main__":
    app()
