"""What each cloud is to rlboost, for code that must not branch on a cloud's name.

One record per cloud a job file may name (`trainer.cloud`, a candidate's `clouds:`), in one registry:
the job file's rules (rlboost/contracts/spec/) validate against it, and code that needs a cloud's
mechanism asks its record for the *kind* of mechanism (a notice source, an address source, a credential
source) and looks that up among its own implementations: the worker's notice watchers
(rlboost/worker/notice.py), the node's address readers (rlboost/providers/node_address.py), the
credential checks (rlboost/providers/credentials.py). A new cloud whose mechanisms exist is one record
here; a new mechanism is one implementation there plus its name in the Literal below.

Declarative only: it imports nothing of ours but the registry's class, so that every node (which has
rlboost.contracts but no rlboost.providers) can read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlboost.contracts.kind_registry import Registry

# where a spot node learns it is about to be preempted: EC2's instance metadata (IMDSv2), GCE's metadata
# server, or a file its provider writes (the local provider's spot market)
NoticeSource = Literal["ec2-imds", "gce-metadata", "file"]
# where a node learns its own public address
AddressSource = Literal["ec2-imds", "gce-metadata"]
# where the launching machine's credentials for the cloud are found (files and environment only)
CredentialSource = Literal["aws-config", "gcloud"]

# a spot worker's provider sets Env.NOTICE to its cloud's notice source (rlboost/contracts/env_names.py)
# the base URL of each metadata service; Env.METADATA_URL overrides it (a test's server, a proxy)
METADATA_URLS: dict[str, str] = {
    "ec2-imds": "http://169.254.169.254",
    "gce-metadata": "http://metadata.google.internal",
}


class UnknownCloudError(ValueError):
    """A cloud name with no record; the message names the known ones."""


@dataclass(frozen=True)
class CloudKind:
    name: str
    # its nodes are processes on the launching machine: they share its network, its GPUs and its files
    # (no credentials, no metadata service, no regions)
    shares_machine: bool = False
    # where its spot workers learn of a preemption; None: no notice is watched (the node just goes)
    notice: NoticeSource | None = None
    # where its node learns the public address its workers dial; None: Env.PUBLIC_HOST must say
    address: AddressSource | None = None
    # where `check` and preflight look for its credentials; None: rlboost cannot check (SkyPilot does)
    credentials: CredentialSource | None = None
    # how to set its credentials up, as `check` and preflight print it
    credential_hint: str = ""
    # the price snapshot shipped for it (`rlboost/contracts/data/`), used where SkyPilot's catalog is not
    catalog: str | None = None


# the records, in the order the job file's errors list them
CLOUD_KINDS: Registry[CloudKind] = Registry("cloud", UnknownCloudError, "unknown cloud {name!r} (allowed: {known})")
register_cloud = CLOUD_KINDS.register  # from outside the package too
unregister_cloud = CLOUD_KINDS.unregister
cloud_names = CLOUD_KINDS.names
cloud_kind = CLOUD_KINDS.of  # UnknownCloudError names the known ones


for _kind in (
    CloudKind(
        name="aws",
        notice="ec2-imds",
        address="ec2-imds",
        credentials="aws-config",
        credential_hint="run `aws configure` (or set AWS_PROFILE / AWS_ACCESS_KEY_ID)",
        catalog="aws_vms.csv",
    ),
    CloudKind(
        name="gcp",
        notice="gce-metadata",
        address="gce-metadata",
        credentials="gcloud",
        credential_hint="run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS)",
        catalog="gcp_vms.csv",
    ),
    # reached through SkyPilot only, which checks their credentials itself
    CloudKind(name="azure"),
    CloudKind(name="lambda"),
    CloudKind(name="runpod"),
    CloudKind(name="local", shares_machine=True, notice="file"),
):
    register_cloud(_kind)

DEFAULT_CLOUD = "local"  # a job file's trainer.cloud and a candidate's clouds when it names none
