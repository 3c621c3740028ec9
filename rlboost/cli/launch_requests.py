"""What the control plane asks a provider to launch for a job's nodes: the on-demand trainer's request,
a spot worker's, and the files and variables every node gets. The controller uses them, and so does
the CLI when it starts a trainer node that runs the controller itself (node_host.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from rlboost.cli.node_extras import node_setup_env
from rlboost.cli.state import InstanceRow
from rlboost.contracts.env_names import Env
from rlboost.contracts.spec import JobSpec
from rlboost.contracts.worker_env import WorkerEnv
from rlboost.providers.base import InstanceKind, LaunchRequest, Owner, Role
from rlboost.providers.pricing import Offer


def node_files(spec: JobSpec, user_envs: dict[str, str], user_secrets: dict[str, str]) -> dict:
    """What every node of the job gets besides rlboost's own environment (LaunchRequest fields)."""
    return {
        "user_envs": user_envs,
        "user_secrets": user_secrets,
        "file_mounts": dict(spec.file_mounts),
        "workdir": spec.workdir,
    }


def trainer_command(
    spec: JobSpec, run_dir: Path, runs_here: bool, record_rollouts: bool
) -> tuple[list[str], dict[str, str]]:
    """The trainer's command and its environment less the secret part (a token, or an enrolment commitment)."""
    cmd = [sys.executable, "-m", "rlboost.trainer", "--spec", str(run_dir / "spec.yaml"), "--linger", "30"]
    env = {Env.ENGINE: spec.rollout.engine, **node_setup_env(spec, Role.TRAINER)}
    if runs_here:  # checkpoints outlive the trainer process (clouds: trainer.checkpoint_dir)
        env[Env.CHECKPOINT_DIR] = str(run_dir / "checkpoints")
        env[Env.RECORD_DIR] = str(run_dir / "records")
    if record_rollouts:
        cmd.append("--record-rollouts")
    return cmd, env


def trainer_request(o: Offer, instance_id: str, owner: Owner, env: dict[str, str], command: list[str], files: dict):
    """The on-demand trainer's launch request at offer `o` (a controller's, or a SkyPilot trainer
    node's, whose head runs the controller)."""
    return LaunchRequest(
        instance_id=instance_id,
        owner=owner,
        role=Role.TRAINER,
        kind=InstanceKind.ON_DEMAND,
        **_placed(o),
        env=env,
        command=command,
        **files,
    )


def worker_request(
    spec: JobSpec,
    o: Offer,
    instance_id: str,
    owner: Owner,
    trainer_url: str,
    enrol: str,
    tls_env: dict[str, str],
    files: dict,
) -> LaunchRequest:
    """A spot worker's launch request at offer `o`: it dials `trainer_url` and trades `enrol` (a
    single-use credential) there for the job token and the job's secret variables."""
    env = WorkerEnv(
        trainer_url=trainer_url,
        enrol=enrol,
        worker_id=instance_id,
        kind="spot",
        engine=spec.rollout.engine,
        accelerator=o.accelerator or None,
        cloud=o.cloud,
        region=o.region or None,
    ).to_env()
    return LaunchRequest(
        instance_id=instance_id,
        owner=owner,
        role=Role.WORKER,
        kind=InstanceKind.SPOT,
        **_placed(o),
        env={**env, **node_setup_env(spec, Role.WORKER), **tls_env},
        command=[sys.executable, "-m", "rlboost.worker"],
        **{**files, "user_secrets": {}},  # enrolment hands them over
    )


def recorded_request(inst: InstanceRow, owner: Owner) -> LaunchRequest:
    """The request an instance the store recorded was launched with, as far as adopting it needs."""
    return LaunchRequest(
        instance_id=inst.id,
        owner=owner,
        role=Role(inst.role),
        kind=InstanceKind(inst.kind),
        cloud=inst.cloud,
        region=inst.region,
        accelerator=inst.accelerator,
        hourly_price=inst.hourly_price,
    )


def _placed(o: Offer) -> dict:
    """Where and at what price an offer places an instance (LaunchRequest fields)."""
    return {"cloud": o.cloud, "region": o.region, "accelerator": o.accelerator, "hourly_price": o.hourly_price}


def sample_requests(spec: JobSpec, t_offer: Offer, s_offers: list[Offer]) -> list[LaunchRequest]:
    """The trainer's and a spot worker's requests as the job's controller will build them, with stand-ins
    of the same length for what only exists once it runs (the enrolment commitment and credential, the
    trainer's address, its TLS pin): what `launch` checks each provider's boot data limits against."""
    from rlboost.contracts import enrolment
    from rlboost.contracts.env_names import Env
    from rlboost.contracts.provider_kinds import provider_kind

    owner = Owner(spec.name, 999_999, uid="0" * 32, store="0" * 32)
    plain = {k: v for k, v in spec.envs.items() if v is not None}
    files = node_files(spec, plain, {})  # secret variables are enrolled for, never boot data
    trainer_id = f"{spec.name}-999999-trainer"
    _, commitment = enrolment.trainer_key()
    secret = {Env.ENROL_COMMITMENT: commitment} if provider_kind(spec.provider).trainer_enrols else {}
    env = {**secret, Env.ENGINE: spec.rollout.engine, **node_setup_env(spec, Role.TRAINER)}
    out = [trainer_request(t_offer, trainer_id, owner, env, [], files)]
    if s_offers:
        iid = f"{spec.name}-999999-w999"
        enrol = enrolment.worker_credential("0" * 43, iid, trainer_id)
        url = "https://255.255.255.255:65535"
        out.append(worker_request(spec, s_offers[0], iid, owner, url, enrol, {Env.TLS_FINGERPRINT: "0" * 64}, files))
    return out
