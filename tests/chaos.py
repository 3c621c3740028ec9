"""Fault injection against a running local job, from outside it (as a real preemption would come).

`BusyWorkerKiller` SIGKILLs spot workers at the moment the trainer reports them holding in-flight
responses, so a test is sure to exercise migration of partial responses however fast or slow the
machine is (a trace alone lands mostly between rollouts when steps are dominated by training).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from rlboost_cli.state import StateStore
from tests.conftest import rlboost_pids


def instance_pids(instance_id: str) -> list[int]:
    """Live processes started for this instance (their environment names it)."""
    return rlboost_pids(f"RLBOOST_INSTANCE_ID={instance_id}", exact=True)


class BusyWorkerKiller(threading.Thread):
    """Kill up to `kills` spot workers (SIGKILL, no notice), each while it is generating."""

    def __init__(self, home: Path, job: str, kills: int = 2, min_gap_s: float = 1.0, start_step: int = 1) -> None:
        super().__init__(daemon=True)
        self.home, self.job, self.kills, self.min_gap_s, self.start_step = home, job, kills, min_gap_s, start_step
        self.killed: list[str] = []
        self.stop = threading.Event()

    def _endpoint(self) -> tuple[str, str] | None:
        db = self.home / "state.db"
        if not db.exists():
            return None
        try:
            row = StateStore(db).get_job(self.job)
        except Exception:  # not created yet
            return None
        token_file = self.home / "jobs" / f"{self.job}-{row.id}" / "token"
        if not row.trainer_url or not token_file.exists():
            return None
        return row.trainer_url, token_file.read_text().strip()

    def run(self) -> None:
        last = 0.0
        seen: dict[str, int] = {}  # worker -> its token count at the previous poll
        while not self.stop.is_set() and len(self.killed) < self.kills:
            time.sleep(0.01)
            target = self._endpoint()
            if target is None:
                time.sleep(0.2)
                continue
            url, token = target
            try:
                st = httpx.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {token}"}, timeout=2).json()
            except (httpx.HTTPError, ValueError):
                continue
            workers = st.get("workers", [])
            before, seen = seen, {w["worker_id"]: w["tokens"] for w in workers}
            if st.get("step", 0) < self.start_step or time.monotonic() - last < self.min_gap_s:
                continue
            for w in workers:
                # `tokens` counts the whole job: only a rise since the last poll (~10 ms ago) says the
                # responses it holds now are mid-generation, not merely assigned
                streaming = w["tokens"] > before.get(w["worker_id"], w["tokens"])
                if w["kind"] == "spot" and w["state"] == "ready" and w["active"] > 0 and streaming:
                    if kill_instance(w["worker_id"]):
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


def kill_instance(instance_id: str) -> int:
    """SIGKILL every process group of an instance; how many processes were found."""
    pids = instance_pids(instance_id)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    return len(pids)


def job_step(home: Path, job: str) -> int:
    """The job's recorded step (0 before any), read from the state store like `rlboost status`."""
    try:
        return StateStore(home / "state.db").get_job(job).step or 0
    except Exception:  # not created yet
        return 0


def wait_until_step(home: Path, job: str, step: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while job_step(home, job) < step:
        if time.monotonic() > deadline:
            raise AssertionError(f"{job} never reached step {step}")
        time.sleep(0.05)
