"""What the control plane asks a provider to launch for a job's nodes: the on-demand trainer's request
and the files and variables every node gets. The controller uses both, and so does the CLI when it
starts a trainer node that runs the controller itself (node_host.py)."""

from __future__ import annotations

from rlboost.contracts.spec import JobSpec
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


def trainer_request(o: Offer, instance_id: str, owner: Owner, env: dict[str, str], command: list[str], files: dict):
    """The on-demand trainer's launch request at offer `o` (a controller's, or a SkyPilot trainer
    node's, whose head runs the controller)."""
    return LaunchRequest(
        instance_id=instance_id,
        owner=owner,
        role=Role.TRAINER,
        kind=InstanceKind.ON_DEMAND,
        cloud=o.cloud,
        region=o.region,
        accelerator=o.accelerator,
        hourly_price=o.hourly_price,
        env=env,
        command=command,
        **files,
    )
