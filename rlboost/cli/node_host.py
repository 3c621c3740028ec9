"""Start a job's controller on its trainer node (`controller: trainer`), and cut off one that is lost.

With SkyPilot the node is the job's trainer cluster (SkyTrainerNode): its head runs the controller,
which runs the trainer next to itself. The local provider stands in for the trainer node with a
directory of the job's run dir (LocalTrainerNode): the node has its own RLBOOST_HOME (so its own
state store, written first, as a cloud node's would be) and its controller is a process in its own
session that serves the control endpoint (node_control.py). Either way the launching machine keeps
only the job's row, its token and a copy of the node's records.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from rlboost.cli import control_api as api
from rlboost.cli.detach import controller_log, how_it_ended, spawn_controller
from rlboost.cli.job_envs import read_secret_envs, split_envs, write_secret_envs
from rlboost.cli.node_client import node_home, node_run_dir, read_address, stop_node_controller_of
from rlboost.cli.state import JobRow, StateStore, UnknownJobError, job_run_dir
from rlboost.contracts.env_names import Env
from rlboost.contracts.provider_kinds import provider_kind

if TYPE_CHECKING:
    from rlboost.providers.skypilot import SkyPilotProvider


class NodeStartError(Exception):
    """The node controller did not come up; the message is user-facing."""


@dataclass(frozen=True)
class NodeJob:
    """What a trainer node is given of its job (the rest it records itself)."""

    job_id: int
    name: str
    provider: str
    spec_yaml: str
    token: str
    secret_envs: dict[str, str] = field(default_factory=dict)  # `launch --env` values
    uid: str | None = None  # the job's uid: the instances the node launches are tagged with it


def prepare_node(home: Path, job: NodeJob) -> Path:
    """On the node (or its stand-in): record the job in the node's own state store, under the
    launching machine's job id, and put its spec and token in its run dir; its run dir. A resumed
    job keeps its node records."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(home, 0o700)
    with StateStore(home / "state.db") as node_store:
        try:
            node_store.job_by_id(job.job_id)
        except UnknownJobError:
            node_store.create_job(job.name, job.spec_yaml, job.provider, job_id=job.job_id, uid=job.uid)
    run_dir = home / "jobs" / f"{job.name}-{job.job_id}"  # job_run_dir() of the node's RLBOOST_HOME
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    for fname, text in (("spec.yaml", job.spec_yaml), ("token", job.token)):
        path = run_dir / fname
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
    if job.secret_envs and not read_secret_envs(run_dir):
        write_secret_envs(run_dir, job.secret_envs)
    return run_dir


class LocalTrainerNode:
    def __init__(self, job: JobRow) -> None:
        self.launch_dir = job_run_dir(job)
        self.home = node_home(self.launch_dir)
        self.run_dir = node_run_dir(job)
        self.name, self.job_id, self.uid = job.name, job.id, job.uid

    def start(
        self, spec_yaml: str, token: str, *, resume: bool, record_rollouts: bool, timeout_s: float = 60.0
    ) -> api.ControlAddress:
        """Set the node up (first start) and start its controller; where it listens."""
        # `launch --env` values travel as the token does
        secret = read_secret_envs(self.launch_dir)
        prepare_node(self.home, NodeJob(self.job_id, self.name, "local", spec_yaml, token, secret, self.uid))
        (self.run_dir / api.CONTROL_FILE).unlink(missing_ok=True)
        proc = spawn_controller(
            self.job_id, self.run_dir, resume=resume, record_rollouts=record_rollouts, node_home=self.home
        )
        addr, ended = self._wait_listening(proc, timeout_s)
        if addr is None:
            tail = controller_log(self.run_dir).read_text(errors="replace")[-2000:]
            raise NodeStartError(f"the trainer node's controller exited while starting ({ended}):\n{tail}")
        return addr

    def _wait_listening(self, proc: subprocess.Popen, timeout_s: float) -> tuple[api.ControlAddress | None, str]:
        """Where the controller just started listens; or None and how it ended before it did. Its own
        exit status, not /proc: a child released by vfork may still show an empty command line."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            addr = read_address(self.run_dir)
            if addr is not None and addr.pid == proc.pid:
                return addr, ""
            ended = how_it_ended(proc)
            if ended is not None:
                return None, ended
            time.sleep(0.1)
        with contextlib.suppress(OSError):  # launched nothing yet that it could not tear down itself
            os.kill(proc.pid, signal.SIGTERM)
        raise NodeStartError(f"the trainer node's controller did not listen within {timeout_s:.0f}s")

    def cut_off(self) -> bool:
        """Stop a node controller that no longer answers, as losing the node would; whether one ran."""
        return stop_node_controller_of(self.run_dir)

    def stop_controller(self) -> None:
        """Before `--resume` starts a new controller: the old one must not race it."""
        stop_node_controller_of(self.run_dir)

    def lost(self) -> bool:
        """Is the node gone, so that `gc` may take its job over? The stand-in's controller that does
        not answer is treated as lost (its process is killed)."""
        return True


class SkyTrainerNode:
    """A SkyPilot cluster as the job's trainer node: its head runs the job's controller
    (rlboost/templates/node.sky.yaml), which runs the trainer next to itself and bids for spot workers."""

    def __init__(self, job: JobRow, provider: SkyPilotProvider | None = None) -> None:
        from rlboost.providers.skypilot import SkyPilotProvider

        self.job = job
        self.instance_id = f"{job.name}-{job.id}-trainer"  # the cluster is the job's trainer instance
        self.provider = provider or SkyPilotProvider(job_run_dir(job))

    def start(
        self, spec_yaml: str, token: str, *, resume: bool, record_rollouts: bool, timeout_s: float = 1800.0
    ) -> api.ControlAddress:
        """Launch the node (or start its task again: `resume`), then wait for its controller to answer
        (its setup installs rlboost first: minutes). `record_rollouts` is a local-provider option."""
        from rlboost.cli.launch_requests import node_files, trainer_request
        from rlboost.cli.node_client import NodeClient
        from rlboost.cli.node_extras import node_setup_env
        from rlboost.contracts.spec import parse_spec
        from rlboost.providers import price_lookup
        from rlboost.providers.base import NODE_CONTROLLER, CapacityError, Owner, ProviderError, Role
        from rlboost.providers.pricing import PricingError, trainer_offer

        spec = parse_spec(yaml.safe_load(spec_yaml), source=f"job {self.job.name}")
        envs = split_envs(spec, job_run_dir(self.job))
        try:
            offer = trainer_offer(spec, price_lookup(spec))
        except PricingError as e:
            raise NodeStartError(str(e)) from None
        env = {
            Env.JOB_TOKEN: token,
            Env.ENGINE: spec.rollout.engine,
            **node_setup_env(spec, Role.TRAINER),  # the trainer runs on this node
        }
        # the node's controller hands the job's variables and files on to its trainer and workers
        owner = Owner(self.job.name, self.job.id, self.job.uid, controller=NODE_CONTROLLER)
        req = trainer_request(offer, self.instance_id, owner, env, [], node_files(spec, *envs))
        try:
            url = self.provider.start_node(req, job_id=self.job.id, resume=resume)
        except (CapacityError, ProviderError) as e:
            raise NodeStartError(f"the trainer node did not come up: {e}") from None
        client = NodeClient(url, token)
        deadline = time.monotonic() + timeout_s
        while not client.ping():
            if time.monotonic() > deadline:
                raise NodeStartError(
                    f"the trainer node {self.instance_id} is up but its controller did not answer at {url} within "
                    f"{timeout_s / 60:.0f} min; see `sky logs {self.instance_id}`; `rlboost down {self.job.id}` "
                    "terminates it"
                )
            time.sleep(min(5.0, max(0.1, deadline - time.monotonic())))
        return api.ControlAddress(url=url, pid=0)

    def cut_off(self) -> bool:
        """Terminate the node (its controller does not answer). Its spot workers lose their trainer
        and power off by themselves (rlboost/templates/worker.sky.yaml); always True."""
        self.provider.down_node(self.instance_id)
        return True

    def lost(self) -> bool:
        """Is the node gone (not UP for SkyPilot)? A node that is up but does not answer (a network
        blip, a hung controller) is not taken over by `gc`: only `down` or `--resume` act on it. A
        status that cannot be read counts as up: nothing is terminated on a guess."""
        try:
            return not self.provider.node_up(self.instance_id)
        except Exception:  # SkyPilot's own errors: the caller says the node was left alone
            return False

    def stop_controller(self) -> None:
        """Before `--resume` runs the node's task again: cancel the old controller's SkyPilot job, so
        the new one gets the node's GPUs and records (the trainer it started runs in its own session
        and is reattached)."""
        self.provider.cancel_node_jobs(self.instance_id)


def trainer_node(job: JobRow) -> LocalTrainerNode | SkyTrainerNode:
    """The trainer node of a `controller: trainer` job, by its provider."""
    return SkyTrainerNode(job) if provider_kind(job.provider).trainer_node == "cluster" else LocalTrainerNode(job)
