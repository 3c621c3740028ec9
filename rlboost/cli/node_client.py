"""The launching machine's side of a controller on the trainer node: copy its records, read its
logs, ask it to stop. Every call is short and bounded: a node that does not answer makes the CLI
fall back to its local copy, never hang."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from rlboost.cli import control_api as api
from rlboost.cli.metrics_log import METRICS_FILE
from rlboost.cli.pids import controller_alive
from rlboost.cli.state import JobRow, StateStore, job_run_dir
from rlboost.contracts.retry import Backoff, retry


class NodeUnreachable(Exception):
    """The node controller did not answer; the message says why (user-facing)."""


class NodeLogMissing(Exception):
    """The node has no such log; the message is user-facing."""


@dataclass
class NodeClient:
    url: str
    token: str
    timeout_s: float = 3.0

    @classmethod
    def for_job(cls, job: JobRow, timeout_s: float = 3.0) -> NodeClient:
        token = (job_run_dir(job) / "token").read_text().strip()
        return cls(job.controller_url or "", token, timeout_s)

    def _call(self, method: str, route: str, **params: str | int) -> httpx.Response:
        try:
            r = httpx.request(
                method,
                f"{self.url}{api.PREFIX}{route}",
                params=params,
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=self.timeout_s,
            )
        except httpx.HTTPError as e:
            raise NodeUnreachable(f"controller on the trainer node ({self.url}) unreachable: {e}") from None
        if r.status_code == 401:
            raise NodeUnreachable(f"controller on the trainer node ({self.url}) refused this job's token")
        return r

    def ping(self) -> bool:
        try:
            return self._call("GET", "/ping").status_code == 200
        except NodeUnreachable:
            return False

    def state(self) -> api.NodeState:
        r = self._call("GET", "/state")
        r.raise_for_status()
        return api.NodeState.model_validate_json(r.content)

    def logs(self, instance: str | None = None) -> list[api.LogRef]:
        r = self._call("GET", "/logs", **({"instance": instance} if instance else {}))
        if r.status_code == 404:
            raise NodeLogMissing(r.json().get("error", "no such log"))
        r.raise_for_status()
        return api.LogList.model_validate_json(r.content).logs

    def read_log(self, name: str, offset: int) -> bytes:
        r = self._call("GET", "/log", name=name, offset=offset)
        return r.content if r.status_code == 200 else b""

    def down(self) -> None:
        self._call("POST", "/down").raise_for_status()

    def release(self) -> None:
        self._call("POST", "/release").raise_for_status()


def sync(store: StateStore, job: JobRow, timeout_s: float = 3.0) -> bool:
    """Copy a node-controlled job's records from its node into `store`; False when the node does
    not answer (the store keeps its last copy, and `synced_at` says how old it is)."""
    if not job.remote:
        return True
    asked = time.time()  # before the request: a copy is as old as the moment it was asked for
    try:
        got = NodeClient.for_job(job, timeout_s).state()
    except (NodeUnreachable, OSError, httpx.HTTPError, ValueError):
        return False
    if not store.copy_from_node(job.id, got.job, got.instances, got.events, got.steps, as_of=asked):
        return True  # a newer copy (or this machine's own end of the job) is already here
    if not got.job.active:  # final: keep its logs here too, then let the node go
        release_ended(job, [i.instance_id for i in got.instances])
    return True


def release_ended(job: JobRow, instance_ids: list[str], timeout_s: float = 30.0) -> bool:
    """Copy an ended job's logs here (once), then release its node controller, which exits. A bulk
    copy, so a longer timeout than a status call's, and tried again: until it has succeeded the
    node keeps serving (up to its linger), and the next command tries anew."""

    def copy_then_release() -> None:
        client = NodeClient.for_job(job, timeout_s)
        if not (node_logs_dir(job) / "index.json").exists():  # copied whole by an earlier command
            copy_logs(client, job, instance_ids)
        client.release()

    failures = (NodeUnreachable, NodeLogMissing, OSError, httpx.HTTPError)
    with contextlib.suppress(*failures):
        retry(copy_then_release, tries=3, backoff=Backoff(base_s=0.5, cap_s=2.0), on=failures)
        return True
    return False


def copy_logs(client: NodeClient, job: JobRow, instance_ids: list[str]) -> None:
    """Copy the node's logs of `job` (controller, trainers, every instance) under its run dir here,
    laid out as on the node; `index.json` lists what `rlboost logs JOB` shows by default."""
    dest = node_logs_dir(job)
    shown = client.logs()
    refs = [*shown, api.LogRef(label="metrics", name=METRICS_FILE)]
    for iid in instance_ids:
        with contextlib.suppress(NodeLogMissing):
            refs += [r for r in client.logs(iid) if r not in refs]
    for ref in refs:
        path = (dest / ref.name).resolve()
        if not path.is_relative_to(dest.resolve()):
            continue  # a node naming a file outside its logs: not written here
        path.parent.mkdir(parents=True, exist_ok=True)
        # whole files only: another command may be copying the same logs, and the node may go away
        # (released by that one) halfway through this copy
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                off = 0
                while chunk := client.read_log(ref.name, off):
                    f.write(chunk)
                    off += len(chunk)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
    index = dest / "index.json"
    tmp = index.with_name(f".index.{os.getpid()}")
    tmp.write_text(api.LogList(logs=shown).model_dump_json())
    tmp.replace(index)  # last: its presence says the copy is complete


def node_logs_dir(job: JobRow) -> Path:
    """Where the launching machine keeps a node-controlled job's logs once it has ended."""
    return job_run_dir(job) / "node-logs"


def sync_all(store: StateStore, jobs: list[JobRow]) -> None:
    """Refresh the copies of every active node-controlled job among `jobs` (ended ones are final)."""
    for j in jobs:
        if j.remote and (j.active or j.synced_at is None):
            sync(store, j)


def node_home(run_dir: Path) -> Path:
    """The local provider's stand-in for a job's trainer node: a directory with its own RLBOOST_HOME."""
    return run_dir / "node" / "home"


def node_run_dir(job: JobRow) -> Path:
    """The job's run dir on its (stand-in) trainer node: where the node's provider keeps its instances."""
    run_dir = job_run_dir(job)
    return node_home(run_dir) / "jobs" / run_dir.name


def controller_reachable(job: JobRow) -> bool:
    try:
        return NodeClient.for_job(job, timeout_s=2.0).ping()
    except OSError:  # no token here: the run dir is gone
        return False


def read_address(run_dir: Path) -> api.ControlAddress | None:
    """The address a node controller wrote, or None while there is none (not yet listening)."""
    try:
        return api.ControlAddress.model_validate(json.loads((run_dir / api.CONTROL_FILE).read_text()))
    except (OSError, ValueError):
        return None


def stop_node_controller_of(run_dir: Path) -> bool:
    """Kill a stand-in node's controller that no longer answers, as terminating its cloud node
    would; whether one was running."""
    addr = read_address(run_dir)
    if addr is None or not controller_alive(addr.pid):
        return False
    with contextlib.suppress(OSError):
        os.kill(addr.pid, signal.SIGKILL)
    return True
