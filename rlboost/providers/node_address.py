"""The trainer node's public address, as its spot workers (in any region or cloud) must dial it.

A node's processes only see their private interfaces; the public IP is known to the cloud's
metadata service (AWS IMDSv2, GCE metadata), the same services workers watch for preemption
notices. `RLBOOST_PUBLIC_HOST` overrides it (a proxy or a load balancer in front of the node).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import httpx

from rlboost.contracts.cloud_kinds import CLOUD_KINDS, METADATA_URLS
from rlboost.contracts.env_names import Env


class NoPublicAddress(Exception):
    """The node's public address could not be found; the message says how to give it."""


def _ec2_imds(base: str, timeout: float) -> str:
    token = httpx.put(
        f"{base}/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}, timeout=timeout
    )
    token.raise_for_status()
    r = httpx.get(
        f"{base}/latest/meta-data/public-ipv4", headers={"X-aws-ec2-metadata-token": token.text}, timeout=timeout
    )
    r.raise_for_status()
    return r.text


def _gce_metadata(base: str, timeout: float) -> str:
    r = httpx.get(
        f"{base}/computeMetadata/v1/instance/network-interfaces/0/access-configs/0/external-ip",
        headers={"Metadata-Flavor": "Google"},
        timeout=timeout,
    )
    r.raise_for_status()
    return r.text


# address source (a cloud record's `address`) -> how it is read, given the service's base URL
READERS: dict[str, Callable[[str, float], str]] = {"ec2-imds": _ec2_imds, "gce-metadata": _gce_metadata}


def public_host(cloud: str, env: dict[str, str] | None = None, timeout: float = 5.0) -> str:
    """RLBOOST_PUBLIC_HOST, else the answer of the address source the cloud's record names
    (RLBOOST_METADATA_URL: its base URL)."""
    env = dict(os.environ if env is None else env)
    if env.get(Env.PUBLIC_HOST):
        return env[Env.PUBLIC_HOST]
    kind = CLOUD_KINDS.get(cloud)
    source = kind.address if kind is not None else None
    if source is None:
        raise NoPublicAddress(f"cannot find this {cloud} node's public address; set RLBOOST_PUBLIC_HOST")
    try:
        host = READERS[source](env.get(Env.METADATA_URL, METADATA_URLS[source]).rstrip("/"), timeout).strip()
    except httpx.HTTPError as e:
        raise NoPublicAddress(
            f"{cloud} metadata service gave no public IP for this node ({e}); the trainer node needs one "
            "for spot workers to reach it (or set RLBOOST_PUBLIC_HOST)"
        ) from None
    if not host:
        raise NoPublicAddress(f"this {cloud} node has no public IP; spot workers could not reach it")
    return host
