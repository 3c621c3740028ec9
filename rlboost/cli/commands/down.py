"""`rlboost down`: stop a job (or every active one) and terminate every instance it owns."""

from __future__ import annotations

import os
import signal
import time
from typing import Annotated

import typer

from rlboost.cli.commands.common import named_job
from rlboost.cli.commands.gc import report_gc, run_gc
from rlboost.cli.output import console, err, examples, fail
from rlboost.cli.state import JobRow, StateStore
from rlboost.contracts.provider_kinds import provider_kind

EXAMPLES = examples("rlboost down my-job", "rlboost down --all")

ACTIVE = ("pending", "running")


def down(
    job: Annotated[str | None, typer.Argument(help="the job to stop: its id or name (newest run)")] = None,
    all_jobs: Annotated[bool, typer.Option("--all", help="stop every active job")] = False,
) -> None:
    """Stop a job and terminate every instance it owns."""
    store = StateStore()
    if all_jobs:
        ids = [j.id for j in store.list_jobs() if j.status in ACTIVE]
    elif job:
        ids = [named_job(store, job).id]
    else:
        fail("name a job (`rlboost down ID|NAME`) or pass --all; `rlboost status` lists jobs", 2)
    for job_id in ids:
        _down_one(store, job_id)
    if all_jobs:  # and whatever any ended or crashed job left behind
        report_gc(run_gc(store))


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


def _teardown_orphans(store: StateStore, job: JobRow) -> int:
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
