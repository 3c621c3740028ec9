"""`rlboost rm JOB` and `rlboost gc --older-than AGE`: forget ended jobs (records and run dir).

A job stays addressable by id or name until it is removed here; an active job, or one with an
instance that may still bill, is never removed.
"""

from __future__ import annotations

import re
import shutil
import time

from rlboost.cli.state import JobRow, StateStore, job_run_dir

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class NotRemovable(Exception):
    """Why a job cannot be removed; the message is user-facing."""


def parse_age(text: str) -> float:
    """'7d', '12h', '30m', '90s', '2w' → seconds; ValueError with the accepted forms otherwise."""
    m = _AGE.match(text.lower())
    if not m:
        raise ValueError(f"{text!r} is not an age: use a number and a unit, e.g. 7d, 12h, 30m, 90s, 2w")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def remove_job(store: StateStore, job: JobRow) -> None:
    """Delete an ended job's records and run directory (NotRemovable says why not)."""
    job_removable(store, job)
    try:
        store.delete_job(job.id)
    except ValueError as e:  # became active or live since the checks above
        raise NotRemovable(f"job {job.name} (id {job.id}): {e}") from None
    shutil.rmtree(job_run_dir(job), ignore_errors=True)


def job_removable(store: StateStore, job: JobRow) -> None:
    """NotRemovable unless the job has ended and none of its instances may still be up."""
    ref = f"{job.name} (id {job.id})"
    if job.active:
        raise NotRemovable(
            f"job {ref} is {job.status}; stop it first with `rlboost down {job.id}` "
            f"(if its controller died, `rlboost gc` cleans it up)"
        )
    live = store.live_instances(job.id)
    if live:
        raise NotRemovable(
            f"job {ref} still has {len(live)} instance(s) not confirmed gone "
            f"({', '.join(i.id for i in live)}); run `rlboost gc` first"
        )


def ended_before(store: StateStore, age_s: float, *, now: float | None = None) -> list[JobRow]:
    """Ended jobs whose end (or creation, if no end was recorded) is older than `age_s`."""
    cutoff = (time.time() if now is None else now) - age_s
    return [j for j in store.list_jobs() if not j.active and (j.ended_at or j.created_at) < cutoff]
