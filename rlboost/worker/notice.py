"""Preemption-notice watchers: each resolves when the node is about to be taken away.

One watcher per notice source (rlboost/contracts/cloud_kinds.py NoticeSource), chosen by the source
the node's provider names in RLBOOST_NOTICE from its cloud's record, never by the cloud's name:

- FileNotice (`file`): the local provider writes a file (its stand-in for a cloud's metadata service).
- AwsNotice (`ec2-imds`): EC2 instance metadata, `/latest/meta-data/spot/instance-action` with an IMDSv2 session
  token; 404 until AWS schedules the interruption (about two minutes ahead), then JSON.
- GcpNotice (`gce-metadata`): GCE metadata, `/computeMetadata/v1/instance/preempted` with `wait_for_change`, a
  hanging GET that returns as soon as the value flips to TRUE (about 30 seconds ahead).

A watcher never raises and never returns without a notice: an unreachable metadata server is
retried with backoff (the worker must keep generating meanwhile).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import aiohttp

from rlboost.contracts.cloud_kinds import METADATA_URLS
from rlboost.contracts.env_names import Env
from rlboost.contracts.retry import Backoff

log = logging.getLogger("rlboost.notice")

AWS_METADATA = METADATA_URLS["ec2-imds"]
GCP_METADATA = METADATA_URLS["gce-metadata"]
METADATA_CAP_S = 30.0  # an unreachable metadata server is asked again at least this often


class NoticeWatcher(Protocol):
    async def wait(self) -> str:
        """Return a short reason once a preemption notice is seen (never returns otherwise)."""


class FileNotice:
    """Local provider: the spot market writes this file when it picks the node as a victim."""

    def __init__(self, path: Path, poll_s: float = 0.05) -> None:
        self.path = path
        self.poll_s = poll_s

    async def wait(self) -> str:
        while not self.path.exists():
            await asyncio.sleep(self.poll_s)
        return "preemption-notice"


class AwsNotice:
    """EC2 spot interruption notice through IMDSv2 (token PUT, then GETs carrying the token)."""

    def __init__(self, base_url: str = AWS_METADATA, poll_s: float = 2.0, token_ttl_s: int = 21600) -> None:
        self.base = base_url.rstrip("/")
        self.poll_s = poll_s
        self.token_ttl_s = token_ttl_s

    async def wait(self) -> str:
        token: str | None = None
        fails = 0
        backoff = Backoff(base_s=self.poll_s, cap_s=METADATA_CAP_S, jitter=(1.0, 1.0))
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                try:
                    if token is None:
                        async with http.put(
                            f"{self.base}/latest/api/token",
                            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)},
                        ) as r:
                            r.raise_for_status()
                            token = await r.text()
                    async with http.get(
                        f"{self.base}/latest/meta-data/spot/instance-action",
                        headers={"X-aws-ec2-metadata-token": token},
                    ) as r:
                        if r.status == 200:
                            body = await r.text()
                            try:
                                info = json.loads(body)
                                return f"aws-spot-{info.get('action', 'terminate')} at {info.get('time', '?')}"
                            except ValueError:
                                return "aws-spot-interruption"
                        if r.status == 401:  # token expired: get a new one
                            token = None
                            continue
                        if r.status != 404:
                            r.raise_for_status()
                    fails = 0
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                    log.warning("EC2 metadata unreachable (%s); retrying", e)
                    token, fails = None, fails + 1
                await asyncio.sleep(backoff.delay(fails))  # poll_s while it answers, doubling while it fails


class GcpNotice:
    """GCE preemption flag, watched with wait_for_change (hanging GET, re-armed with the last ETag)."""

    def __init__(self, base_url: str = GCP_METADATA, hang_s: int = 60, retry_s: float = 2.0) -> None:
        self.base = base_url.rstrip("/")
        self.hang_s = hang_s
        self.retry_s = retry_s

    async def wait(self) -> str:
        url = f"{self.base}/computeMetadata/v1/instance/preempted"
        headers = {"Metadata-Flavor": "Google"}
        etag: str | None = None
        fails = 0
        backoff = Backoff(base_s=self.retry_s, cap_s=METADATA_CAP_S, jitter=(1.0, 1.0))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.hang_s + 10)) as http:
            while True:
                # first a plain read (it may already be TRUE), then hanging reads from its ETag
                params = {}
                if etag:
                    params = {"wait_for_change": "true", "timeout_sec": str(self.hang_s), "last_etag": etag}
                try:
                    async with http.get(url, headers=headers, params=params) as r:
                        r.raise_for_status()
                        value = (await r.text()).strip().upper()
                        etag = r.headers.get("ETag", etag)
                    if value == "TRUE":
                        return "gcp-preempted"
                    fails = 0
                    if etag:
                        continue  # re-arm the hanging GET at once
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                    log.warning("GCE metadata unreachable (%s); retrying", e)
                    fails += 1
                await asyncio.sleep(backoff.delay(fails))


def _metadata_url(env: Mapping[str, str], source: str) -> str:
    return env.get(Env.METADATA_URL) or METADATA_URLS[source]


def _file_notice(env: Mapping[str, str]) -> NoticeWatcher | None:
    return FileNotice(Path(env[Env.NOTICE_FILE])) if env.get(Env.NOTICE_FILE) else None


# notice source -> its watcher, from the worker's environment (None: nothing to watch)
WATCHERS: dict[str, Callable[[Mapping[str, str]], NoticeWatcher | None]] = {
    "ec2-imds": lambda env: AwsNotice(_metadata_url(env, "ec2-imds")),
    "gce-metadata": lambda env: GcpNotice(_metadata_url(env, "gce-metadata")),
    "file": _file_notice,
}


def watcher_from_env(env: dict[str, str] | None = None) -> NoticeWatcher | None:
    """The watcher of the notice source RLBOOST_NOTICE names (ec2-imds | gce-metadata | file; file reads
    RLBOOST_NOTICE_FILE); RLBOOST_METADATA_URL overrides a metadata server's address. Without
    RLBOOST_NOTICE, a notice file alone selects `file`."""
    env = dict(os.environ if env is None else env)
    source = env.get(Env.NOTICE) or ("file" if env.get(Env.NOTICE_FILE) else "")
    make = WATCHERS.get(source)
    if make is not None:
        return make(env)
    if source:
        known = ", ".join(WATCHERS)
        log.warning("%s=%r is not a notice source (%s); not watching for notices", Env.NOTICE, source, known)
    return None
