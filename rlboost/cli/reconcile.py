"""Never leak a paid instance, never touch another's: reconcile the state store with what each
provider really holds, by the job's identity.

Every launch is recorded before it is sent, and every instance carries its job's uid in its cloud
tags from creation on, so after any crash the store knows every instance that may exist and the
provider can list exactly those of one job. `reconcile` terminates what is not wanted and marks the
store; `gc` does it for every job whose controller is gone (proven dead: its pid *and* process
start, rlboost/cli/pids.py). An instance is only ever matched by uid (by name and store job id for
a job recorded before uids), never by job name: a job name is reused, in this store and in another
sharing the cloud account. Instances of other stores are listed and left alone, unless
`gc --all-stores` asks for them; even then a job whose controller may still run (its instances'
controller tag, rlboost/cli/pids.py controller_tag) is kept, and said why.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import yaml

from rlboost.cli.node_client import controller_reachable, node_run_dir
from rlboost.cli.pids import controller_alive, tagged_controller_alive
from rlboost.cli.state import JobRow, StateStore, UnknownInstanceError, job_run_dir
from rlboost.contracts.provider_kinds import provider_kind
from rlboost.providers.base import (
    JOB_TAG,
    NODE_CONTROLLER,
    STORE_TAG,
    UID_TAG,
    InstanceState,
    Owner,
    Provider,
    Tagged,
)

if TYPE_CHECKING:
    from rlboost.contracts.spec import JobSpec

log = logging.getLogger("rlboost.reconcile")


@dataclass
class Reconciled:
    job: str
    terminated: list[str] = field(default_factory=list)  # confirmed gone
    unconfirmed: list[str] = field(default_factory=list)  # still listed by the provider at the deadline
    error: str | None = None


@dataclass(frozen=True)
class Foreign:
    """An rlboost instance a provider lists that no job of this store owns (another store's, maybe
    a colleague's on the same cloud account)."""

    provider: str
    instance: Tagged


@dataclass(frozen=True)
class Kept:
    """Another store's instance `gc --all-stores` left running: its job shows a sign of life."""

    foreign: Foreign
    why: str


@dataclass
class GcResult:
    jobs: list[Reconciled] = field(default_factory=list)
    foreign: list[Foreign] = field(default_factory=list)  # left alone (without --all-stores)
    foreign_ended: list[Reconciled] = field(default_factory=list)  # --all-stores: terminated
    foreign_kept: list[Kept] = field(default_factory=list)  # --all-stores: alive, left running

    @property
    def clean(self) -> bool:
        return not any(r.unconfirmed or r.error for r in (*self.jobs, *self.foreign_ended))


def owner_of(store: StateStore, job: JobRow) -> Owner:
    """The job by identity, as its instances are tagged."""
    return Owner(job.name, job.id, job.uid, store.store_id)


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
    """Terminate every instance of `job` (by its uid) that the provider lists, or the store calls live
    for this job, except `keep`; wait until the provider no longer lists them; mark the store."""
    owner = owner_of(store, job)
    targets = (set(provider.list_owned(owner)) | {i.id for i in store.live_instances(job.id)}) - set(keep)
    listed = lambda: set(provider.list_owned(owner))  # noqa: E731
    return terminate_all(store, provider, job.name, targets, listed, wait_s, check_every_s)


def terminate_all(
    store: StateStore,
    provider: Provider,
    label: str,
    targets: set[str],
    listed: Callable[[], set[str]],
    wait_s: float,
    check_every_s: float = 2.0,
) -> Reconciled:
    """Terminate `targets`, wait until `listed()` no longer holds them, and mark the store's records
    (an id the store never recorded, another store's, is only terminated)."""
    out = Reconciled(label)
    for iid in sorted(targets):
        provider.terminate(iid)
    remaining = set(targets)
    deadline = time.monotonic() + wait_s
    while remaining:
        apply_events(store, provider)
        remaining &= listed()
        if not remaining or time.monotonic() > deadline:
            break
        time.sleep(check_every_s)
        for iid in sorted(remaining):  # idempotent; the local provider SIGKILLs stragglers
            provider.terminate(iid)
    apply_events(store, provider)
    clock = provider.clock()
    for iid in sorted(targets - remaining):
        with contextlib.suppress(UnknownInstanceError):  # listed by tag but never recorded here
            store.update_instance(iid, InstanceState.TERMINATED, clock, "reconciled: terminated or never started")
    for iid in sorted(remaining):
        with contextlib.suppress(UnknownInstanceError):
            inst = store.instance(iid)
            why = "still listed by the provider; run `rlboost gc`"
            store.add_event(inst.job_id, "termination-unconfirmed", why, iid)
    out.terminated, out.unconfirmed = sorted(targets - remaining), sorted(remaining)
    return out


def listed_settled(
    provider: Provider, owner: Owner, want: set[str], *, lag_s: float, sleep: Callable[[float], object] = time.sleep
) -> set[str]:
    """What the provider lists for `owner`; while some of `want` is missing, asked again (backing off)
    until `lag_s` has passed, since a cloud's listing lags its changes (eventual consistency): nothing
    live is called gone on one listing."""
    deadline = time.monotonic() + lag_s
    attempt = 0
    while True:
        owned = set(provider.list_owned(owner))
        left = deadline - time.monotonic()
        if want <= owned or left <= 0:
            return owned
        sleep(min(left, 0.5 * 2 ** min(attempt, 4)))
        attempt += 1


def controller_running(job: JobRow) -> bool:
    """Does an active job's controller still own it: its very process here (pid and start), or a
    node controller that answers (or a launch still recording its controller)?"""
    if job.remote:
        return controller_reachable(job)
    return controller_alive(job.controller_pid, job.controller_start) or _just_created(job)


def take_over_node(job: JobRow) -> None:
    """A node controller that does not answer is cut off before its instances are reconciled from
    here, so it cannot relaunch what is being torn down (a cloud node is terminated; the local
    stand-in's controller process is killed)."""
    from rlboost.cli.node_host import trainer_node

    try:
        if trainer_node(job).cut_off():
            log.warning("job %s: cut off its unresponsive controller on the trainer node", job.name)
    except Exception as e:  # a cloud's error: what it still runs is reconciled from here all the same
        log.warning("job %s: could not cut off its trainer node (%s: %s)", job.name, type(e).__name__, e)


def _just_created(job: JobRow) -> bool:
    """A launch records the job, then its controller pid: give that a moment before calling it dead."""
    return job.controller_pid is None and time.time() - job.created_at < 5


def provider_for(job: JobRow, store: StateStore) -> Provider | None:
    """The provider that ran `job`, rebuilt from its stored spec (None: nothing could have launched)."""
    from rlboost.providers import make_provider

    spec = _spec(job)
    # a controller on the trainer node launched from there: the stand-in node keeps the local
    # provider's records (a cloud provider lists by the job's tag from anywhere)
    run_dir = node_run_dir(job) if job.remote else job_run_dir(job)
    if provider_kind(spec.provider).runs_here and not run_dir.is_dir():
        return None
    return make_provider(spec, run_dir, owner=owner_of(store, job))


def _spec(job: JobRow) -> JobSpec:
    """The job's stored spec. One an older rlboost saved under rules since tightened (a bound, a
    seed range) is read for where it ran alone: gc must always reach what a job launched."""
    from rlboost.contracts.spec import SpecError, parse_spec

    raw = yaml.safe_load(job.spec_yaml) or {"name": job.name}
    try:
        return parse_spec(raw, source=f"job {job.name}")
    except SpecError:
        where = _where_it_ran(raw)
        try:
            return parse_spec(where, source=f"job {job.name}")
        except SpecError:
            return parse_spec({k: v for k, v in where.items() if k != "local"}, source=f"job {job.name}")


def _where_it_ran(raw: dict) -> dict:
    """What a provider is built from: the job's provider, its trainer's and candidates' places, and
    the local market's clock (the local provider bills on it)."""
    trainer = raw.get("trainer") or {}
    rollout = raw.get("rollout") or {}
    return {
        "name": raw.get("name"),
        "provider": raw.get("provider", "local"),
        "controller": raw.get("controller", "launcher"),
        "trainer": {k: trainer[k] for k in ("cloud", "region", "accelerators", "nodes") if k in trainer},
        "rollout": {
            "max_workers": 0,
            "candidates": [
                {k: c[k] for k in ("accelerator", "clouds", "regions") if k in c}
                for c in rollout.get("candidates") or []
                if isinstance(c, dict)
            ],
        },
        "local": {k: v for k, v in (raw.get("local") or {}).items() if k in ("time_scale", "notice_seconds")},
    }


def _scope(job: JobRow) -> str:
    """Which cloud resources a job's provider lists: its provider and the clouds/regions it names."""
    spec = _spec(job)
    where = {(spec.trainer.cloud, spec.trainer.region or "")}
    where |= {(c, r) for cand in spec.rollout.candidates for c in cand.clouds for r in (cand.regions or [""])}
    return json.dumps([spec.provider, sorted(where)])


def gc(
    store: StateStore,
    *,
    names: list[str] | None = None,
    wait_s: float = 600.0,
    all_stores: bool = False,
) -> GcResult:
    """Clean every job (or those named) whose controller is gone: terminate what its provider lists
    under its uid and what the store still calls live; a job left 'running' by a dead controller is
    failed. Without `names`, also list every rlboost instance in the clouds this store's jobs used:
    one of this store's ended jobs is terminated, one of another store is reported (terminated with
    `all_stores`)."""
    out = GcResult()
    jobs = store.list_jobs()
    running: set[int] = set()
    done: set[int] = set()
    for job in jobs:
        if names is not None and job.name not in names:
            continue
        if job.active and controller_running(job):
            running.add(job.id)  # its controller is alive (or starting) and owns its instances
            continue
        res = _gc_job(store, job, wait_s)
        if res is not None:
            done.add(job.id)
            if res.terminated or res.unconfirmed or res.error:
                out.jobs.append(res)
    if names is None:
        _gc_listed(store, jobs, running | done, out, wait_s=wait_s, all_stores=all_stores)
    return out


def _gc_job(store: StateStore, job: JobRow, wait_s: float) -> Reconciled | None:
    """One job whose controller is gone (or that ended): what its records still call live, and what
    its provider lists under its uid."""
    if job.active and job.remote:
        from rlboost.cli.node_host import trainer_node

        if not trainer_node(job).lost():
            why = (
                "its trainer node is up but its controller does not answer; left alone "
                f"(`rlboost launch --resume {job.id}` restarts it, `rlboost down {job.id}` terminates it)"
            )
            return Reconciled(job.name, error=why)
        take_over_node(job)
    if not job.active and not store.live_instances(job.id):
        return None  # every instance it launched was confirmed gone (a lost one is found by listing)
    return _reconcile_job(store, job, wait_s)


def _reconcile_job(store: StateStore, job: JobRow, wait_s: float) -> Reconciled:
    try:
        provider = provider_for(job, store)
    except Exception as e:  # e.g. no credentials: say so, keep going with other jobs
        return Reconciled(job.name, error=f"cannot reach provider {job.provider}: {e}")
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
    return res


def _gc_listed(
    store: StateStore, jobs: list[JobRow], skip: set[int], out: GcResult, *, wait_s: float, all_stores: bool
) -> None:
    """List every rlboost instance in each cloud scope this store's jobs used (once a scope): an ended
    job's leftover (e.g. made by a launch call that failed after the cloud acted) is terminated;
    another store's is reported, or terminated with `all_stores`; a running job's, and one `skip`
    names (running, or reconciled already), is left alone."""
    by_uid = {j.uid: j for j in jobs if j.uid}
    legacy = [j for j in jobs if not j.uid]
    scopes: dict[str, JobRow] = {}
    for job in jobs:
        if not provider_kind(job.provider).runs_here:
            with contextlib.suppress(Exception):  # a spec that no longer parses names no scope
                scopes.setdefault(_scope(job), job)
    leftovers: set[int] = set()
    for rep in scopes.values():
        try:
            lister = provider_for(rep, store)
            listed = lister.list_tagged() if lister is not None else []
        except Exception as e:  # a cloud's error: reported, the other scopes still go
            out.jobs.append(Reconciled(rep.name, error=f"cannot list provider {rep.provider}: {type(e).__name__}: {e}"))
            continue
        finally:
            with contextlib.suppress(Exception):
                lister.close()  # type: ignore[union-attr]
        foreign = []
        for t in listed:
            job = by_uid.get(t.uid or "") or next(
                (j for j in legacy if owner_of(store, j).owns(t.instance_id, _tags(t))), None
            )
            if job is None:
                foreign.append(t)
            elif job.id not in skip:
                leftovers.add(job.id)
        out.foreign.extend(Foreign(rep.provider, t) for t in foreign)
        if all_stores:
            ended, kept = split_alive(foreign)
            out.foreign_kept.extend(Kept(Foreign(rep.provider, t), why) for t, why in kept)
            out.foreign_ended.extend(_end_foreign(store, rep, ended, wait_s))
    for job_id in sorted(leftovers):
        res = _reconcile_job(store, store.job_by_id(job_id), wait_s)
        if res.terminated or res.unconfirmed or res.error:
            out.jobs.append(res)


def split_alive(foreign: list[Tagged]) -> tuple[list[Tagged], list[tuple[Tagged, str]]]:
    """Other stores' instances: those whose job shows no sign of life (to end), and those kept with
    why. A job is judged as a whole: one instance launched by a live controller keeps them all (a
    resumed controller adopts what its dead predecessor launched)."""
    jobs: dict[object, list[Tagged]] = {}
    for t in foreign:
        o = _owner_from_tags(t)
        jobs.setdefault(o.uid or (o.name, o.job_id, o.store), []).append(t)
    ended: list[Tagged] = []
    kept: list[tuple[Tagged, str]] = []
    for group in jobs.values():
        why = next((w for w in map(sign_of_life, group) if w), None)
        if why is None:
            ended.extend(group)
        else:
            kept.extend((t, why) for t in group)
    return ended, kept


def sign_of_life(t: Tagged) -> str | None:
    """Why another store's instance may belong to a job that still runs (None: no sign of it). An
    instance launched before rlboost tagged its controller carries nothing to go by."""
    if not t.controller:
        return None
    if t.controller == NODE_CONTROLLER:
        return "its controller runs on its trainer node, which cannot be asked from here; `rlboost down` in its store"
    alive = tagged_controller_alive(t.controller)
    if alive is None:
        return "its controller ran on another machine, where it may still run; run `rlboost gc` there"
    return f"its controller (pid {t.controller.split('-')[2]}) is running on this machine" if alive else None


def _end_foreign(store: StateStore, rep: JobRow, foreign: list[Tagged], wait_s: float) -> list[Reconciled]:
    """`gc --all-stores`: terminate other stores' instances, each through a provider that acts as
    their own job (by their uid tag), so no other instance can be hit."""
    from rlboost.providers import make_provider

    owners: dict[Owner, set[str]] = {}
    for t in foreign:
        owners.setdefault(_owner_from_tags(t), set()).add(t.instance_id)
    out = []
    for owner, iids in sorted(owners.items(), key=lambda kv: sorted(kv[1])):
        label = f"{owner.name} (store {owner.store or 'unknown'})"
        try:
            provider = make_provider(_spec(rep), job_run_dir(rep), owner=owner)
        except Exception as e:
            out.append(Reconciled(label, error=f"cannot reach provider {rep.provider}: {e}"))
            continue
        try:
            out.append(
                terminate_all(store, provider, label, iids, lambda p=provider, o=owner: set(p.list_owned(o)), wait_s)
            )
        finally:
            provider.close()
    return out


def _owner_from_tags(t: Tagged) -> Owner:
    """The job a listed instance says it belongs to (a job recorded before uids: its store job id
    is in the instance name, `{job}-{id}-w001`)."""
    name = t.job or ""
    rest = t.instance_id[len(name) + 1 :] if t.instance_id.startswith(f"{name}-") else ""
    head = rest.split("-", 1)[0]
    return Owner(name, int(head) if head.isdigit() else -1, t.uid, t.store)


def _tags(t: Tagged) -> dict[str, str]:
    return {k: v for k, v in ((JOB_TAG, t.job), (UID_TAG, t.uid), (STORE_TAG, t.store)) if v}
