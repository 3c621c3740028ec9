"""`rlboost`: launch / status / cost-report / down / logs."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from rlboost.cli.argv_envs import reexec_without_env_values
from rlboost.cli.job_envs import (
    SECRET_ENVS_FILE,
    missing_values,
    parse_env_options,
    read_secret_envs,
    write_secret_envs,
)
from rlboost.cli.jobs_ref import resolve_job
from rlboost.cli.pids import controller_identity
from rlboost.cli.state import JobExistsError, JobRow, StateStore, UnknownJobError, job_run_dir, rlboost_home
from rlboost.cli.step_numbers import checkpointed_steps, resume_message
from rlboost.cli.tables import add_columns, narrow_table
from rlboost.contracts.provider_kinds import provider_kind
from rlboost.contracts.spec import JobSpec, SpecError, load_spec, spec_to_yaml
from rlboost.providers.pricing import PricingError, spot_offers, trainer_offer

if TYPE_CHECKING:
    from rlboost.cli.reconcile import GcResult
    from rlboost.providers.pricing import Offer
    from rlboost.providers.spot_market import SpotMarket


def examples(*lines: str) -> str:
    """A command's --help epilog: one example a line."""
    return "\n".join(("Examples:", *(f"  {line}" for line in lines)))


def _unlabel_flags(params: list[Any]) -> list[Any]:
    """typer labels a flag `<bool>` in --help as if it took a value (`--dryrun=true` is an error): no label."""
    for p in params:
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
    return params


class _Commands(TyperGroup):
    """The app's group: its own and its commands' --help show flags without a type."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _unlabel_flags(super().get_params(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            _unlabel_flags(cmd.get_params(ctx))
        return cmd


class _App(typer.Typer):
    """The CLI's entry point (the `rlboost` script and `python -m rlboost.cli.main` both call it): an
    error of the state store or the disk under it (rlboost/cli/errors.py) is one line and exit 1,
    never a traceback; RLBOOST_DEBUG=1 shows the traceback."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from rlboost.cli.errors import debug, user_message

        try:
            return super().__call__(*args, **kwargs)
        except Exception as e:
            msg = user_message(e)
            if msg is None or debug():
                raise
            with contextlib.suppress(Exception):  # stderr may be a full disk (a detached controller's log)
                err.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
            raise SystemExit(1) from None


app = _App(
    cls=_Commands,
    add_completion=True,  # --install-completion / --show-completion [bash|zsh|fish|powershell]
    pretty_exceptions_show_locals=False,  # a crash's traceback must not print job tokens held in locals
    no_args_is_help=True,
    help="RL post-training on an on-demand trainer plus harvested spot GPUs.",
)
# The terminal's width, or $COLUMNS, or 80 when piped; no colours unless stdout is a terminal (rich
# decides); progress lines name no source file. Tables fold long cells (ids, names) rather than cut them.
console = Console(log_path=False)
err = Console(stderr=True)

ACTIVE = ("pending", "running")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            console.print(f"rlboost {version('rlboost')}", highlight=False)
        except PackageNotFoundError:  # running from a source tree that was never installed
            console.print("rlboost (not installed: no version metadata)", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print rlboost's version and exit")
    ] = False,
) -> None:
    """RL post-training on an on-demand trainer plus harvested spot GPUs."""


@app.command()
def check(
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Which providers this machine can launch with: do their libraries import, are credentials found."""
    from rlboost.contracts.provider_kinds import provider_names
    from rlboost.providers import provider_check

    results = [provider_check(p) for p in provider_names()]
    if as_json:
        print(json.dumps(results, indent=2))
        return
    table = narrow_table("providers (credentials from files and environment only; nothing is called)")
    add_columns(table, "provider", "ready", "libraries", "credentials")
    for r in results:
        libs = ", ".join(f"{m} {'ok' if ok else 'missing'}" for m, ok in r["libraries"].items())
        creds = [f"{c}: {where or 'none'}" for c, where in r["credentials"].items()]
        creds += [f"{c}: see `sky check`" for c in r["unchecked_clouds"]]
        table.add_row(
            r["provider"],
            "[green]yes[/]" if r["ready"] else "[red]no[/]",
            escape(libs),
            escape("\n".join(creds) or "not needed"),
        )
    console.print(table)
    # the fixes are commands and variable names to copy: under the table, wrapped between words, never
    # folded inside a narrow cell; one item per fix, with the providers it readies
    fixes: dict[str, list[str]] = {}
    for r in results:
        for problem in r["problems"]:
            fixes.setdefault(problem, []).append(r["provider"])
    if fixes:
        console.print("\nto fix:", highlight=False)
        items = Table.grid(padding=(0, 1))
        items.add_column(justify="right", width=3)
        items.add_column(overflow="fold")
        for problem, providers in fixes.items():
            items.add_row("-", Text(f"{problem} (for {', '.join(providers)})"))
        console.print(items, highlight=False)


def fail(msg: str, code: int = 1) -> NoReturn:
    # messages quote user and provider text (`[local]`, paths, log lines): never markup
    err.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _store() -> StateStore:
    return StateStore()


def _market(spec: JobSpec):
    from rlboost.providers.spot_market import BUILTIN_TRACE, SpotMarket, TraceError, load_trace

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
    from rlboost.providers import PreflightError, preflight

    try:
        preflight(spec, check_credentials=not dryrun)
    except PreflightError as e:
        fail(str(e), 2)


def _check_sinks(spec: JobSpec) -> None:
    """The libraries of the job's metrics sinks, where its controller runs: here (a node installs
    them itself, with rlboost's `logging` extra)."""
    from rlboost.cli.metrics_sinks import sink_problems

    problems = sink_problems(spec) if spec.controller == "launcher" else []
    if problems:
        fail("\n".join(problems), 2)


def _spent_before(name: str) -> float:
    """Dollars already spent by earlier runs of this job name (0 without a state file)."""
    if not (rlboost_home() / "state.db").exists():
        return 0.0
    from rlboost.cli.ledger import summarize

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


@app.command(
    epilog=examples(
        "rlboost launch examples/local.yaml",
        "rlboost launch --dryrun examples/aws-gcp.yaml",
        "rlboost launch -d job.yaml --set algorithm.steps=10 --env HF_TOKEN",
        "rlboost launch --resume JOB",
    )
)
def launch(
    job_file: Annotated[
        str, typer.Argument(help="the job YAML, e.g. examples/local.yaml (with --resume: the job's id, name or YAML)")
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
        bool,
        typer.Option("--record-rollouts", help="write every response and the final weights to the trainer's run dir"),
    ] = False,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            "-d",
            help="run the controller in the background (survives the shell closing); "
            "follow it with `rlboost logs ID -f`, stop it with `rlboost down ID`",
        ),
    ] = False,
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="override a job-file field, KEY.PATH=VALUE (a YAML scalar), e.g. --set algorithm.steps=10; "
            "repeatable; validated with the file",
        ),
    ] = None,
    env_options: Annotated[
        list[str] | None,
        typer.Option(
            "--env",
            help="a variable for the trainer and workers: NAME (its value from your environment) or NAME=VALUE; "
            "repeatable; the value is kept secret (never saved with the job, scrubbed from messages)",
        ),
    ] = None,
) -> None:
    """Provision the trainer, train, and keep bidding for spot rollout workers until the job ends."""
    if resume:
        if overrides or env_options:
            what = "--set" if overrides else "--env"
            fail(f"{what} applies to a new launch; --resume continues the job as saved (with its --env values)", 2)
        _resume(job_file, record_rollouts, detach)
        return
    try:
        secret_envs = parse_env_options(env_options or [])
        spec = load_spec(Path(job_file), overrides or [], env_names=list(secret_envs))
    except SpecError as e:
        fail(str(e), 2)
    missing = missing_values(spec, secret_envs)
    if missing and not dryrun:  # a plan needs no secrets
        fail("\n".join(missing), 2)
    _check_sinks(spec)
    _check_provider(spec, dryrun)
    if not dryrun:
        _check_budget(spec)
    t_offer, s_offers, prices = _offers(spec)  # before any record exists: bad prices or traces fail here
    market = _market(spec)
    if dryrun:
        _print_plan(spec, t_offer, s_offers, prices)
        return
    # the overrides are in the values; the header says which came from the command line
    saved = (
        "".join(f"# --set {o}\n" for o in overrides or [])
        + "".join(f"# --env {name} (secret: its value is kept in the run directory)\n" for name in secret_envs)
        + spec_to_yaml(spec)
    )
    store = _store()
    try:
        job_id = store.create_job(spec.name, saved, spec.provider)
    except JobExistsError:
        job_id = _replace_dead_job(store, spec)
    if job_id is None:
        job = store.get_job(spec.name)
        fail(
            f"job {spec.name!r} is already {job.status} "
            f"({'controller on its trainer node' if job.remote else f'controller pid {job.controller_pid}'}); "
            f"watch it with `rlboost status {job.id}`, stop it with `rlboost down {job.id}`, "
            "or give the new job another name"
        )
    store.update_job(job_id, **controller_identity())  # at once: `rlboost gc` tells live from dead by it
    run_dir = rlboost_home() / "jobs" / f"{spec.name}-{job_id}"
    run_dir.mkdir(parents=True, mode=0o700)
    (run_dir / "spec.yaml").write_text(saved)
    token = secrets.token_urlsafe(32)
    token_file = run_dir / "token"
    token_file.touch(mode=0o600)
    token_file.write_text(token)
    if secret_envs:
        write_secret_envs(run_dir, secret_envs)
    from rlboost.rollout.scheduling import cores_note, most_workers, shared_cores

    cores = shared_cores(spec)
    console.print(
        f"[bold]rlboost[/] job [cyan]{spec.name}[/] (id {job_id}) on provider [cyan]{spec.provider}[/]: "
        f"{spec.algorithm.steps} GRPO steps × {spec.algorithm.prompts_per_step} prompts × "
        f"group {spec.algorithm.group_size}, up to {most_workers(spec, cores)} spot workers"
    )
    if note := cores_note(spec, cores):
        console.print(note, markup=False, highlight=False)
    if spec.controller == "trainer":
        _start_on_node(store, job_id, token, resume=False, record_rollouts=record_rollouts, detach=detach)
        return
    if detach:
        _detach(store, job_id, run_dir, resume=False, record_rollouts=record_rollouts)
        return
    _run_controller(
        ControllerRun(spec, store, job_id, run_dir, token, record_rollouts, (t_offer, s_offers), market), resume=False
    )


def _start_on_node(
    store: StateStore, job_id: int, token: str, *, resume: bool, record_rollouts: bool, detach: bool
) -> None:
    """`controller: trainer`: start the job's controller on its trainer node, record where it listens,
    then follow it from here (attached) or return (-d). Following is all this process does: a closed
    terminal or Ctrl-C stops following, never the job (`rlboost down` stops it)."""
    from rlboost.cli.node_client import sync
    from rlboost.cli.node_host import NodeStartError, trainer_node

    job = store.job_by_id(job_id)
    try:
        addr = trainer_node(job).start(job.spec_yaml, token, resume=resume, record_rollouts=record_rollouts)
    except (NodeStartError, OSError) as e:
        store.update_job(job_id, status="failed", ended_at=time.time(), error=str(e))
        fail(f"job {job.name} (id {job_id}): {e}")
    store.update_job(job_id, controller_url=addr.url, controller_pid=None, controller_start=None)  # the node owns it
    sync(store, store.job_by_id(job_id))
    console.print(
        f"job id {job_id}: controller running on the trainer node ({addr.url}); it keeps running when "
        f"this machine sleeps or this terminal closes\n" + _job_commands(job_id),
        highlight=False,
        markup=False,
    )
    if not detach:
        _follow_node_job(store, job_id)


def _follow_node_job(store: StateStore, job_id: int) -> None:
    from rlboost.cli import logs as job_logs

    def hangup(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    prev = signal.signal(signal.SIGHUP, hangup)
    try:
        f = job_logs.Follower(console, show_all=False)
        why = job_logs.follow(f, store, store.job_by_id(job_id), None, controller_only=True)
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
            err.print(
                f"stopped following; job {job_id} keeps running on its trainer node "
                f"(`rlboost logs {job_id} -f` follows it again, `rlboost down {job_id}` stops it)",
                markup=False,
                highlight=False,
            )
        return
    finally:
        signal.signal(signal.SIGHUP, prev)
    job = store.job_by_id(job_id)
    if job.active:  # the node stopped answering
        fail(why)
    _print_outcome(store, job_id)
    if job.status != "succeeded":
        fail(f"job {job.name} {job.status}: {job.error}")


def _detach(store: StateStore, job_id: int, run_dir: Path, *, resume: bool, record_rollouts: bool) -> None:
    from rlboost.cli.detach import controller_log, spawn_controller

    pid = spawn_controller(job_id, run_dir, resume=resume, record_rollouts=record_rollouts)
    store.update_job(job_id, **controller_identity(pid))  # this process exits now; the job is the child's
    console.print(
        f"job id {job_id}: controller running in the background (pid {pid}), log {controller_log(run_dir)}\n"
        + _job_commands(job_id),
        highlight=False,
        markup=False,
    )


@app.command("_controller", hidden=True)
def run_detached_controller(
    job_id: Annotated[int, typer.Argument()],
    resume: Annotated[bool, typer.Option("--resume")] = False,
    record_rollouts: Annotated[bool, typer.Option("--record-rollouts")] = False,
    serve_control: Annotated[bool, typer.Option("--serve-control")] = False,
    linger_s: Annotated[float, typer.Option("--linger")] = 600.0,
    trainer_here: Annotated[bool, typer.Option("--trainer-here")] = False,
    control_host: Annotated[str, typer.Option("--control-host")] = "127.0.0.1",
    control_port: Annotated[int, typer.Option("--control-port")] = 0,
) -> None:
    """The background controller `launch -d` starts, for a job that launch already recorded;
    `--serve-control`: the trainer node's controller, answering the launching machine's CLI
    (`--trainer-here`: on a cloud trainer node, running the trainer as a process next to it)."""
    store = _store()
    job = store.job_by_id(job_id)
    run_dir = job_run_dir(job)
    store.update_job(job_id, **controller_identity())
    console.print(f"controller pid {os.getpid()} for job {job.name} (id {job_id})", highlight=False)
    try:  # launch checked all of this a moment ago; a failure now still must not leave the job 'pending'
        spec = load_spec(run_dir / "spec.yaml")
        token = (run_dir / "token").read_text().strip()
        t_offer, s_offers, _ = _offers(spec)
        market = _market(spec)
    except (SpecError, OSError, typer.Exit) as e:
        why = str(e) if not isinstance(e, typer.Exit) else f"could not start (see {run_dir / 'controller.log'})"
        store.update_job(job_id, status="failed", ended_at=time.time(), error=why)
        fail(why, 2)
    run = ControllerRun(spec, store, job_id, run_dir, token, record_rollouts, (t_offer, s_offers), market)
    if not serve_control:
        _run_controller(run, resume=resume)
        return
    from rlboost.cli.node_control import ControlServer

    server = ControlServer(job_id, run_dir, token, host=control_host, port=control_port)
    console.print(f"control endpoint {server.start()}", highlight=False, markup=False)
    try:
        _run_controller(run, resume=resume, trainer_here=trainer_here)
    finally:
        # the launching machine copies the ended job's records and logs when it next asks: serve until
        # it says it has them (a cloud node would then be terminated with the job)
        server.released.wait(linger_s)
        server.stop()


@app.command("_node-controller", hidden=True)
def run_node_controller(
    job_id: Annotated[int, typer.Argument()],
    name: Annotated[str, typer.Argument()],
    spec_file: Annotated[Path, typer.Argument()],
    resume: Annotated[bool, typer.Option("--resume")] = False,
    control_port: Annotated[int, typer.Option("--control-port")] = 0,
) -> None:
    """A cloud trainer node's run command (rlboost/templates/node.sky.yaml): record the job on this node
    (first start), then run its controller here, the trainer as a process next to it, serving the
    control endpoint on every interface. The job token comes in the environment, never a file."""
    from rlboost.cli.node_host import NodeJob, prepare_node

    token = os.environ.get("RLBOOST_JOB_TOKEN", "")
    if not token:
        fail("RLBOOST_JOB_TOKEN is not set: this node was not started by `rlboost launch`", 2)
    spec = load_spec(spec_file)
    # `launch --env` values come as SkyPilot secrets, named in the job file with no value
    secret = {k: os.environ[k] for k, v in spec.envs.items() if v is None and k in os.environ}
    uid = os.environ.get("RLBOOST_JOB_UID") or None  # the launching machine's: the node tags instances with it
    prepare_node(rlboost_home(), NodeJob(job_id, name, spec.provider, spec_file.read_text(), token, secret, uid))
    run_detached_controller(
        job_id,
        resume=resume,
        serve_control=True,
        trainer_here=True,
        control_host="0.0.0.0",
        control_port=control_port,
    )


def _offers(spec: JobSpec):
    from rlboost.providers import price_lookup

    prices = price_lookup(spec)
    try:
        return trainer_offer(spec, prices), spot_offers(spec, prices), prices
    except PricingError as e:
        fail(str(e), 2)


@dataclass(frozen=True)
class ControllerRun:
    """What a controller needs to run one job here: its records, secrets and market."""

    spec: JobSpec
    store: StateStore
    job_id: int
    run_dir: Path
    token: str
    record_rollouts: bool
    offers: tuple[Offer, list[Offer]]  # the trainer's, and every spot candidate's
    market: SpotMarket


def _run_controller(run: ControllerRun, *, resume: bool, trainer_here: bool = False) -> None:
    from rlboost.cli.controller import Controller
    from rlboost.cli.reconcile import owner_of
    from rlboost.providers import make_provider

    spec, store, job_id, run_dir = run.spec, run.store, run.job_id, run.run_dir
    token, record_rollouts, market = run.token, run.record_rollouts, run.market
    t_offer, s_offers = run.offers
    try:
        owner = owner_of(store, store.job_by_id(job_id))
        provider = make_provider(spec, run_dir, owner=owner, market=market, trainer_here=trainer_here)
    except Exception as e:
        store.update_job(job_id, status="failed", ended_at=time.time(), error=str(e))
        fail(f"provider {spec.provider}: {e}", 2)
    cloud = not provider_kind(spec.provider).runs_here
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
    if spec.controller == "launcher":  # a node's controller: the launching machine prints it
        _print_outcome(store, job_id)
    if status != "succeeded":
        fail(f"job {spec.name} {status}: {job.error}")


def _resume(ref: str, record_rollouts: bool, detach: bool = False) -> None:
    """`launch --resume ID|NAME|FILE`: the same job id, run dir, token and ledger; a new controller."""
    from rlboost.cli.pids import controller_alive
    from rlboost.cli.state import UnknownJobError

    name = ref
    if ref.endswith((".yaml", ".yml")) and Path(ref).is_file():
        try:
            name = load_spec(Path(ref)).name
        except SpecError as e:
            fail(str(e), 2)
    store = _store()
    try:
        job = resolve_job(store, name)
    except UnknownJobError as e:
        fail(f"nothing to resume: {e}", 2)
    name = job.name
    if job.status == "succeeded":
        fail(f"job {name!r} already succeeded; nothing to resume", 2)
    if job.active and not job.remote and controller_alive(job.controller_pid, job.controller_start):
        fail(f"job {name!r} is still running (controller pid {job.controller_pid}); watch it with `rlboost status`")
    run_dir = job_run_dir(job)
    try:
        spec = load_spec(run_dir / "spec.yaml")  # the job as launched, not a file edited since
        token = (run_dir / "token").read_text().strip()
    except (OSError, SpecError) as e:
        fail(f"job {name!r} cannot be resumed: its run dir {run_dir} is incomplete ({e})", 2)
    missing = missing_values(spec, read_secret_envs(run_dir))
    if missing:  # its --env values were kept in the run dir; without them the nodes would start wrong
        fail(f"job {name!r} cannot be resumed: {SECRET_ENVS_FILE} in {run_dir} lacks a value\n" + "\n".join(missing), 2)
    if spec.controller == "trainer":
        _resume_on_node(store, job, token, record_rollouts, detach)
        return
    _check_provider(spec)
    t_offer, s_offers, _ = _offers(spec)  # before the job record is touched: bad prices fail cleanly
    market = _market(spec)
    store.update_job(job.id, **controller_identity())
    console.print(
        f"[bold]rlboost[/] resuming job [cyan]{spec.name}[/] (id {job.id}): "
        + resume_message(job.step or 0, checkpointed_steps(run_dir))
    )
    if detach:
        _detach(store, job.id, run_dir, resume=True, record_rollouts=record_rollouts)
        return
    _run_controller(
        ControllerRun(spec, store, job.id, run_dir, token, record_rollouts, (t_offer, s_offers), market), resume=True
    )


def _resume_on_node(store: StateStore, job: JobRow, token: str, record_rollouts: bool, detach: bool) -> None:
    """A node-controlled job whose controller died: start a new one on the node, on the node's records."""
    from rlboost.cli.node_client import controller_reachable, node_run_dir, sync
    from rlboost.cli.node_host import trainer_node

    if job.remote and controller_reachable(job):
        sync(store, job)
        if store.job_by_id(job.id).active:
            fail(f"job {job.name!r} is still running on its trainer node; watch it with `rlboost status {job.id}`")
    trainer_node(job).stop_controller()  # one that hangs without answering must not race the new one
    console.print(
        f"[bold]rlboost[/] resuming job [cyan]{escape(job.name)}[/] (id {job.id}) on its trainer node: "
        + escape(resume_message(job.step or 0, checkpointed_steps(node_run_dir(job))))
    )
    _start_on_node(store, job.id, token, resume=True, record_rollouts=record_rollouts, detach=detach)


def _replace_dead_job(store: StateStore, spec: JobSpec) -> int | None:
    """A job of this name is still 'running' but its controller is gone (killed, crashed): reconcile
    what it left behind, then start anew. None while its controller is alive."""
    from rlboost.cli.reconcile import gc as reconcile_all

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
    from rlboost.rollout.scheduling import cores_note, most_workers, shared_cores

    console.print(f"[bold]plan for job {spec.name}[/] (provider {spec.provider}; nothing launched)")
    n = spec.trainer.nodes
    where = t_offer.cloud + (f"/{t_offer.region}" if t_offer.region else "")
    console.print(
        f"trainer: {n} × {t_offer.accelerator or 'cpu'} on {where} (on-demand): "
        f"${t_offer.hourly_price / n:.3f}/h per node, ${t_offer.hourly_price:.2f}/h in all"
    )
    table = narrow_table("spot candidates, in bidding order (cheapest $ per unit of throughput first)")
    # thr: throughput per node, relative to the job's reference accelerator
    nums = ("spot $/h", "on-demand $/h", "thr", "$/h ÷ thr")
    add_columns(table, "cloud", "region", "zone", "instance", "accel", *nums, numbers=nums)
    for o in s_offers:
        zone, instance = _placement(o) if prices is not None else ("-", "-")
        table.add_row(
            o.cloud,
            o.region or "any",
            zone,
            instance,
            o.accelerator or "-",
            f"{o.hourly_price:.3f}",
            f"{o.on_demand_price:.3f}" if o.on_demand_price is not None else "-",
            f"{o.throughput:g}",
            f"{o.dollars_per_unit_throughput:.3f}",
        )
    console.print(table)
    r, cores = spec.rollout, shared_cores(spec)
    mw = most_workers(spec, cores)
    console.print(
        f"expected fleet: {r.min_workers}–{mw} spot workers, sized after each step by objective "
        f"[cyan]{r.objective}[/]" + (f" (deadline {spec.deadline_hours:g} h)" if spec.deadline_hours else "")
    )
    if note := cores_note(spec, cores):
        console.print(note, markup=False, highlight=False)
    if s_offers:
        worst = t_offer.hourly_price + mw * max(o.hourly_price for o in s_offers)
        console.print(f"at most {mw} spot worker{'s' if mw != 1 else ''}: up to ${worst:.2f}/h with the trainer")
    for cloud, source in sorted(getattr(prices, "sources", {}).items()):
        console.print(f"prices for {cloud}: {source}", markup=False)
    for line in getattr(prices, "skipped", []):  # a candidate's cloud or region with no spot offer
        console.print(line, markup=False, highlight=False)
    console.print(
        "controller: on the trainer node (it bids for spot workers itself; this machine may sleep)"
        if spec.controller == "trainer"
        else "controller: on this machine (`launch -d` runs it in the background; keep this machine up)",
        markup=False,
        highlight=False,
    )
    if not provider_kind(spec.provider).runs_here:
        from rlboost.contracts.cloud_kinds import cloud_kind
        from rlboost.providers import credentials, job_clouds

        for cloud, found in credentials(job_clouds(spec)).items():
            state = (
                f"found ({escape(str(found))})"
                if found
                else (f"[red]missing[/]: {escape(cloud_kind(cloud).credential_hint)}; launch will refuse")
            )
            console.print(f"credentials for {cloud}: {state}")
    if spec.budget_usd is not None:
        spent = _spent_before(spec.name)
        before = f" (${spent:.2f} spent by earlier runs)" if spent else ""
        console.print(f"budget cap: ${spec.budget_usd:.2f}{before}")
    if spec.deadline_hours is not None:
        from rlboost.simulator.cli import estimate_deadline

        est = estimate_deadline(spec)
        for line in est.lines() if est else []:
            console.print(line, markup=False, highlight=False)


def _placement(offer) -> tuple[str, str]:
    """(zone, instance type) of the offer's cheapest spot placement in the bundled catalog ('-' unknown)."""
    from rlboost.providers.prices import placements

    found = placements(offer.accelerator, offer.cloud, offer.region, spot=True)
    return (found[0].zone or found[0].region, found[0].instance_type) if found else ("-", "-")


def _print_outcome(store: StateStore, job_id: int) -> None:
    from rlboost.cli.ledger import summarize

    job = store.job_by_id(job_id)
    steps = store.steps(job_id)
    cost = summarize(store, job_id)
    if steps:
        console.print(
            f"reward: step {steps[0].step} {steps[0].reward:.3f} → step {steps[-1].step} {steps[-1].reward:.3f}  "
            f"({sum(s.migrated for s in steps)} responses migrated)"
        )
    console.print(
        f"job {job.name} (id {job.id}): {job.status}; cost ${cost.total_dollars:.2f} "
        f"(see `rlboost cost-report {job.id}`)"
    )


@app.command(
    epilog=examples(
        "rlboost status",
        "rlboost status my-job",
        "rlboost status 12 --json",
    )
)
def status(
    job: Annotated[
        str | None, typer.Argument(help="a job id, or a name (its newest run); all jobs when omitted")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Jobs, workers, weight versions, throughput, preemptions."""
    from rlboost.cli.reports import render_status, status_json

    store = _store()
    _sync_node_jobs(store, job)
    try:
        if as_json:
            print(json.dumps(status_json(store, job), indent=2, default=str))
        else:
            render_status(store, job, console)
    except UnknownJobError as e:
        fail(str(e))


@app.command(
    "cost-report",
    epilog=examples(
        "rlboost cost-report",
        "rlboost cost-report my-job --json",
    ),
)
def cost_report(
    job: Annotated[
        str | None, typer.Argument(help="a job id, or a name (its newest run); every job and the total when omitted")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Spend per spot/on-demand and accelerator, savings, $ per step, $ per 1M tokens."""
    from rlboost.cli.reports import cost_json, render_cost

    store = _store()
    _sync_node_jobs(store, job)
    try:
        if as_json:
            print(json.dumps(cost_json(store, job), indent=2, default=str))
        else:
            render_cost(store, job, console)
    except UnknownJobError as e:
        fail(str(e))


@app.command(
    epilog=examples(
        "rlboost down my-job",
        "rlboost down --all",
    )
)
def down(
    job: Annotated[str | None, typer.Argument(help="the job to stop: its id or name (newest run)")] = None,
    all_jobs: Annotated[bool, typer.Option("--all", help="stop every active job")] = False,
) -> None:
    """Stop a job and terminate every instance it owns."""
    store = _store()
    if all_jobs:
        ids = [j.id for j in store.list_jobs() if j.status in ACTIVE]
    elif job:
        ids = [_job(store, job).id]
    else:
        fail("name a job (`rlboost down ID|NAME`) or pass --all; `rlboost status` lists jobs", 2)
    for job_id in ids:
        _down_one(store, job_id)
    if all_jobs:  # and whatever any ended or crashed job left behind
        _report_gc(_run_gc(store))


@app.command(
    epilog=examples(
        "rlboost gc",
        "rlboost gc --older-than 7d",
    )
)
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
            "store's jobs used; without it they are listed and left alone",
        ),
    ] = False,
) -> None:
    """Find and terminate orphans: instances of this store's jobs whose controller is gone (crashed,
    killed) that a provider still lists under the job's id, or that the state store still calls live.
    Instances of other stores are listed, never touched unless --all-stores. `--older-than 7d` also
    removes ended jobs older than that."""
    from rlboost.cli.housekeeping import NotRemovable, ended_before, parse_age, remove_job

    try:
        age = parse_age(older_than) if older_than is not None else None
    except ValueError as e:
        fail(f"--older-than: {e}", 2)
    store = _store()
    results = _run_gc(store, wait, all_stores=all_stores)
    _report_gc(results)
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


@app.command()
def rm(job: Annotated[str, typer.Argument(help="an ended job: its id or name (newest run)")]) -> None:
    """Remove an ended job: its records (status, ledger) and its run directory."""
    from rlboost.cli.housekeeping import NotRemovable, remove_job

    store = _store()
    j = _job(store, job)
    try:
        remove_job(store, j)
    except NotRemovable as e:
        fail(str(e))
    console.print(f"removed job {j.name} (id {j.id})", markup=False, highlight=False)


def _sync_node_jobs(store: StateStore, ref: str | None) -> None:
    """Refresh the local copies of jobs whose controller runs on their trainer node (those named)."""
    from rlboost.cli.node_client import sync_all

    try:
        jobs = [resolve_job(store, ref)] if ref is not None else store.list_jobs()
    except UnknownJobError:
        return  # the report says so
    sync_all(store, jobs)


def _job(store: StateStore, ref: str) -> JobRow:
    try:
        return resolve_job(store, ref)
    except UnknownJobError as e:
        fail(str(e))


def _run_gc(store: StateStore, wait: float = 600.0, *, all_stores: bool = False) -> GcResult:
    from rlboost.cli.reconcile import gc as reconcile_all

    return reconcile_all(store, wait_s=wait, all_stores=all_stores)


def _report_gc(results: GcResult) -> None:
    if not results.jobs and not results.foreign:
        console.print("no orphans: every recorded instance is accounted for")
    for r in [*results.jobs, *results.foreign_ended]:
        if r.error:
            err.print(f"[bold red]error:[/] job {escape(r.job)}: {escape(r.error)}", highlight=False)
            continue
        line = f"job {r.job}: terminated {len(r.terminated)} orphan(s)"
        if r.unconfirmed:
            line += f"; NOT confirmed gone: {', '.join(r.unconfirmed)} (run `rlboost gc` again)"
        console.print(line, markup=False)
    ended = {i for r in results.foreign_ended for i in r.terminated}
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


def _down_one(store: StateStore, job_id: int) -> None:
    from rlboost.cli.pids import controller_alive

    job = store.job_by_id(job_id)
    was_active, live = job.status in ACTIVE, [i.id for i in store.live_instances(job_id)]
    pid, start = job.controller_pid, job.controller_start
    if job.remote and job.active:
        _down_node(store, job)
    elif job.status in ACTIVE and pid and controller_alive(pid, start):
        os.kill(pid, signal.SIGTERM)  # the controller tears down and records it
        deadline = time.time() + provider_kind(job.provider).confirm_timeout_s  # a cloud confirms in minutes
        while time.time() < deadline and store.job_by_id(job_id).status in ACTIVE:
            time.sleep(0.2)
        while time.time() < deadline and controller_alive(pid, start):  # it exits once its records are closed
            time.sleep(0.1)
    job = store.job_by_id(job_id)
    leftovers = _teardown_orphans(store, job)
    if job.status in ACTIVE:
        store.update_job(job.id, status="stopped", ended_at=time.time(), error="stopped by `rlboost down`")
    job = store.job_by_id(job_id)
    ended = [i.id for i in store.instances(job_id) if i.id in live and i.terminal]
    console.print(down_message(job, was_active, ended, leftovers), markup=False, highlight=False)


def _job_commands(job_id: int) -> str:
    """The commands for a job just started in the background, one a line (whole for copy and paste)."""
    return f"  follow: rlboost logs {job_id} -f\n  status: rlboost status {job_id}\n  stop:   rlboost down {job_id}"


def down_message(job: JobRow, was_active: bool, ended: list[str], leftovers: int) -> str:
    """What `down` did to one job: the instances it ended, where the job stands, how to continue it."""
    out = f"job {job.name} (id {job.id}): " + (
        f"stopped after step {job.step or 0}" if was_active else f"already {job.status}"
    )
    if ended:
        out += f"; terminated {len(ended)} instance(s): {', '.join(ended)}"
    # leftovers: what its controller (gone, or crashed mid-teardown) left, found and ended from here
    if leftovers and ended:
        out += f" ({leftovers} of them left behind by its controller)"
    elif leftovers:
        out += f"; terminated {leftovers} instance(s) its controller left behind"
    elif not ended and not was_active:
        out += "; nothing to stop"
    if was_active and job.status == "stopped":
        out += f"\ncontinue it with `rlboost launch --resume {job.id}`"
    return out


def _down_node(store: StateStore, job: JobRow) -> None:
    """Ask the job's controller on its trainer node to stop, and wait for its records to say so; a
    node that does not answer is cut off (`take_over_node`) and its instances reconciled from here."""
    from rlboost.cli.node_client import NodeClient, NodeUnreachable, sync
    from rlboost.cli.reconcile import take_over_node

    try:
        NodeClient.for_job(job).down()
    except (NodeUnreachable, OSError) as e:
        err.print(f"{e}; terminating its instances from here", markup=False, highlight=False)
        take_over_node(job)
        return
    deadline = time.time() + provider_kind(job.provider).confirm_timeout_s  # a cloud confirms in minutes
    while time.time() < deadline:
        if not sync(store, job):
            take_over_node(job)  # it went away mid-teardown: finish from here
            return
        if not store.job_by_id(job.id).active:
            return
        time.sleep(0.3)


def _teardown_orphans(store: StateStore, job) -> int:
    """Terminate what the store still calls live or the provider still lists (controller gone)."""
    from rlboost.cli.reconcile import provider_for, reconcile
    from rlboost.providers.base import InstanceState

    try:
        prov = provider_for(job, store)
    except Exception as e:
        fail(f"job {job.name}: cannot reach provider {job.provider} to terminate its instances: {e}")
    if prov is None:  # nothing was ever started
        for inst in store.live_instances(job.id):
            store.update_instance(inst.id, InstanceState.TERMINATED, job.clock or 0.0, "never started")
        return 0
    try:
        res = reconcile(store, prov, job, wait_s=provider_kind(job.provider).reconcile_wait_s)
    finally:
        prov.close()
    if res.unconfirmed:
        err.print(f"job {job.name}: not confirmed gone: {', '.join(res.unconfirmed)}; run `rlboost gc`", markup=False)
    return len(res.terminated)


@app.command(
    epilog=examples(
        "rlboost logs my-job -f",
        "rlboost logs my-job --instance w0003-my-job -n 200",
    )
)
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

    store = _store()
    j = _job(store, job)
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


@app.command(
    epilog=examples(
        "rlboost simulate examples/simulate/aws-p3-v100.yaml",
        "rlboost simulate job.yaml --trace trace.csv --hours 12 --policy rlboost --json",
        "rlboost simulate job.yaml --sweep --plot sweep.png",
    )
)
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
    jobs: Annotated[
        int | None, typer.Option(help="replays (policies, sweep points) run in parallel processes (default: CPU count)")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="write a PNG: throughput and spot workers over time (--sweep: by max_workers)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
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
    )
    if wrong:
        fail(wrong, 2)
    try:
        spec = load_spec(job_file)
    except SpecError as e:
        fail(str(e), 2)
    if plot is not None and importlib.util.find_spec("matplotlib") is None:
        fail("--plot needs matplotlib: pip install 'rlboost[plot]'", 2)
    if plot is not None and (unwritable := report.plot_path_error(plot)):
        fail(unwritable, 2)
    if sweep and policy:
        fail("--sweep replays objectives cost and throughput by max_workers: leave --policy out", 2)
    t0 = time.monotonic()
    try:
        points = _sweep_workers(sweep_workers) if sweep_workers else None
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
        base, swept = None, []
        if sweep:
            most = most_workers(rp.spec, cores) if cores is not None else None
            base, swept = _run_sweep(rp, points or sim_cli.sweep_points(rp.spec.rollout.max_workers, most), jobs)
            results = [base, *(p.result for p in swept)]
            choices = [report.Choice(p.label, p.result) for p in swept]
        else:
            results = _run_policies(rp, sim_cli.pick_policies(policy, rp.spec), jobs)
            choices = [report.Choice(_policy_setting(r.policy, rp.spec), r) for r in results]
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
    verdict = (
        report.DeadlineVerdict.of(
            spec.deadline_hours,
            rp.spec.algorithm.steps,
            [report.Choice("on-demand", base), *choices] if base is not None else choices,
        )
        if spec.deadline_hours is not None
        else None
    )
    if as_json:
        doc: dict = {"title": title, "recommendation": rec.as_json() if rec else None}
        doc["deadline"] = verdict.as_json() if verdict else None
        doc["trainer_alone_hours"] = None if rp.outlasts_h is None else round(rp.outlasts_h, 1)
        if rp.calibration is not None:
            doc["calibration"] = rp.calibration.as_json()
        doc["results"] = report.sweep_json(base, swept) if sweep else report.results_json(results)
        print(json.dumps(doc, indent=2))
    else:
        for line in [*(rec.lines() if rec else []), *(verdict.lines() if verdict else [])]:
            console.print(line, markup=False, highlight=False)
        table = report.sweep_table(base, swept, title) if sweep else report.results_table(results, title)
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


def _run_policies(rp, policies, jobs: int | None):
    """One bar per policy, each at the fraction of its replay done (trace hours or steps, whichever ends it)."""
    from rlboost.simulator import cli as sim_cli

    with _replay_bars() as bars:
        ids = [bars.add_task(f"replaying {p.name}", total=1.0) for p in policies]
        return sim_cli.simulate_policies(
            rp, policies, jobs=jobs, on_progress=lambda k, f: bars.update(ids[k], completed=f)
        )


def _run_sweep(rp, points: list[int], jobs: int | None):
    """One bar for the whole sweep: the sum of its replays' fractions done."""
    from rlboost.simulator import cli as sim_cli

    n = len(sim_cli.sweep_order(points)) + 1  # and the on-demand baseline
    done = [0.0] * n

    def moved(k: int, fraction: float) -> None:
        done[k] = fraction  # a replay's reports arrive in order (rlboost/simulator/parallel.py)
        finished = sum(1 for f in done if f >= 1.0)
        bars.update(bar, completed=sum(done), description=f"sweep: {finished}/{n} replays done")

    with _replay_bars() as bars:
        bar = bars.add_task(f"sweep: 0/{n} replays done", total=n)
        return sim_cli.sweep(rp, points, jobs=jobs, on_progress=moved)


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


if __name__ == "__main__":
    reexec_without_env_values()  # `launch --env NAME=VALUE`: the value leaves the command line first
    app(prog_name="rlboost")  # `python -m rlboost.cli.main` completes and names itself as the installed script
