"""Which provider runs a job, how its clouds are priced, and what must hold before anything launches.

Cloud SDKs are imported lazily: `provider: local` needs none of them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlboost.contracts.provider_kinds import PROVIDER_KINDS, UnknownProviderError, provider_kind

if TYPE_CHECKING:
    from rlboost.contracts.spec import JobSpec
    from rlboost.providers.base import Owner, Provider, ProviderClass

# The class of each provider (module:class, imported when a job uses it); its `kind` is the record of
# the same name in rlboost/contracts/provider_kinds.py, which everything outside providers/ asks instead of
# comparing names.
PROVIDER_CLASSES: dict[str, str] = {
    "local": "rlboost.providers.local:LocalProvider",
    "skypilot": "rlboost.providers.skypilot:SkyPilotProvider",
    "aws": "rlboost.providers.aws:AwsProvider",
    "gcp": "rlboost.providers.gcp:GcpProvider",
}
# clouds each provider can launch on
PROVIDER_CLOUDS = {name: kind.clouds for name, kind in PROVIDER_KINDS.items()}
# the Python libraries each provider needs (imported lazily, when a job uses it)
PROVIDER_MODULES = {
    "local": ("torch",),
    "skypilot": ("sky",),
    "aws": ("boto3",),
    "gcp": ("google.cloud.compute_v1",),
}
INSTALL_HINT = {
    "local": "pip install 'rlboost[local]'",
    "skypilot": "pip install 'rlboost[skypilot]'",
    "aws": "pip install 'rlboost[aws]'",
    "gcp": "pip install 'rlboost[gcp]'",
}


class PreflightError(Exception):
    """The job cannot start; the message (one line per problem) says what to fix."""


def job_clouds(spec: JobSpec) -> list[str]:
    clouds = [spec.trainer.cloud]
    for c in spec.rollout.candidates:
        clouds.extend(c.clouds)
    return sorted(set(clouds))


# ---- credentials (checked from files and environment only: no network, no metadata server) ----
def _aws_credentials(env: dict[str, str]) -> str | None:
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return "environment (AWS_ACCESS_KEY_ID)"
    for var in ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_PROFILE"):
        if env.get(var):
            return f"environment ({var})"
    home = Path(env.get("HOME") or Path.home())
    for var, default in (("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"), ("AWS_CONFIG_FILE", ".aws/config")):
        path = Path(env[var]) if env.get(var) else home / default
        if path.is_file() and any(
            k in path.read_text(errors="replace")
            for k in ("aws_access_key_id", "sso_", "credential_process", "role_arn")
        ):
            return str(path)
    return None


def _gcp_credentials(env: dict[str, str]) -> str | None:
    if env.get("GOOGLE_APPLICATION_CREDENTIALS"):
        p = Path(env["GOOGLE_APPLICATION_CREDENTIALS"])
        return str(p) if p.is_file() else None
    home = Path(env.get("HOME") or Path.home())
    gcloud = Path(env["CLOUDSDK_CONFIG"]) if env.get("CLOUDSDK_CONFIG") else home / ".config" / "gcloud"
    for name in ("application_default_credentials.json", "credentials.db"):
        if (gcloud / name).is_file():
            return str(gcloud / name)
    return None


def gcp_project(env: dict[str, str] | None = None) -> str | None:
    """GOOGLE_CLOUD_PROJECT / CLOUDSDK_CORE_PROJECT, else gcloud's active configuration."""
    env = dict(os.environ if env is None else env)
    for var in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "GCLOUD_PROJECT"):
        if env.get(var):
            return env[var]
    home = Path(env.get("HOME") or Path.home())
    gcloud = Path(env["CLOUDSDK_CONFIG"]) if env.get("CLOUDSDK_CONFIG") else home / ".config" / "gcloud"
    active = gcloud / "active_config"
    name = active.read_text().strip() if active.is_file() else "default"
    cfg = gcloud / "configurations" / f"config_{name}"
    if cfg.is_file():
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "project" and value.strip():
                return value.strip()
    return None


CredentialCheck = Callable[[dict[str, str]], str | None]
CREDENTIAL_CHECKS: dict[str, CredentialCheck] = {"aws": _aws_credentials, "gcp": _gcp_credentials}
CREDENTIAL_HINTS = {
    "aws": "run `aws configure` (or set AWS_PROFILE / AWS_ACCESS_KEY_ID)",
    "gcp": "run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS)",
}


def credentials(clouds: list[str], env: dict[str, str] | None = None) -> dict[str, str | None]:
    """cloud -> where its credentials were found, or None. Clouds we cannot check are left out."""
    env = dict(os.environ if env is None else env)
    return {c: CREDENTIAL_CHECKS[c](env) for c in clouds if c in CREDENTIAL_CHECKS}


# ---- preflight ------------------------------------------------------------------------------
def preflight(spec: JobSpec, *, check_credentials: bool = True) -> None:
    """Everything that can be known before launching; PreflightError lists each problem and its fix."""
    kind = provider_kind(spec.provider)
    if kind.runs_here:
        return
    problems = []
    allowed = kind.clouds
    if spec.trainer.cloud not in allowed:
        problems.append(
            f"trainer.cloud: {spec.trainer.cloud!r} is not a cloud of provider {spec.provider!r} "
            f"(allowed: {', '.join(allowed)})"
        )
    for i, c in enumerate(spec.rollout.candidates):
        bad = [x for x in c.clouds if x not in allowed]
        if bad:
            problems.append(
                f"rollout.candidates[{i}].clouds: {bad[0]!r} is not a cloud of provider {spec.provider!r} "
                f"(allowed: {', '.join(allowed)})"
            )
        if kind.needs_regions and not c.regions:
            problems.append(
                f"rollout.candidates[{i}].regions: provider {spec.provider!r} launches into named regions; "
                "list at least one (or use provider: skypilot, which picks regions itself)"
            )
    if kind.needs_regions and not spec.trainer.region:
        problems.append(f"trainer.region: provider {spec.provider!r} needs the trainer's region")
    if not spec.trainer.accelerators:
        problems.append("trainer.accelerators: name the trainer's GPUs (e.g. 'A100:8') for a real cloud")
    module = PROVIDER_MODULES[spec.provider][0]
    if not _installed(module):  # found without importing it (SkyPilot takes seconds to import)
        problems.append(f"provider: {spec.provider!r} needs {module}; install it with {INSTALL_HINT[spec.provider]}")
    if check_credentials:
        for cloud, found in credentials(job_clouds(spec)).items():
            if found is None:
                problems.append(f"credentials: none found for {cloud}; {CREDENTIAL_HINTS[cloud]}")
        if spec.provider == "gcp" and gcp_project() is None:
            problems.append("credentials: no GCP project; set GOOGLE_CLOUD_PROJECT or `gcloud config set project`")
    if problems:
        raise PreflightError("\n".join(problems))


def _imports(module: str) -> str | None:
    """None if the module imports, else why not (a missing or a broken install)."""
    try:
        importlib.import_module(module)
    except Exception as e:  # any failure to import (missing, broken install) is what `check` reports
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def provider_check(provider: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`rlboost check` for one provider: do its libraries import, are its clouds' credentials found
    (files and environment only, as preflight). Clouds rlboost cannot check are listed as unchecked."""
    libraries = {m: _imports(m) for m in PROVIDER_MODULES[provider]}
    clouds = [c for c in PROVIDER_CLOUDS[provider] if c != "local"]
    found = credentials(clouds, env)
    missing = [f"{m}: {why} ({INSTALL_HINT[provider]})" for m, why in libraries.items() if why]
    creds = [f"{c}: no credentials; {CREDENTIAL_HINTS[c]}" for c, where in found.items() if where is None]
    return {
        "provider": provider,
        "libraries": {m: why is None for m, why in libraries.items()},
        "credentials": found,
        "unchecked_clouds": [c for c in clouds if c not in found],
        # a multi-cloud provider (skypilot) is usable with any one cloud's credentials
        "ready": not missing and (not clouds or any(found.values())),
        "problems": missing + creds,
    }


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


# ---- prices -----------------------------------------------------------------------------------
def price_lookup(spec: JobSpec) -> Any:
    """The price source for `providers.pricing` (None: the local provider's built-in table).

    It has a `sources` dict (cloud -> where its prices came from) for the plan."""
    source = provider_kind(spec.provider).pricing_source
    if source == "local-table":
        return None
    from rlboost.providers.prices import CloudPrices

    if source == "aws-live" and credentials(["aws"])["aws"]:
        from rlboost.providers.aws import AwsLivePrices

        return AwsLivePrices()
    return CloudPrices(use_skypilot=source == "skypilot-catalog")


# ---- construction -------------------------------------------------------------------------------
def make_provider(
    spec: JobSpec, run_dir: Path, *, owner: Owner, market: Any = None, trainer_here: bool = False
) -> Provider:
    """The provider for a job's run dir (`owner`: the job its instances are tagged with and listed by;
    `market`: the local provider's spot market; `trainer_here`: the controller runs on the job's cloud
    trainer node, which runs the trainer as a local process)."""
    provider = _cloud_or_local(spec, run_dir, owner, market)
    if not trainer_here:
        return provider
    from rlboost.providers.bootstrap import TRAINER_PORT
    from rlboost.providers.node_address import NoPublicAddress, public_host
    from rlboost.providers.trainer_here import TrainerHere

    try:
        host = public_host(spec.trainer.cloud)
    except NoPublicAddress as e:
        raise PreflightError(str(e)) from None
    # the port the node's task opened (rlboost/providers/bootstrap.py node_env)
    port = int(os.environ.get("RLBOOST_TRAINER_PORT", TRAINER_PORT))
    return TrainerHere(run_dir, provider, public_host=host, port=port, owner=owner)


def provider_class(name: str) -> ProviderClass:
    """The class of provider `name` (UnknownProviderError, naming the known ones, for any other)."""
    provider_kind(name)
    if name not in PROVIDER_CLASSES:
        raise UnknownProviderError(f"provider: {name!r} has a kind but no class in providers.PROVIDER_CLASSES")
    module, _, attr = PROVIDER_CLASSES[name].partition(":")
    return cast("ProviderClass", getattr(importlib.import_module(module), attr))


def _cloud_or_local(spec: JobSpec, run_dir: Path, owner: Owner, market: Any) -> Provider:
    try:
        cls = provider_class(spec.provider)
    except UnknownProviderError:
        raise PreflightError(f"provider: unknown provider {spec.provider!r}") from None
    return cls.for_job(spec, run_dir, owner=owner, market=market)
