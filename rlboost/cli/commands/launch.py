"""`rlboost launch`: a new job (or its plan, `--dryrun`), or `--resume` of one whose controller died or
was stopped. The controller runs here (rlboost/cli/controller_run.py), in the background (`-d`), or
on the trainer node (`controller: trainer`), which this process then follows."""

from __future__ import annotations

import contextlib
import secrets
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from rlboost.cli.commands.gc import report_gc
from rlboost.cli.confirm import Yes, confirm
from rlboost.cli.controller_run import (
    ControllerRun,
    job_commands,
    job_offers,
    print_outcome,
    run_controller,
    spot_market,
    start_detached,
)
from rlboost.cli.job_envs import (
    SECRET_ENVS_FILE,
    missing_values,
    parse_env_options,
    read_secret_envs,
    write_secret_envs,
)
from rlboost.cli.jobs_ref import resolve_job
from rlboost.cli.launch_options import LaunchOptions, resume_options
from rlboost.cli.launch_plan import print_plan, spent_before
from rlboost.cli.output import console, err, examples, fail
from rlboost.cli.pids import controller_identity
from rlboost.cli.state import JobExistsError, JobRow, StateStore, UnknownJobError, job_run_dir, rlboost_home
from rlboost.cli.step_numbers import resume_message
from rlboost.contracts.spec import JobSpec, SpecError, load_spec, spec_to_yaml
from rlboost.contracts.spec.text_limits import env_size_problem
from rlboost.contracts.wording import spot_workers

if TYPE_CHECKING:
    from rlboost.providers.pricing import Offer

EXAMPLES = examples(
    "rlboost launch examples/local.yaml",
    "rlboost launch --dryrun examples/aws-gcp.yaml",
    "rlboost launch --yes examples/aws-gcp.yaml",
    "rlboost launch -d job.yaml --set algorithm.steps=10 --env HF_TOKEN",
    "rlboost launch --resume JOB",
)


def _try_reward(spec: JobSpec, secret_values: list[str]) -> None:
    """A custom reward, called on a few of the job's rows: a reward that cannot score fails the plan."""
    import json
    import subprocess
    import sys

    from rlboost.contracts.redact import redact
    from rlboost.contracts.rewards import is_import_path

    if not is_import_path(spec.task.reward):
        return
    # a process of its own: the check reads the dataset (trainer code) and imports the user's module
    request = json.dumps({"spec": spec.model_dump(mode="json"), "secrets": secret_values})
    done = subprocess.run(
        [sys.executable, "-m", "rlboost.trainer.reward_check"], input=request, capture_output=True, text=True
    )
    try:
        answer = json.loads(done.stdout)
    except json.JSONDecodeError:
        tail = redact(done.stderr.strip()[-2000:], secret_values)
        fail(f"task.reward {spec.task.reward}: trying it on the job's rows failed (exit {done.returncode}):\n{tail}", 2)
    if "error" in answer:
        fail(answer["error"], 2)
    for line in answer["lines"] or []:
        console.print(line, markup=False, highlight=False)


def _check_provider(spec: JobSpec, dryrun: bool = False) -> None:
    """Clouds, regions, SDKs, the extras the job imports on this machine and (unless it is a dry run)
    credentials: before anything is launched, each missing library with the pip command that installs it."""
    from rlboost.cli.node_extras import missing_extras
    from rlboost.contracts.provider_kinds import provider_kind
    from rlboost.providers import PreflightError, preflight

    problems = []
    try:
        preflight(spec, check_credentials=not dryrun)
    except PreflightError as e:
        problems.append(str(e))
    problems += missing_extras(spec)
    if problems:
        fail("\n".join(problems), 2)
    if spec.setup and provider_kind(spec.provider).runs_here:
        err.print(  # its processes run in this environment, which the user set up already
            f"note: setup is not run for provider {spec.provider}: its trainer and workers run in this "
            "environment; install what setup installs here", markup=False, highlight=False
        )


def _check_boot_data(spec: JobSpec, t_offer: Offer, s_offers: list[Offer], saved: str) -> None:
    """What the job's nodes boot with, within its provider's limits (EC2 user-data, GCP metadata):
    else the cloud would refuse the trainer, or every worker, once the job is paying."""
    from rlboost.cli.launch_requests import sample_requests
    from rlboost.providers import provider_class

    problems = provider_class(spec.provider).boot_data_problems(sample_requests(spec, t_offer, s_offers), saved)
    if problems:
        fail("\n".join(problems), 2)


def _confirm_spending(
    spec: JobSpec, t_offer: Offer, s_offers: list[Offer], yes: bool, resuming: int | None = None
) -> None:
    """A provider whose instances cost money: say what starts, at what on-demand price, and ask
    (refused without --yes where nobody can answer). Local jobs never ask. `resuming`: the id of the
    job `launch --resume` continues (it starts again what is gone, so it asks like a new launch)."""
    from rlboost.contracts.provider_kinds import provider_kind
    from rlboost.rollout.scheduling import most_workers, shared_cores

    if not provider_kind(spec.provider).spends_money:
        return
    t = spec.trainer
    where = t_offer.cloud + (f"/{t_offer.region}" if t_offer.region else "")
    mw = most_workers(spec, shared_cores(spec))
    regions = sorted({f"{o.cloud}/{o.region or 'any region'}" for o in s_offers})
    accels = sorted({o.accelerator or "cpu" for o in s_offers})
    if resuming is None:
        head = f"job {spec.name} on provider {spec.provider} starts:"
        question = f"launch job {spec.name} on {spec.provider}?"
    else:
        head = (
            f"resuming job {spec.name} (id {resuming}) on provider {spec.provider}: what still runs is "
            "reattached, what is gone starts again:"
        )
        question = f"resume job {spec.name} (id {resuming}) on {spec.provider}?"
    summary = [
        head,
        f"  trainer: {t.nodes} × {t.accelerators or 'cpu'} on {where}, on-demand, "
        f"about ${t_offer.hourly_price:.2f}/h in all",
        f"  up to {spot_workers(mw)} ({', '.join(accels) or '-'}) in "
        + (", ".join(regions) or "-"),
    ]
    if s_offers and mw:
        worst = t_offer.hourly_price + mw * max(o.hourly_price for o in s_offers)
        summary.append(f"  at most about ${worst:.2f}/h with every spot worker up (`--dryrun` prints the plan)")
    confirm(summary, question, yes=yes)


def _confirm_resume(spec: JobSpec, job_id: int, yes: bool) -> None:
    """`launch --resume` of a node-controlled job: its offers are looked up only to say what it may spend."""
    from rlboost.contracts.provider_kinds import provider_kind

    if provider_kind(spec.provider).spends_money:
        t_offer, s_offers, _ = job_offers(spec)
        _confirm_spending(spec, t_offer, s_offers, yes, resuming=job_id)


def _check_sinks(spec: JobSpec) -> None:
    """The libraries of the job's metrics sinks, where its controller runs: here (a node installs
    them itself, with rlboost's `logging` extra)."""
    from rlboost.cli.metrics_sinks import sink_problems

    problems = sink_problems(spec) if spec.controller == "launcher" else []
    if problems:
        fail("\n".join(problems), 2)


def _check_budget(spec: JobSpec) -> None:
    if spec.budget_usd is None:
        return
    spent = spent_before(spec.name)
    if spent >= spec.budget_usd:
        fail(
            f"budget_usd: ${spec.budget_usd:.2f} is already spent (earlier runs of job {spec.name!r} cost "
            f"${spent:.2f}; see `rlboost cost-report {spec.name}`); raise budget_usd or use another job name",
            2,
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
    yes: Yes = False,
) -> None:
    """Provision the trainer, train, and keep bidding for spot rollout workers until the job ends.
    On a cloud provider it shows what it starts and asks first (-y/--yes: do not ask)."""
    if resume:
        if overrides or env_options:
            what = "--set" if overrides else "--env"
            fail(f"{what} applies to a new launch; --resume continues the job as saved (with its --env values)", 2)
        _resume(job_file, record_rollouts, detach, yes)
        return
    try:
        secret_envs = parse_env_options(env_options or [])
        spec = load_spec(Path(job_file), overrides or [], env_names=list(secret_envs))
    except SpecError as e:
        fail(str(e), 2)
    missing = missing_values(spec, secret_envs)
    if missing and not dryrun:  # a plan needs no secrets
        fail("\n".join(missing), 2)
    too_long = env_size_problem({**spec.envs, **secret_envs})  # the job file's checked alone, --env's here
    if too_long:
        fail(f"{too_long} (--env values included)", 2)
    _check_sinks(spec)
    _check_provider(spec, dryrun)
    if not dryrun:
        _check_budget(spec)
    t_offer, s_offers, prices = job_offers(spec)  # before any record exists: bad prices or traces fail here
    # the overrides are in the values; the header says which came from the command line
    saved = (
        "".join(f"# --set {o}\n" for o in overrides or [])
        + "".join(f"# --env {name} (secret: its value is kept in the run directory)\n" for name in secret_envs)
        + spec_to_yaml(spec)
    )
    _check_boot_data(spec, t_offer, s_offers, saved)
    market = spot_market(spec)
    if dryrun:
        _try_reward(spec, list(secret_envs.values()))
        print_plan(spec, t_offer, s_offers, prices)
        return
    _confirm_spending(spec, t_offer, s_offers, yes)
    store = StateStore()
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
    # at once: `rlboost gc` tells live from dead by it; `launch --resume` reapplies the options
    options = LaunchOptions(record_rollouts=record_rollouts).model_dump_json()
    store.update_job(job_id, **controller_identity(), launch_options=options)
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
        f"group {spec.algorithm.group_size}, up to {spot_workers(most_workers(spec, cores))}"
    )
    if note := cores_note(spec, cores):
        console.print(note, markup=False, highlight=False)
    if spec.controller == "trainer":
        _start_on_node(store, job_id, token, resume=False, record_rollouts=record_rollouts, detach=detach)
        return
    if detach:
        start_detached(store, job_id, run_dir, resume=False, record_rollouts=record_rollouts)
        return
    run_controller(
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
        f"this machine sleeps or this terminal closes\n" + job_commands(job_id),
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
    print_outcome(store, job_id)
    if job.status != "succeeded":
        fail(f"job {job.name} {job.status}: {job.error}")


def _resume(ref: str, record_rollouts: bool, detach: bool = False, yes: bool = False) -> None:
    """`launch --resume ID|NAME|FILE`: the same job id, run dir, token, ledger and launch options; a
    new controller."""
    from rlboost.cli.pids import controller_alive

    name = ref
    if ref.endswith((".yaml", ".yml")) and Path(ref).is_file():
        try:
            name = load_spec(Path(ref)).name
        except SpecError as e:
            fail(str(e), 2)
    store = StateStore()
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
    options = resume_options(job, record_rollouts)
    record_rollouts = options.record_rollouts
    if job.launch_options is None:  # recorded before options were kept: from now on they are
        store.update_job(job.id, launch_options=options.model_dump_json())
    if spec.controller == "trainer":
        _resume_on_node(store, job, token, record_rollouts, detach, lambda: _confirm_resume(spec, job.id, yes))
        return
    _check_provider(spec)
    t_offer, s_offers, _ = job_offers(spec)  # before the job record is touched: bad prices fail cleanly
    _confirm_spending(spec, t_offer, s_offers, yes, resuming=job.id)
    market = spot_market(spec)
    store.update_job(job.id, **controller_identity())
    console.print(
        f"[bold]rlboost[/] resuming job [cyan]{spec.name}[/] (id {job.id}): "
        + resume_message(job.step or 0)
        + (" (recording rollouts, as launched)" if record_rollouts else "")
    )
    if detach:
        start_detached(store, job.id, run_dir, resume=True, record_rollouts=record_rollouts)
        return
    run_controller(
        ControllerRun(spec, store, job.id, run_dir, token, record_rollouts, (t_offer, s_offers), market), resume=True
    )


def _resume_on_node(
    store: StateStore,
    job: JobRow,
    token: str,
    record_rollouts: bool,
    detach: bool,
    confirm_spending: Callable[[], None],
) -> None:
    """A node-controlled job whose controller died: start a new one on the node, on the node's records
    (`confirm_spending` asks first, once the job is known not to run)."""
    from rlboost.cli.node_client import controller_reachable, sync
    from rlboost.cli.node_host import trainer_node

    if job.remote and controller_reachable(job):
        sync(store, job)
        if store.job_by_id(job.id).active:
            fail(f"job {job.name!r} is still running on its trainer node; watch it with `rlboost status {job.id}`")
    confirm_spending()
    trainer_node(job).stop_controller()  # one that hangs without answering must not race the new one
    console.print(
        f"[bold]rlboost[/] resuming job [cyan]{escape(job.name)}[/] (id {job.id}) on its trainer node: "
        + escape(resume_message(job.step or 0))
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
    report_gc(results)
    try:
        return store.create_job(spec.name, spec_to_yaml(spec), spec.provider)
    except JobExistsError:
        return None
