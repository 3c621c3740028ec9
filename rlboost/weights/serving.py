"""Serving weight chunks over HTTP: the manifest and chunk routes that the publisher and a worker's
peer server share, Range requests, sendfile from a memfd, an emulated uplink (RateLimit) and the
egress counters.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from dataclasses import dataclass
from typing import IO, Protocol

from aiohttp import web

from rlboost.contracts.weight_manifest import ChunkInfo, DeltaChunk, Manifest
from rlboost.weights.buffers import HostBuffer

_MAX_PARAM = 1 << 62  # path ints above this are nonsense, not a lookup miss
_INT_RE = re.compile(r"[0-9]{1,19}")
_RANGE_RE = re.compile(r"bytes=([0-9]*)-([0-9]*)")
_SEND_SLICE = 1 << 20  # bytes per write from memory, or per sendfile call when a rate limit applies


class RateLimit:
    """Token bucket shared by the threads or tasks of one node: models a NIC in benchmarks."""

    def __init__(self, bytes_per_s: float, burst: int = 1 << 20) -> None:
        self.rate, self.burst = float(bytes_per_s), burst
        self._lock = threading.Lock()
        self._t = time.monotonic()
        self._tokens = float(burst)

    def reserve(self, n: int) -> float:
        """Take n bytes; returns how long the caller must sleep before sending them."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._t) * self.rate)
            self._t = now
            self._tokens -= n
            return max(0.0, -self._tokens / self.rate)


@dataclass
class ServeCounters:
    """Bytes actually written to sockets by the weight routes (the node's egress)."""

    full_bytes: int = 0
    delta_bytes: int = 0
    requests: int = 0
    uploading: int = 0  # chunk bodies being sent now
    busy: int = 0  # requests turned away because every upload slot was taken

    @property
    def total(self) -> int:
        return self.full_bytes + self.delta_bytes


class ChunkSource(Protocol):
    """What the chunk routes serve from: the publisher, or a worker's peer store."""

    def manifest(self, version: int) -> Manifest | None: ...

    def chunk_buffer(self, version: int, index: int) -> tuple[ChunkInfo, HostBuffer] | None: ...


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def whole_number(raw: str) -> int | None:
    """A request's count or index as its digits say it, 0 to 2**62; None for anything else."""
    if not _INT_RE.fullmatch(raw):  # no sign, spaces, hex, or underscores
        return None
    value = int(raw)
    return value if value <= _MAX_PARAM else None


def int_param(request: web.Request, name: str) -> int | None:
    return whole_number(request.match_info.get(name, ""))


def _parse_range(header: str, size: int) -> tuple[int, int] | str:
    """Return (start, end_inclusive), or an error string. Only one range is supported."""
    m = _RANGE_RE.fullmatch(header.strip())
    if not m or (not m.group(1) and not m.group(2)):
        return "malformed Range header (want one 'bytes=a-b')"
    first, last = m.group(1), m.group(2)
    if not first:  # suffix range: the last N bytes
        n = int(last)
        return (max(size - n, 0), size - 1) if n > 0 else "unsatisfiable"
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or start > end:
        return "unsatisfiable"
    return start, end


class _BytesResponse(web.StreamResponse):
    """Sends a byte range of a buffer: sendfile from its memfd where it has one, else plain writes.

    Paced by a RateLimit when one is given; counts what it sent into `counter`."""

    def __init__(
        self,
        *,
        status: int,
        headers: dict[str, str],
        view: memoryview,
        file: IO[bytes] | None,
        offset: int,
        limit: RateLimit | None,
        counters: ServeCounters,
        attr: str,
    ) -> None:
        super().__init__(status=status, headers=headers)
        self.content_type = "application/octet-stream"
        self.content_length = len(view)
        self._view, self._file, self._offset, self._limit = view, file, offset, limit
        self._counters, self._attr = counters, attr
        self.owner: HostBuffer | None = None

    async def prepare(self, request: web.BaseRequest):  # type: ignore[override]
        try:
            return await self._send(request)
        finally:
            if self.owner is not None:
                self.owner.sending -= 1
                self._counters.uploading -= 1
                self.owner = None

    async def _send(self, request: web.BaseRequest):  # type: ignore[no-untyped-def]
        writer = await super().prepare(request)
        assert writer is not None
        loop, transport = asyncio.get_running_loop(), request.transport
        n = len(self._view)
        # sendfile takes the whole range at once; writes from memory go in slices so the transport
        # never buffers (copies) megabytes the socket could not take yet
        step = _SEND_SLICE if (self._limit or self._file is None) else max(n, 1)
        for pos in range(0, n, step):
            k = min(step, n - pos)
            if self._limit:
                await asyncio.sleep(self._limit.reserve(k))
            if self._file is not None and transport is not None:
                await writer.drain()
                await loop.sendfile(transport, self._file, self._offset + pos, k)
            else:
                await writer.write(self._view[pos : pos + k])
            setattr(self._counters, self._attr, getattr(self._counters, self._attr) + k)
        await super().write_eof()
        return writer


def chunk_response(
    request: web.Request,
    info: ChunkInfo | DeltaChunk,
    view: memoryview,
    file: IO[bytes] | None,
    file_offset: int,
    limit: RateLimit | None,
    counters: ServeCounters,
    attr: str = "full_bytes",
) -> web.StreamResponse:
    """200 with the whole chunk, or 206 for a `Range`; X-Digest names what the full body hashes to."""
    headers = {"X-Digest": info.digest or "", "Accept-Ranges": "bytes"}
    start, end, status = 0, len(view) - 1, 200
    range_header = request.headers.get("Range")
    if range_header is not None:
        rng = _parse_range(range_header, len(view))
        if rng == "unsatisfiable":
            return error_response(416, "range not satisfiable", {"Content-Range": f"bytes */{len(view)}"})
        if isinstance(rng, str):
            return error_response(400, rng)
        start, end = rng
        status = 206
        headers["Content-Range"] = f"bytes {start}-{end}/{len(view)}"
    return _BytesResponse(
        status=status,
        headers=headers,
        view=view[start : end + 1],
        file=file,
        offset=file_offset + start,
        limit=limit,
        counters=counters,
        attr=attr,
    )


def add_chunk_routes(
    app: web.Application,
    source: ChunkSource,
    counters: ServeCounters,
    limit: RateLimit | None = None,
    max_uploads: int | None = None,
) -> None:
    """The manifest and chunk routes, shared by the publisher and by a worker's peer server.

    `max_uploads` (peers): beyond that many chunk bodies in flight, answer 429 at once. A link split
    over dozens of requests finishes none of them for seconds, and a chunk only helps the swarm once
    it is whole (its receiver can serve it on); turned away, a puller asks another holder."""

    async def manifest(request: web.Request) -> web.Response:
        version = int_param(request, "version")
        if version is None:
            return error_response(400, "version must be a non-negative integer")
        waiter = getattr(source, "wait_manifest", None)
        m = await waiter(version) if waiter else source.manifest(version)
        if m is None:
            return error_response(404, f"weight version {version} is not available")
        return web.Response(text=m.model_dump_json(), content_type="application/json")

    async def chunk(request: web.Request) -> web.StreamResponse:
        version, index = int_param(request, "version"), int_param(request, "index")
        if version is None or index is None:
            return error_response(400, "version and chunk index must be non-negative integers")
        got = source.chunk_buffer(version, index)
        if got is None:
            return error_response(404, f"weight version {version} chunk {index} is not available")
        c, buf = got
        if max_uploads is not None and counters.uploading >= max_uploads:
            counters.busy += 1
            return error_response(429, "all upload slots are busy: ask another holder", {"Retry-After": "0"})
        counters.requests += 1
        resp = chunk_response(request, c, buf.view[c.offset : c.offset + c.size], buf.file, c.offset, limit, counters)
        if isinstance(resp, _BytesResponse):
            buf.sending += 1
            counters.uploading += 1
            resp.owner = buf
        return resp

    app.router.add_get("/v1/weights/{version}/manifest", manifest)
    app.router.add_get("/v1/weights/{version}/chunks/{index}", chunk)
