"""Which provider runs a job, how its clouds are priced, and what must hold before anything launches.

Cloud SDKs are imported lazily: `provider: local` needs none of them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlboost.contracts.cloud_kinds import cloud_kind
from rlboost.contracts.env_names import Env
from rlboost.contracts.provider_kinds import UnknownProviderError, provider_kind
from rlboost.providers.credentials import credentials, gcp_project

if TYPE_CHECKING:
    from rlboost.contracts.spec import JobSpec
    from rlboost.providers.base import Owner, Provider, ProviderClass

__all__ = [
    "PreflightError",
    "credentials",
    "gcp_project",
    "installed",
    "job_clouds",
    "make_provider",
    "preflight",
    "price_lookup",
    "provider_check",
    "provider_class",
]


class PreflightError(Exception):
    """The job cannot start; the message (one line per problem) says what to fix."""


def job_clouds(spec: JobSpec) -> list[str]:
    clouds = [spec.trainer.cloud]
    for c in spec.rollout.candidates:
        clouds.extend(c.clouds)
    return sorted(set(clouds))


# ---- preflight ------------------------------------------------------------------------------
def preflight(spec: JobSpec, *, check_credentials: bool = True) -> None:
    """Everything that can be known before launching; PreflightError lists each problem and its fix."""
    kind = provider_kind(spec.provider)
    problems: list[str] = []
    # the provider's libraries: a cloud's SDK, or (a provider whose instances run here) the trainer's torch
    problems += [
        f"provider: {spec.provider!r} needs {module}; install it with {kind.install_hint}"
        for module in kind.libraries
        if not installed(module)  # found without importing it (SkyPilot takes seconds to import)
    ]
    if kind.runs_here:
        if problems:
            raise PreflightError("\n".join(problems))
        return
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
    if check_credentials:
        for cloud, found in credentials(job_clouds(spec)).items():
            if found is None:
                problems.append(f"credentials: none found for {cloud}; {cloud_kind(cloud).credential_hint}")
        problems += provider_class(spec.provider).setup_problems()
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
    kind = provider_kind(provider)
    libraries = {m: _imports(m) for m in kind.libraries}
    clouds = [c for c in kind.clouds if not cloud_kind(c).shares_machine]
    found = credentials(clouds, env)
    missing = [f"{m}: {why} ({kind.install_hint})" for m, why in libraries.items() if why]
    creds = [f"{c}: no credentials; {cloud_kind(c).credential_hint}" for c, where in found.items() if where is None]
    return {
        "provider": provider,
        "libraries": {m: why is None for m, why in libraries.items()},
        "credentials": found,
        "unchecked_clouds": [c for c in clouds if c not in found],
        # a multi-cloud provider (skypilot) is usable with any one cloud's credentials
        "ready": not missing and (not clouds or any(found.values())),
        "problems": missing + creds,
    }


def installed(module: str) -> bool:
    """Is `module` installed? Found without importing it (importlib.util.find_spec)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


# ---- prices -----------------------------------------------------------------------------------
def price_lookup(spec: JobSpec) -> Any:
    """The price source for `providers.pricing` (None: the local provider's built-in table).

    It has a `sources` dict (cloud -> where its prices came from) for the plan."""
    kind = provider_kind(spec.provider)
    source = kind.pricing_source
    if source == "local-table":
        return None
    from rlboost.providers.prices import CloudPrices

    # live prices need the cloud's credentials (its pricing API); without them, the shipped catalog
    if source == "aws-live" and all(credentials(list(kind.clouds)).values()):
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
    port = int(os.environ.get(Env.TRAINER_PORT, TRAINER_PORT))
    return TrainerHere(run_dir, provider, public_host=host, port=port, owner=owner)


def provider_class(name: str) -> ProviderClass:
    """The class provider `name`'s record names, imported now (UnknownProviderError, naming the known
    ones, for a name with no record)."""
    kind = provider_kind(name)
    module, _, attr = kind.provider_class.partition(":")
    cls = cast("ProviderClass", getattr(importlib.import_module(module), attr))
    if cls.kind is not kind:
        raise UnknownProviderError(f"provider: {kind.provider_class}.kind is not the record of provider {name!r}")
    return cls


def _cloud_or_local(spec: JobSpec, run_dir: Path, owner: Owner, market: Any) -> Provider:
    try:
        cls = provider_class(spec.provider)
    except UnknownProviderError:
        raise PreflightError(f"provider: unknown provider {spec.provider!r}") from None
    return cls.for_job(spec, run_dir, owner=owner, market=market)
