"""What a cloud node needs at boot, shared by the SkyPilot, AWS and GCP providers.

A node gets its role, the trainer URL (workers), the job token, its worker id, the engine and the
source of preemption notices as environment variables, installs rlboost and starts the trainer or
the worker. No cloud credentials are ever part of it: workers only dial home to the trainer.
"""

from __future__ import annotations

import base64
import os
import shlex
from importlib import resources
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml

from contracts.worker_env import NAMES as WORKER_ENV
from contracts.worker_env import NOTICE_FILE
from providers.base import LaunchRequest, Role

TRAINER_PORT = 8787
SKY_WORKDIR = "~/sky_workdir"  # where SkyPilot syncs a task's workdir on its nodes
CONTROL_PORT = 8788  # a controller on the trainer node (`controller: trainer`) answers the CLI here
SOURCE_ROOT = Path(__file__).resolve().parents[1]

# The pip extras a job's node needs besides its engine's, comma-separated (rlboost_cli/node_extras.py
# decides them from the job file, which providers do not read): e.g. "hf,data".
EXTRAS_ENV = "RLBOOST_EXTRAS"

# Which metadata service a worker watches for preemption notices (worker/notice.py).
NOTICE_BY_CLOUD = {"aws": "aws", "gcp": "gcp"}


def template(name: str) -> str:
    return resources.files("templates").joinpath(name).read_text()


def is_source_checkout() -> bool:
    return (SOURCE_ROOT / "pyproject.toml").is_file() and (SOURCE_ROOT / "worker").is_dir()


def pip_spec(engine: str, *, from_workdir: bool, extras: tuple[str, ...] = ()) -> str:
    """What a node pip-installs: `$RLBOOST_PIP_SPEC`, else this checkout (synced as the SkyPilot
    workdir), else the released package of this version (`extras`: more than the engine needs)."""
    if os.environ.get("RLBOOST_PIP_SPEC"):
        return os.environ["RLBOOST_PIP_SPEC"]
    extra = ",".join(dict.fromkeys(("vllm" if engine == "vllm" else "local", *extras)))
    if from_workdir:
        return f".[{extra}]"
    try:
        ver = version("rlboost")
    except PackageNotFoundError:
        ver = "0.1.0"
    return f"rlboost[{extra}]=={ver}"


def job_extras(req: LaunchRequest) -> tuple[str, ...]:
    """The extras the job needs on this request's node (EXTRAS_ENV), in order."""
    return tuple(x for x in (e.strip() for e in req.env.get(EXTRAS_ENV, "").split(",")) if x)


def node_env(req: LaunchRequest, *, port: int, from_workdir: bool) -> dict[str, str]:
    """The node's environment, secrets included (callers keep RLBOOST_JOB_TOKEN and the job's
    secret variables, `req.user_secrets`, out of logs). The job's own variables first: rlboost's
    RLBOOST_* names (which a job file cannot use) are set over them."""
    env = {**req.user_envs, **req.user_secrets}
    env.update(
        {
            "RLBOOST_ROLE": req.role.value,
            "RLBOOST_INSTANCE_ID": req.instance_id,
            "RLBOOST_JOB": req.job,
            "RLBOOST_TRAINER_PORT": str(port),
            "RLBOOST_PIP_SPEC": pip_spec(
                req.env.get(WORKER_ENV["engine"], "torch"), from_workdir=from_workdir, extras=job_extras(req)
            ),
        }
    )
    # only what the worker/trainer read; never the controller's own environment
    env.update({k: v for k, v in req.env.items() if k.startswith("RLBOOST_") and k != NOTICE_FILE})
    # where the node is: a worker reports it so that weights are traded within its region
    env.setdefault(WORKER_ENV["cloud"], req.cloud)
    env.setdefault(WORKER_ENV["region"], req.region or "")
    if req.role is Role.WORKER and req.cloud in NOTICE_BY_CLOUD:
        env["RLBOOST_NOTICE"] = NOTICE_BY_CLOUD[req.cloud]
    return env


def cloud_spec_yaml(run_dir: Path) -> str:
    """The job file as the trainer node sees it: local-only paths (trace, catalog) removed, since
    they do not exist there and the trainer validates the file again."""
    raw = yaml.safe_load((run_dir / "spec.yaml").read_text())
    local = raw.get("local") or {}
    local.update({"trace": None, "catalog": None})
    raw["local"] = local
    # on the node a local mount is found where it was mounted, the workdir where SkyPilot syncs it:
    # a controller there passes those on to the workers it launches
    mounts = raw.get("file_mounts") or {}
    raw["file_mounts"] = {dest: (src if "://" in src else dest) for dest, src in mounts.items()} or None
    if raw.get("workdir"):
        raw["workdir"] = SKY_WORKDIR
    return yaml.safe_dump({k: v for k, v in raw.items() if v is not None}, sort_keys=False)


def boot_script(req: LaunchRequest, run_dir: Path, *, port: int = TRAINER_PORT) -> str:
    """templates/node_boot.sh with the node's environment in place (AWS user-data, GCP startup-script)."""
    env = node_env(req, port=port, from_workdir=False)
    if req.role is Role.TRAINER:
        env["RLBOOST_SPEC_B64"] = base64.b64encode(cloud_spec_yaml(run_dir).encode()).decode()
    lines = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return template("node_boot.sh").replace("# @RLBOOST_ENV@", lines)
