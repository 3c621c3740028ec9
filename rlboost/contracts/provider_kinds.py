"""What each provider can do, for code that must not branch on a provider's name.

One record per `provider:` value of the job file, in one registry. The job file's rules
(rlboost/contracts/spec/), the CLI, the simulator and the trainer ask a record
(`provider_kind(spec.provider).runs_here`) instead of comparing the name. The record names its class
(`provider_class`, imported only when a job uses it: rlboost/providers/__init__.py make_provider), and the
class holds the record as `kind`. Its clouds are records of rlboost/contracts/cloud_kinds.py.

Declarative only: it imports nothing of ours but cloud_kinds and the registry's class, so that a job file
validates on a node, which has no rlboost.providers. A new provider is its class module in
rlboost/providers/ plus its record here; from outside the package, `register_provider(ProviderKind(...))`
with its own class's path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from rlboost.contracts.cloud_kinds import cloud_kind
from rlboost.contracts.kind_registry import Registry


class UnknownProviderError(ValueError):
    """A provider name with no record; the message names the known ones."""


@dataclass(frozen=True)
class ProviderKind:
    name: str
    # its class as `module:Class`, imported when a job uses it
    provider_class: str
    # the Python libraries it needs (found without importing them by preflight, imported by `check`),
    # which `pip install 'rlboost[<extra>]'` installs
    libraries: tuple[str, ...]
    extra: str
    # the clouds it launches on (the job file's trainer.cloud and candidates' clouds): records of
    # rlboost/contracts/cloud_kinds.py
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
    # how long `down` waits for a controller (or trainer node) to confirm the job stopped
    confirm_timeout_s: float
    # how long a reconcile waits for terminations to be confirmed
    reconcile_wait_s: float
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
    # its instances cost real money: `rlboost launch` shows what it will start and asks first (unless
    # --yes). A provider registered from outside spends unless its record says otherwise.
    spends_money: bool = True

    @property
    def install_hint(self) -> str:
        return f"pip install 'rlboost[{self.extra}]'"

    @property
    def trainer_node_clouds(self) -> tuple[str, ...]:
        """The trainer clouds whose node can host the controller: a cluster node on a cloud whose record
        says where a node learns its public address. `controller:` defaults to `trainer` there."""
        if self.trainer_node != "cluster":
            return ()
        return tuple(c for c in self.clouds if cloud_kind(c).address is not None)


# the records, in the order the job file's errors and `rlboost check` list them
PROVIDER_KINDS: Registry[ProviderKind] = Registry(
    "provider", UnknownProviderError, "provider: unknown provider {name!r} (known: {known})"
)
unregister_provider = PROVIDER_KINDS.unregister
provider_names = PROVIDER_KINDS.names
provider_kind = PROVIDER_KINDS.of  # UnknownProviderError names the known ones


def register_provider(kind: ProviderKind) -> ProviderKind:
    """Add a provider's record (from outside the package too): its clouds must be registered
    (UnknownCloudError), its name free (ValueError)."""
    for cloud in kind.clouds:
        cloud_kind(cloud)
    return PROVIDER_KINDS.register(kind)


# a cloud's own API: one cloud, the regions the job names, a boot script (gcp differs in its prices)
_AWS = ProviderKind(
    name="aws",
    provider_class="rlboost.providers.aws:AwsProvider",
    libraries=("boto3",),
    extra="aws",
    clouds=("aws",),
    runs_here=False,
    billing_clock="wall",
    needs_regions=True,
    file_transfer=False,
    copies_local_files_only=False,
    trainer_node=None,
    confirm_timeout_s=900.0,
    reconcile_wait_s=600.0,
    pricing_source="aws-live",
    boot_templates=("node_boot.sh",),
    trainer_enrols=True,
)

for _kind in (
    ProviderKind(
        name="local",
        provider_class="rlboost.providers.local:LocalProvider",
        libraries=("torch",),
        extra="local",
        clouds=("local",),
        runs_here=True,
        billing_clock="trace",
        needs_regions=False,
        file_transfer=True,
        copies_local_files_only=True,
        trainer_node="process",
        confirm_timeout_s=60.0,
        reconcile_wait_s=60.0,
        pricing_source="local-table",
        boot_templates=(),
        trainer_enrols=True,
        boot_prior_s=2.0,
        listing_lag_s=0.0,  # the processes themselves are looked at
        spends_money=False,  # processes here, billed on a simulated price table
    ),
    ProviderKind(
        name="skypilot",
        provider_class="rlboost.providers.skypilot:SkyPilotProvider",
        libraries=("sky",),
        extra="skypilot",
        clouds=("aws", "gcp", "azure", "lambda", "runpod"),
        runs_here=False,
        billing_clock="wall",
        needs_regions=False,
        file_transfer=True,
        copies_local_files_only=False,
        trainer_node="cluster",
        confirm_timeout_s=900.0,
        reconcile_wait_s=600.0,
        pricing_source="skypilot-catalog",
        boot_templates=("trainer.sky.yaml", "worker.sky.yaml", "node.sky.yaml"),
        trainer_enrols=False,
    ),
    _AWS,
    replace(
        _AWS,
        name="gcp",
        provider_class="rlboost.providers.gcp:GcpProvider",
        libraries=("google.cloud.compute_v1",),
        extra="gcp",
        clouds=("gcp",),
        pricing_source="bundled-catalog",
    ),
):
    register_provider(_kind)

DEFAULT_PROVIDER = "local"  # a job file's provider when it names none
