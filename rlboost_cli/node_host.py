"""Start a job's controller on its trainer node (`controller: trainer`).

The local provider stands in for the trainer node with a directory of the job's run dir: the node
has its own RLBOOST_HOME (so its own state store, written first, as a cloud node's would be) and its
controller is a process in its own session that serves the control endpoint (node_control.py). The
launching machine keeps only the job's row, its token and a copy of the node's records.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from rlboost_cli import control_api as api
from rlboost_cli.detach import controller_log, spawn_controller
from rlboost_cli.job_envs import SECRET_ENVS_FILE
from rlboost_cli.node_client import node_home, node_run_dir, read_address
from rlboost_cli.pids import controller_alive
from rlboost_cli.state import JobRow, StateStore, UnknownJobError, job_run_dir


class NodeStartError(Exception):
    """The node controller did not come up; the message is user-facing."""


class LocalTrainerNode:
    def __init__(self, job: JobRow) -> None:
        self.launch_dir = job_run_dir(job)
        self.home = node_home(self.launch_dir)
        self.run_dir = node_run_dir(job)
        self.name, self.job_id = job.name, job.id

    def start(
        self, spec_yaml: str, token: str, *, resume: bool, record_rollouts: bool, timeout_s: float = 60.0
    ) -> api.ControlAddress:
        """Set the node up (first start) and start its controller; where it listens."""
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.home, 0o700)
        with StateStore(self.home / "state.db") as node_store:
            try:
                node_store.job_by_id(self.job_id)  # a resumed job keeps its node records
            except UnknownJobError:
                node_store.create_job(self.name, spec_yaml, "local", job_id=self.job_id)
        files = [("spec.yaml", spec_yaml), ("token", token)]
        secret_envs = self.launch_dir / SECRET_ENVS_FILE  # `launch --env` values travel as the token does
        if secret_envs.exists():
            files.append((SECRET_ENVS_FILE, secret_envs.read_text()))
        for fname, text in files:
            path = self.run_dir / fname
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(text)
        (self.run_dir / api.CONTROL_FILE).unlink(missing_ok=True)
        pid = spawn_controller(
            self.job_id, self.run_dir, resume=resume, record_rollouts=record_rollouts, node_home=self.home
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            addr = read_address(self.run_dir)
            if addr is not None and addr.pid == pid:
                return addr
            if not controller_alive(pid):
                tail = controller_log(self.run_dir).read_text(errors="replace")[-2000:]
                raise NodeStartError(f"the trainer node's controller exited while starting:\n{tail}")
            time.sleep(0.1)
        with contextlib.suppress(OSError):  # launched nothing yet that it could not tear down itself
            os.kill(pid, signal.SIGTERM)
        raise NodeStartError(f"the trainer node's controller did not listen within {timeout_s:.0f}s")
