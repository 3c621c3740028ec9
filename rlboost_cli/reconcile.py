"""Never leak a paid instance: reconcile the state store with what each provider really holds.

Every launch is recorded before it is sent, so after any crash the store knows every instance that
may exist; the provider knows which of them (and which older ones of the same job name) still do.
`reconcile` terminates what is not wanted and marks the store; `gc` does it for every job whose
controller is gone. `rlboost launch` runs it for a dead predecessor of the same name, `rlboost gc`
and `rlboost down --all` for all jobs.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

import yaml

from contracts.provider_kinds import provider_kind
from providers.base import InstanceState, Provider
from rlboost_cli.node_client import controller_reachable, node_run_dir
from rlboost_cli.pids import controller_alive
from rlboost_cli.state import JobRow, StateStore, UnknownInstanceError, job_run_dir

log = logging.getLogger("rlboost.reconcile")


@dataclass
class Reconciled:
    job: str
    terminated: list[str] = field(default_factory=list)  # confirmed gone
    unconfirmed: list[str] = field(default_factory=list)  # still listed by the provider at the deadline
    error: str | None = None


def apply_events(store: StateStore, provider: Provider) -> None:
    """Record what the provider reports; events about instances never recorded are ignored."""
    for ev in provider.poll():
        with contextlib.suppress(UnknownInstanceError):
            store.update_instance(ev.instance_id, ev.state, ev.at, ev.detail)


def reconcile(
    store: StateStore,
    provider: Provider,
    job: JobRow,
    *,
    keep: set[str] | frozenset[str] = frozenset(),
    wait_s: float = 600.0,
    check_every_s: float = 2.0,
) -> Reconciled:
    """Terminate every instance of `job.name` that the provider lists, or the store calls live for
    this job, except `keep`; wait until the provider no longer lists them; mark the store."""
    out = Reconciled(job.name)
    targets = (set(provider.list_owned(job.name)) | {i.id for i in store.live_instances(job.id)}) - set(keep)
    for iid in sorted(targets):
        provider.terminate(iid)
    remaining = set(targets)
    deadline = time.monotonic() + wait_s
    while remaining:
        apply_events(store, provider)
        remaining &= set(provider.list_owned(job.name))
        if not remaining or time.monotonic() > deadline:
            break
        time.sleep(check_every_s)
        for iid in sorted(remaining):  # idempotent; the local provider SIGKILLs stragglers
            provider.terminate(iid)
    apply_events(store, provider)
    clock = provider.clock()
    for iid in sorted(targets - remaining):
        with contextlib.suppress(UnknownInstanceError):  # listed by name/tag but never recorded
            store.update_instance(iid, InstanceState.TERMINATED, clock, "reconciled: terminated or never started")
    for iid in sorted(remaining):
        with contextlib.suppress(UnknownInstanceError):
            inst = store.instance(iid)
            why = "still listed by the provider; run `rlboost gc`"
            store.add_event(inst.job_id, "termination-unconfirmed", why, iid)
    out.terminated, out.unconfirmed = sorted(targets - remaining), sorted(remaining)
    return out


def controller_running(job: JobRow) -> bool:
    """Does an active job's controller still own it: a live process here, or a node controller that
    answers (or a launch still recording its controller)?"""
    if job.remote:
        return controller_reachable(job)
    return controller_alive(job.controller_pid) or _just_created(job)


def take_over_node(job: JobRow) -> None:
    """A node controller that does not answer is cut off before its instances are reconciled from
    here, so it cannot relaunch what is being torn down (a cloud node is terminated; the local
    stand-in's controller process is killed)."""
    from rlboost_cli.node_host import trainer_node

    try:
        if trainer_node(job).cut_off():
            log.warning("job %s: cut off its unresponsive controller on the trainer node", job.name)
    except Exception as e:  # a cloud's error: what it still runs is reconciled from here all the same
        log.warning("job %s: could not cut off its trainer node (%s: %s)", job.name, type(e).__name__, e)


def _just_created(job: JobRow) -> bool:
    """A launch records the job, then its controller pid: give that a moment before calling it dead."""
    return job.controller_pid is None and time.time() - job.created_at < 5


def provider_for(job: JobRow) -> Provider | None:
    """The provider that ran `job`, rebuilt from its stored spec (None: nothing could have launched)."""
    from contracts.spec import parse_spec
    from providers import make_provider

    spec = parse_spec(yaml.safe_load(job.spec_yaml) or {"name": job.name}, source=f"job {job.name}")
    # a controller on the trainer node launched from there: the stand-in node keeps the local
    # provider's records (a cloud provider lists by the job's tag from anywhere)
    run_dir = node_run_dir(job) if job.remote else job_run_dir(job)
    if provider_kind(spec.provider).runs_here and not run_dir.is_dir():
        return None
    return make_provider(spec, run_dir, job=job.name)


def gc(store: StateStore, *, names: list[str] | None = None, wait_s: float = 600.0) -> list[Reconciled]:
    """Clean every job (or those named) whose controller is gone: terminate what its provider still
    lists and what the store still calls live; a job left 'running' by a dead controller is failed."""
    results = []
    cleaned: set[tuple[str, str, str]] = set()  # (provider, name, run dir) done once
    for job in store.list_jobs():
        if names is not None and job.name not in names:
            continue
        if job.active and controller_running(job):
            continue  # its controller is alive (or starting) and owns its instances
        if job.active and job.remote:
            from rlboost_cli.node_host import trainer_node

            if not trainer_node(job).lost():
                why = (
                    "its trainer node is up but its controller does not answer; left alone "
                    f"(`rlboost launch --resume {job.id}` restarts it, `rlboost down {job.id}` terminates it)"
                )
                results.append(Reconciled(job.name, error=why))
                continue
            take_over_node(job)
        here = provider_kind(job.provider).runs_here
        if here and not job.active and not store.live_instances(job.id):
            continue  # its processes were confirmed gone (a cloud job is still listed: see below)
        # a cloud provider lists by job name: one listing covers every run of that name
        key = (job.provider, job.name, str(job_run_dir(job)) if here else "")
        if key in cleaned and not store.live_instances(job.id):
            continue
        cleaned.add(key)
        try:
            provider = provider_for(job)
        except Exception as e:  # e.g. no credentials: say so, keep going with other jobs
            results.append(Reconciled(job.name, error=f"cannot reach provider {job.provider}: {e}"))
            continue
        if provider is not None:
            try:
                res = reconcile(store, provider, job, wait_s=wait_s)
            finally:
                provider.close()
        else:
            res = Reconciled(job.name)
            for inst in store.live_instances(job.id):
                store.update_instance(inst.id, InstanceState.TERMINATED, job.clock or 0.0, "reconciled: never started")
                res.terminated.append(inst.id)
        if job.active:
            why = "controller died; cleaned by rlboost gc"
            store.update_job(job.id, status="failed", ended_at=time.time(), error=why)
        if res.terminated or res.unconfirmed or res.error:
            results.append(res)
    return results
