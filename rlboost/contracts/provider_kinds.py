"""What each provider kind can do, for code that must not branch on a provider's name.

One record per `provider:` value of the job file. The job file's rules (rlboost/contracts/spec.py), the CLI,
the simulator and the trainer ask a record (`provider_kind(spec.provider).runs_here`) instead of
comparing the name; each provider class in `rlboost/providers/` exposes its own (`LocalProvider.kind`) and
rlboost/providers/__init__.py builds the class the name maps to. Declarative only: it imports nothing of
ours, so that rlboost/contracts/spec.py can read it. A new provider adds a record here and a class there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal


class UnknownProviderError(ValueError):
    """A provider name with no record; the message names the known ones."""


@dataclass(frozen=True)
class ProviderKind:
    name: str
    # the clouds it launches on (the job file's trainer.cloud and candidates' clouds)
    clouds: tuple[str, ...]
    # instances are processes on this machine: no cloud, no credentials, records under the run dir
    runs_here: bool
    # the clock instances are billed on: the replayed spot trace's (scaled by local.time_scale), or wall time
    billing_clock: Literal["trace", "wall"]
    # launches only into the regions the job file names (rather than picking regions itself)
    needs_regions: bool
    # can carry `file_mounts:` and `workdir:` to its nodes
    file_transfer: bool
    # `file_mounts:` sources must be local paths (no s3:// or gs:// buckets)
    copies_local_files_only: bool
    # what hosts a `controller: trainer` job's controller: a process on this machine standing in for
    # the node, the job's trainer cluster, or nothing (the node would get no cloud credentials)
    trainer_node: Literal["process", "cluster"] | None
    # the trainer clouds whose node can host the controller (it learns its public address from the
    # cloud's metadata service); `controller:` defaults to `trainer` there
    trainer_node_clouds: tuple[str, ...]
    # how long `down` waits for a controller (or trainer node) to confirm the job stopped
    confirm_timeout_s: float
    # how long a reconcile waits for terminations to be confirmed
    reconcile_wait_s: float
    # where a spot worker learns of its preemption: a file the provider writes, or its cloud's metadata service
    preemption_notices: Literal["file", "metadata"]
    # where its prices come from (rlboost/providers/prices.py, rlboost/providers/pricing.py)
    pricing_source: Literal["local-table", "skypilot-catalog", "aws-live", "bundled-catalog"]
    # the templates/ files its nodes boot from (none: a local process needs none)
    boot_templates: tuple[str, ...]
    # its trainer boots with an enrolment commitment only, makes its own TLS certificate and is handed
    # the job token and secret variables after proving itself (rlboost/contracts/enrolment.py): its launch
    # environment is boot data a cloud shows (user-data), or a process here, on the same path. Else
    # (SkyPilot) they travel as task secrets, which the cluster's other nodes read too.
    trainer_enrols: bool
    # a spot worker's launch -> dialled in, in wall seconds, before any is seen (placement's prior):
    # a cloud VM's boot and image pull, or a local process's start (~1.7 s measured here, plus its pull)
    boot_prior_s: float = 120.0
    # how long the provider's listing may lag a change (a cloud API's eventual consistency): an
    # instance missing from it is asked for again over this long before it is called gone
    listing_lag_s: float = 30.0


# a cloud's own API: one cloud, the regions the job names, a boot script (gcp differs in its prices)
_AWS = ProviderKind(
    name="aws",
    clouds=("aws",),
    runs_here=False,
    billing_clock="wall",
    needs_regions=True,
    file_transfer=False,
    copies_local_files_only=False,
    trainer_node=None,
    trainer_node_clouds=(),
    confirm_timeout_s=900.0,
    reconcile_wait_s=600.0,
    preemption_notices="metadata",
    pricing_source="aws-live",
    boot_templates=("node_boot.sh",),
    trainer_enrols=True,
)

PROVIDER_KINDS: dict[str, ProviderKind] = {
    k.name: k
    for k in (
        ProviderKind(
            name="local",
            clouds=("local",),
            runs_here=True,
            billing_clock="trace",
            needs_regions=False,
            file_transfer=True,
            copies_local_files_only=True,
            trainer_node="process",
            trainer_node_clouds=(),
            confirm_timeout_s=60.0,
            reconcile_wait_s=60.0,
            preemption_notices="file",
            pricing_source="local-table",
            boot_templates=(),
            trainer_enrols=True,
            boot_prior_s=2.0,
            listing_lag_s=0.0,  # the processes themselves are looked at
        ),
        ProviderKind(
            name="skypilot",
            clouds=("aws", "gcp", "azure", "lambda", "runpod"),
            runs_here=False,
            billing_clock="wall",
            needs_regions=False,
            file_transfer=True,
            copies_local_files_only=False,
            trainer_node="cluster",
            trainer_node_clouds=("aws", "gcp"),
            confirm_timeout_s=900.0,
            reconcile_wait_s=600.0,
            preemption_notices="metadata",
            pricing_source="skypilot-catalog",
            boot_templates=("trainer.sky.yaml", "worker.sky.yaml", "node.sky.yaml"),
            trainer_enrols=False,
        ),
        _AWS,
        replace(_AWS, name="gcp", clouds=("gcp",), pricing_source="bundled-catalog"),
    )
}


def provider_kind(name: str) -> ProviderKind:
    """The record of provider `name`; UnknownProviderError (naming the known ones) for any other."""
    try:
        return PROVIDER_KINDS[name]
    except KeyError:
        raise UnknownProviderError(
            f"provider: unknown provider {name!r} (known: {', '.join(PROVIDER_KINDS)})"
        ) from None
