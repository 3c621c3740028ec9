"""Running a job's controller in this process (attached `launch`, `launch --resume`, the background
`_controller`) or in the background (`launch -d`): its offers and spot market, the Controller itself,
and what is printed when it ends."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlboost.cli.output import console, fail
from rlboost.cli.pids import controller_identity
from rlboost.cli.state import StateStore
from rlboost.contracts.provider_kinds import provider_kind
from rlboost.contracts.spec import JobSpec
from rlboost.providers.pricing import PricingError, spot_offers, trainer_offer

if TYPE_CHECKING:
    from rlboost.providers.pricing import Offer
    from rlboost.providers.spot_market import SpotMarket


def spot_market(spec: JobSpec) -> SpotMarket:
    """The spot market the local provider replays (local.trace, scaled by local.capacity_scale)."""
    from rlboost.providers.spot_market import BUILTIN_TRACE, SpotMarket, TraceError, load_trace

    loc = spec.local
    try:
        trace = load_trace(loc.trace) if loc.trace else BUILTIN_TRACE
    except TraceError as e:
        fail(f"local.trace: {e}", 2)
    if loc.capacity_scale != 1.0:
        trace = trace.scaled(loc.capacity_scale)
    return SpotMarket(trace, notice_fraction=loc.notice_fraction, seed=spec.algorithm.seed)


def job_offers(spec: JobSpec):
    """(the trainer's offer, every spot candidate's, the price lookup); a price that cannot be found
    is a usage error (exit 2), before any record exists."""
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


def run_controller(run: ControllerRun, *, resume: bool, trainer_here: bool = False) -> None:
    from rlboost.cli.controller import Controller
    from rlboost.cli.detach import controller_log
    from rlboost.cli.reconcile import owner_of
    from rlboost.cli.warnings_log import WarningsToLog
    from rlboost.providers import make_provider

    spec, store, job_id, run_dir = run.spec, run.store, run.job_id, run.run_dir
    token, record_rollouts, market = run.token, run.record_rollouts, run.market
    t_offer, s_offers = run.offers
    try:
        owner = owner_of(store, store.job_by_id(job_id))
        with WarningsToLog(controller_log(run_dir)):  # a cloud SDK's import-time warnings too
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
        print_outcome(store, job_id)
    if status != "succeeded":
        fail(f"job {spec.name} {status}: {job.error}")


def print_outcome(store: StateStore, job_id: int) -> None:
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


def start_detached(store: StateStore, job_id: int, run_dir: Path, *, resume: bool, record_rollouts: bool) -> None:
    from rlboost.cli.detach import controller_log, spawn_controller

    pid = spawn_controller(job_id, run_dir, resume=resume, record_rollouts=record_rollouts).pid
    store.update_job(job_id, **controller_identity(pid))  # this process exits now; the job is the child's
    console.print(
        f"job id {job_id}: controller running in the background (pid {pid}), log {controller_log(run_dir)}\n"
        + job_commands(job_id),
        highlight=False,
        markup=False,
    )


def job_commands(job_id: int) -> str:
    """The commands for a job just started in the background, one a line (whole for copy and paste)."""
    return f"  follow: rlboost logs {job_id} -f\n  status: rlboost status {job_id}\n  stop:   rlboost down {job_id}"
