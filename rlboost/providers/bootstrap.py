"""What a cloud node needs at boot, shared by the SkyPilot, AWS and GCP providers.

A node gets its role, the trainer URL (workers), its enrolment credential (or, on SkyPilot's trainer
cluster, the job token as a task secret), its worker id, the engine and the source of preemption
notices as environment variables, installs rlboost and starts the trainer or the worker. No cloud
credentials are ever part of it: workers only dial home to the trainer. AWS user-data and GCP
startup-script metadata (boot_script) never hold the job token, a TLS key or a secret variable:
anyone allowed to describe the instance, and every process on the node, can read them.
"""

from __future__ import annotations

import base64
import os
import shlex
from importlib import resources
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml

from rlboost.contracts.cloud_kinds import CLOUD_KINDS
from rlboost.contracts.env_names import PREFIX, Env
from rlboost.contracts.tls import SECRET_ENV
from rlboost.providers.base import LaunchRequest, ProviderError, Role

TRAINER_PORT = 8787
SKY_WORKDIR = "~/sky_workdir"  # where SkyPilot syncs a task's workdir on its nodes
CONTROL_PORT = 8788  # a controller on the trainer node (`controller: trainer`) answers the CLI here
SOURCE_ROOT = Path(__file__).resolve().parents[2]

# Env.EXTRAS: the pip extras a job's node needs besides its engine's, comma-separated
# (rlboost/cli/node_extras.py decides them from the job file, which providers do not read): e.g. "hf,data".


def template(name: str) -> str:
    return resources.files("rlboost.templates").joinpath(name).read_text()


def is_source_checkout() -> bool:
    return (SOURCE_ROOT / "pyproject.toml").is_file() and (SOURCE_ROOT / "rlboost" / "worker").is_dir()


def pip_spec(engine: str, *, from_workdir: bool, extras: tuple[str, ...] = ()) -> str:
    """What a node pip-installs: `$RLBOOST_PIP_SPEC`, else this checkout (synced as the SkyPilot
    workdir), else the released package of this version (`extras`: more than the engine needs)."""
    if os.environ.get(Env.PIP_SPEC):
        return os.environ[Env.PIP_SPEC]
    extra = ",".join(dict.fromkeys(("vllm" if engine == "vllm" else "local", *extras)))
    if from_workdir:
        return f".[{extra}]"
    try:
        ver = version("rlboost")
    except PackageNotFoundError:
        ver = "0.1.0"
    return f"rlboost[{extra}]=={ver}"


def job_extras(req: LaunchRequest) -> tuple[str, ...]:
    """The extras the job needs on this request's node (Env.EXTRAS), in order."""
    return tuple(x for x in (e.strip() for e in req.env.get(Env.EXTRAS, "").split(",")) if x)


def node_env(req: LaunchRequest, *, port: int, from_workdir: bool) -> dict[str, str]:
    """The node's environment, secrets included where the request has any (SkyPilot passes them as
    task secrets; boot_script refuses them). The job's own variables first: rlboost's RLBOOST_*
    names (which a job file cannot use) are set over them."""
    env = {**req.user_envs, **req.user_secrets}
    env.update(
        {
            Env.ROLE: req.role.value,
            Env.INSTANCE_ID: req.instance_id,
            Env.JOB: req.job,
            Env.TRAINER_PORT: str(port),
            Env.PIP_SPEC: pip_spec(req.env.get(Env.ENGINE, "torch"), from_workdir=from_workdir, extras=job_extras(req)),
        }
    )
    # only what the rlboost/worker/trainer read; never the controller's own environment
    # (an empty one is unset: a worker enrolling for its token boots with no RLBOOST_JOB_TOKEN at all)
    env.update({k: v for k, v in req.env.items() if k.startswith(PREFIX) and v and k != Env.NOTICE_FILE})
    # where the node is: a worker reports it so that weights are traded within its region
    env.setdefault(Env.CLOUD, req.cloud)
    env.setdefault(Env.REGION, req.region or "")
    env.update(notice_env(req))
    return env


def notice_env(req: LaunchRequest) -> dict[str, str]:
    """Where a spot worker watches for its preemption notice (rlboost/worker/notice.py), as its cloud's
    record says: RLBOOST_NOTICE names the source (a metadata service, or the provider's notice file)."""
    cloud = CLOUD_KINDS.get(req.cloud)
    if req.role is not Role.WORKER or cloud is None or cloud.notice is None:
        return {}
    return {Env.NOTICE: cloud.notice}


def cloud_spec_yaml(run_dir: Path) -> str:
    """The job file as the trainer node sees it: local-only paths (trace, catalog) removed, since
    they do not exist there and the trainer validates the file again."""
    return cloud_spec_text((run_dir / "spec.yaml").read_text())


def cloud_spec_text(saved: str) -> str:
    """cloud_spec_yaml of the saved job file's text `saved`."""
    raw = yaml.safe_load(saved)
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


# what boot data must never hold (besides the job's secret variables, LaunchRequest.user_secrets)
BOOT_SECRETS = (Env.JOB_TOKEN, *SECRET_ENV)


def boot_script(req: LaunchRequest, run_dir: Path, *, port: int = TRAINER_PORT) -> str:
    """templates/node_boot.sh with the node's environment in place (AWS user-data, GCP startup-script).
    ProviderError for a request that would put a secret there: its node enrols for them instead."""
    saved = (run_dir / "spec.yaml").read_text() if req.role is Role.TRAINER else ""
    return render_boot(req, saved, port=port)


def render_boot(req: LaunchRequest, saved: str, *, port: int = TRAINER_PORT) -> str:
    """boot_script with the saved job file's text (`saved`, read by a trainer only) given."""
    held = sorted({k for k in BOOT_SECRETS if req.env.get(k)} | {k for k, v in req.user_secrets.items() if v})
    if held:
        raise ProviderError(
            f"{req.instance_id}: refusing to put {', '.join(held)} into boot data, which anyone allowed to "
            "describe the instance can read; the node enrols for the job token and the secret variables"
        )
    env = node_env(req, port=port, from_workdir=False)
    if req.role is Role.TRAINER:
        env[Env.SPEC_B64] = base64.b64encode(cloud_spec_text(saved).encode()).decode()
    lines = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return template("node_boot.sh").replace("# @RLBOOST_ENV@", lines)


def boot_size_problems(requests: list[LaunchRequest], saved: str, *, limit: int, what: str) -> list[str]:
    """One line per request whose boot data (render_boot) is over `limit` bytes, naming what fills it
    (the job's `setup:`, its `envs:`, the job file the trainer boots with) and the fix; checked before
    anything is created, so that no cloud refuses an instance mid-job (`what`: the cloud's name for it)."""
    out = []
    for req in requests:
        size = len(render_boot(req, saved).encode())
        if size <= limit:
            continue
        setup = len(base64.b64decode(req.env.get(Env.SETUP_B64, "")))
        envs = sum(len(k) + len(v.encode()) + 1 for k, v in req.user_envs.items())
        again = ", and again in the job file" if req.role is Role.TRAINER else ""
        parts = [f"setup: {setup:,} bytes (base64'd{again})"] if setup else []
        parts += [f"envs: {envs:,} bytes"] if envs else []
        parts += [f"the job file: {len(saved.encode()):,} bytes (base64'd)"] if req.role is Role.TRAINER else []
        fields = "/".join(f for f, n in (("setup", setup), ("envs", envs)) if n) or "the job file"
        out.append(
            f"{fields}: the {req.role.value}'s {what} would be {size:,} bytes, over its limit of "
            f"{limit:,} ({'; '.join(parts)}); shorten setup to a few commands that fetch and run a script "
            "(pip install a package, download the script from a bucket) and keep long values out of envs"
        )
    return out
