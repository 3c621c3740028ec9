"""A weight puller's control plane: the manifest, the latest version, and the errors and retries of
every request besides the chunk bodies (rlboost/weights/pull.py fetches those). Each request goes over
the agent's aiohttp session, with its own deadline, and is retried with backoff when the answer is
worth asking again."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from pydantic import ValidationError

from rlboost.contracts.retry import Backoff, aretry
from rlboost.contracts.weight_manifest import Manifest, itemsize, root_of


class WeightPullError(RuntimeError):
    """A weight pull failed for good (after retries, or on an answer retrying cannot fix)."""


# origin and control-plane retries: 50 ms doubling to 2 s, x0.5-1.5 jitter
PULL_BACKOFF = Backoff(base_s=0.05, cap_s=2.0)


class RetryableStatus(RuntimeError):
    """A control-plane answer worth asking again (5xx, 408, 429)."""


def retryable(status: int) -> bool:
    return status >= 500 or status in (408, 429)


class RetryCounter(Protocol):
    retries: int  # bumped on each retried request (PullStats has it)


@dataclass
class _Retries:
    retries: int = 0


def check_manifest(m: Manifest, version: int) -> None:
    """Chunks must tile [0, total) exactly and tensors must lie inside it, or writes could overlap."""
    if m.version != version:
        raise WeightPullError(f"asked for weight version {version}, manifest says {m.version}")
    offset = 0
    for i, c in enumerate(m.chunks):
        if c.index != i or c.offset != offset or c.size > m.chunk_bytes:
            raise WeightPullError(f"weight version {version}: manifest chunk {i} is out of place")
        offset += c.size
    if offset != m.total_bytes:
        raise WeightPullError(f"weight version {version}: chunks cover {offset} of {m.total_bytes} bytes")
    if root_of(m.chunks, m.digest) != m.root:
        raise WeightPullError(f"weight version {version}: manifest root hash does not match its chunks")
    for t in m.tensors:
        try:
            size = itemsize(t.dtype)
        except ValueError as e:
            raise WeightPullError(f"weight version {version}: {e}") from e
        numel = 1
        for s in t.shape:
            if s < 0:
                raise WeightPullError(f"weight version {version}: {t.name} has a negative dimension")
            numel *= s
        if numel * size != t.nbytes or t.offset + t.nbytes > m.total_bytes or t.offset % size:
            raise WeightPullError(f"weight version {version}: tensor {t.name} does not fit the buffer")


@dataclass
class ControlClient:
    """The control-plane requests (manifest, tracker) over the agent's aiohttp session."""

    session: aiohttp.ClientSession
    token: str | None
    timeout_s: float
    retries: int
    stats: RetryCounter

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def get_json(self, url: str, what: str, *, missing_ok: bool = False) -> Any:
        async def once() -> Any:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with self.session.get(url, headers=self.headers(), timeout=timeout) as resp:
                if resp.status == 200:
                    return await resp.json()
                if resp.status == 404 and missing_ok:
                    return None
                detail = (await resp.text())[:200]
                if not retryable(resp.status):
                    raise WeightPullError(f"{what}: HTTP {resp.status} from {url}: {detail}")
                raise RetryableStatus(f"HTTP {resp.status}: {detail}")

        def counted(_attempt: int, _err: BaseException) -> None:
            self.stats.retries += 1

        transient = (aiohttp.ClientError, asyncio.TimeoutError, ValueError, RetryableStatus)
        try:
            return await aretry(once, tries=self.retries + 1, backoff=PULL_BACKOFF, on=transient, on_retry=counted)
        except transient as err:
            raise WeightPullError(f"{what}: failed after {self.retries + 1} attempts: {err!r}") from err

    async def post_json(self, url: str, body: dict) -> tuple[int, Any]:
        timeout = aiohttp.ClientTimeout(total=min(self.timeout_s, 5.0))
        async with self.session.post(url, json=body, headers=self.headers(), timeout=timeout) as resp:
            return resp.status, (await resp.json() if resp.status == 200 else None)


async def latest_version(
    base_url: str,
    *,
    token: str | None = None,
    session: aiohttp.ClientSession | None = None,
    timeout_s: float = 10.0,
    retries: int = 2,
) -> int | None:
    """The newest version the publisher holds, or None before the first publish."""
    own = session is None
    cl = ControlClient(session or aiohttp.ClientSession(), token, timeout_s, retries, _Retries())
    try:
        body = await cl.get_json(f"{base_url.rstrip('/')}/v1/weights/latest", "latest weight version")
    finally:
        if own:
            await cl.session.close()
    v = body.get("version") if isinstance(body, dict) else None
    if v is not None and (type(v) is not int or v < 0):
        raise WeightPullError(f"latest weight version: bad answer {body!r}")
    return v


async def fetch_manifest(cl: ControlClient, base: str, version: int) -> Manifest:
    try:
        raw = await cl.get_json(f"{base}/v1/weights/{version}/manifest", f"weight version {version}")
        m = Manifest.model_validate(raw)
    except ValidationError as e:
        raise WeightPullError(f"weight version {version}: invalid manifest: {e}") from e
    check_manifest(m, version)
    return m


async def get_manifest(
    base_url: str,
    version: int,
    *,
    token: str | None = None,
    session: aiohttp.ClientSession | None = None,
    timeout_s: float = 10.0,
    retries: int = 2,
) -> Manifest:
    """Version `version`'s manifest, checked like a pull checks it (WeightPullError if it is bad)."""
    own = session is None
    cl = ControlClient(session or aiohttp.ClientSession(), token, timeout_s, retries, _Retries())
    try:
        return await fetch_manifest(cl, base_url.rstrip("/"), version)
    finally:
        if own:
            await cl.session.close()
