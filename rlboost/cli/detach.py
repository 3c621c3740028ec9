"""`rlboost launch -d`: run a job's controller as a background process that outlives the shell.

The launching process does every check and creates the job's records, then starts the controller
(`rlboost _controller ID`) in its own session, so a closing terminal's SIGHUP never reaches it, with
stdin from /dev/null and stdout/stderr appended to the job's `controller.log`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from rlboost.contracts.env_names import Env

CONTROLLER_LOG = "controller.log"


def controller_log(run_dir: Path) -> Path:
    return run_dir / CONTROLLER_LOG


def spawn_controller(
    job_id: int, run_dir: Path, *, resume: bool, record_rollouts: bool, node_home: Path | None = None
) -> subprocess.Popen:
    """Start the job's controller in the background; its process (the caller may read how it ended
    while it starts; it is not waited for after). `node_home`: it runs as the trainer
    node's controller, on that node's own state (RLBOOST_HOME) and serving the control endpoint."""
    cmd = [sys.executable, "-m", "rlboost.cli.main", "_controller", str(job_id)]
    if resume:
        cmd.append("--resume")
    if record_rollouts:
        cmd.append("--record-rollouts")
    if node_home is not None:
        cmd.append("--serve-control")
    # the child imports rlboost.cli the way this process did, wherever it was started from
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env.setdefault("COLUMNS", "120")  # a file has no width; rich would wrap at 80
    if node_home is not None:
        env[Env.HOME] = str(node_home)
    with open(controller_log(run_dir), "ab") as log, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(
            cmd,
            stdin=devnull,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # no controlling terminal: a closing shell's SIGHUP cannot reach it
            close_fds=True,
            env=env,
        )
    return proc


def how_it_ended(proc: subprocess.Popen) -> str | None:
    """None while `proc` runs; else how it ended, in words (`exit code 2`, `killed by SIGKILL`)."""
    code = proc.poll()
    if code is None:
        return None
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"
