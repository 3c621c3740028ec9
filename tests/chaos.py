"""Fault injection against a running local job, from outside it (as a real preemption would come).

`BusyWorkerKiller` SIGKILLs spot workers only once the trainer reports them holding partial
responses (frozen first, so they cannot finish in between): a test is sure to exercise migration of
partial responses however fast or slow the machine is (a trace alone lands mostly between rollouts
when steps are dominated by training).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from rlboost.cli.state import StateStore
from tests.conftest import rlboost_pids


def instance_pids(instance_id: str) -> list[int]:
    """Live processes started for this instance (their environment names it)."""
    return rlboost_pids(f"RLBOOST_INSTANCE_ID={instance_id}", exact=True)


class BusyWorkerKiller(threading.Thread):
    """Kill up to `kills` spot workers (SIGKILL, no notice), each while it holds partial responses.

    Where a kill lands must not decide a test's outcome, so the event is forced rather than hoped
    for: a candidate worker (ready, holding responses) is frozen with SIGSTOP, the trainer's status
    is read until that worker's token count stops moving (the frames it had sent have arrived), and
    it is SIGKILLed only if it still holds responses that already have tokens; otherwise it is
    thawed and another moment is tried. A frozen worker cannot finish a response between the check
    and the kill.
    """

    def __init__(self, home: Path, job: str, kills: int = 2, min_gap_s: float = 1.0, start_step: int = 1) -> None:
        super().__init__(daemon=True)
        self.home, self.job, self.kills, self.min_gap_s, self.start_step = home, job, kills, min_gap_s, start_step
        self.killed: list[str] = []
        self.stop = threading.Event()
        # why each try that killed nothing ended (a failed fixture says it): not frozen, not a ready worker
        # or never settled, finished what it held, out of slices
        self.misses: Counter[str] = Counter()

    def _endpoint(self) -> tuple[str, str] | None:
        db = self.home / "state.db"
        if not db.exists():
            return None
        try:
            with StateStore(db) as store:
                row = store.get_job(self.job)
        except Exception:  # not created yet
            return None
        token_file = self.home / "jobs" / f"{self.job}-{row.id}" / "token"
        if not row.trainer_url or not token_file.exists():
            return None
        return row.trainer_url, token_file.read_text().strip()

    @staticmethod
    def _status(url: str, token: str) -> dict | None:
        try:
            return httpx.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {token}"}, timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return None

    def _worker(self, url: str, token: str, worker_id: str) -> dict | None:
        st = self._status(url, token)
        return next((w for w in (st or {}).get("workers", []) if w["worker_id"] == worker_id), None)

    def _kill_if_partial(self, url: str, token: str, worker_id: str) -> bool:
        """Freeze the worker, wait until the trainer has all it sent, kill it if it holds partials.

        A worker that holds responses but no tokens of an unfinished one yet is thawed for a short,
        growing slice and frozen again, until it does (or has nothing left): on a loaded machine the
        moment a poll happens to see partials is rare, the slices make it."""
        pids = instance_pids(worker_id)
        if not pids or not signal_groups(pids, signal.SIGSTOP):
            self.misses["not frozen"] += 1
            return False
        try:
            for slice_no in range(12):
                w = self._settled(url, token, worker_id)
                if w is None:
                    self.misses["not ready or never settled"] += 1
                    return False
                if w["partial"] > 0:
                    signal_groups(pids, signal.SIGKILL)
                    return True
                if w["active"] <= 0:
                    self.misses["held nothing left"] += 1
                    return False  # finished (or moved) all it held: another worker, another moment
                signal_groups(pids, signal.SIGCONT)
                time.sleep(0.005 * 2 ** min(slice_no, 6))
                signal_groups(pids, signal.SIGSTOP)
            self.misses["out of slices"] += 1
            return False
        finally:
            signal_groups(pids, signal.SIGCONT)  # a no-op on a killed group

    def _settled(self, url: str, token: str, worker_id: str) -> dict | None:
        """The frozen worker's record once its token count stops moving (the frames it had sent
        have arrived); None if it is not a ready worker or never settles within ~1 s."""
        last = None
        for _ in range(50):  # ~1 s frozen on a quiet machine (longer when the trainer answers slowly)
            time.sleep(0.02)
            w = self._worker(url, token, worker_id)
            if w is None or w["state"] != "ready":
                return None
            if last is not None and w["tokens"] == last:
                return w
            last = w["tokens"]
        return None

    def run(self) -> None:
        last = 0.0
        while not self.stop.is_set() and len(self.killed) < self.kills:
            time.sleep(0.01)
            target = self._endpoint()
            if target is None:
                time.sleep(0.2)
                continue
            url, token = target
            st = self._status(url, token)
            if st is None or st.get("step", 0) < self.start_step or time.monotonic() - last < self.min_gap_s:
                continue
            candidates = [w for w in st.get("workers", []) if w["kind"] == "spot" and w["state"] == "ready"]
            for w in candidates:  # every candidate of this moment, until one is killed
                if w["active"] > 0 and self._kill_if_partial(url, token, w["worker_id"]):
                    self.killed.append(w["worker_id"])
                    last = time.monotonic()
                    break


# ---- the fault suite's summary (printed by tests/conftest.py at the end of a run) --------------
@dataclass
class FaultRecord:
    fault: str
    injected: int
    recovered: int
    lost: int  # responses missing or duplicated in the run's record
    longest_recovery_s: float | None = None


FAULTS: list[FaultRecord] = []


def signal_groups(pids: list[int], sig: signal.Signals) -> int:
    """Send `sig` to the process group of each pid; how many groups were reached."""
    reached = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            os.killpg(pid, sig)
            reached += 1
    return reached


def kill_instance(instance_id: str) -> int:
    """SIGKILL every process group of an instance; how many processes were found."""
    pids = instance_pids(instance_id)
    signal_groups(pids, signal.SIGKILL)
    return len(pids)


def job_step(home: Path, job: str) -> int:
    """The job's recorded step (0 before any), read from the state store like `rlboost status`."""
    try:
        with StateStore(home / "state.db") as store:
            return store.get_job(job).step or 0
    except Exception:  # not created yet
        return 0


def wait_until_created(home: Path, job: str, timeout_s: float = 300) -> None:
    """Until `launch` has recorded the job in the store: before that a kill leaves nothing to resume."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with StateStore(home / "state.db") as store:
                store.get_job(job)
            return
        except Exception:  # no store or no row yet
            if time.monotonic() > deadline:
                raise AssertionError(f"{job} was never recorded") from None
            time.sleep(0.05)


def wait_until_step(home: Path, job: str, step: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while job_step(home, job) < step:
        if time.monotonic() > deadline:
            raise AssertionError(f"{job} never reached step {step}")
        time.sleep(0.05)
