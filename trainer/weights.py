"""Weight publisher: the trainer side of pull-based weight transfer.

A published version is one contiguous host buffer (every tensor's raw bytes, 64-byte aligned) plus a
manifest (trainer/weight_manifest.py, the schema shared with the delta codec and the puller): the
tensor table (name, dtype, shape, offset) and the chunk list with a digest each (BLAKE3 by default,
trainer/digest.py). The buffer lives in a memfd on Linux, so chunks go out with
sendfile (no user-space copy) and the trainer's own engine can map the same pages
(trainer/local_weights.py). Versions are immutable, so serving needs no locking beyond the version
table.

`stage` blocks only for the copy to host memory; hashing (and the optional delta from the previous
version, trainer/weight_delta.py: per chunk the smaller of a sparse and a dense XOR encoding) run on
a thread pool, and the manifest route waits for them. A worker further behind gets one delta
composed from the kept chain of per-version deltas (trainer/delta_chain.py), as far back as the
history's memory budget reaches.

Routes (authentication is applied by the server's middleware, not here):
    GET  /v1/weights/latest                                -> {"version": int | null, "oldest_base": int | null}
    GET  /v1/weights/{version}/manifest                    -> Manifest JSON
    GET  /v1/weights/{version}/chunks/{index}              -> octet-stream, X-Digest; Range: bytes=a-b -> 206
    GET  /v1/weights/{version}/delta/{base}/manifest       -> DeltaManifest JSON (404: pull in full)
    GET  /v1/weights/{version}/delta/{base}/chunks/{index} -> the compressed delta of chunk `index`
    POST /v1/weights/{version}/swarm                       -> peer tracker (trainer/weight_tracker.py)
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import mmap
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Protocol

import numpy as np
from aiohttp import web

from trainer import weight_delta
from trainer.delta_chain import DeltaHistory
from trainer.digest import DEFAULT as DEFAULT_DIGEST
from trainer.digest import Algorithm, hexdigest
from trainer.weight_manifest import (
    CODEC,
    CODEC_SPARSE,
    DENSE,
    ChunkInfo,
    DeltaChunk,
    DeltaManifest,
    Encoding,
    Manifest,
    TensorInfo,
    itemsize,
    root_of,
)
from trainer.weight_tracker import SwarmTracker, add_swarm_route

if TYPE_CHECKING:
    import torch

log = logging.getLogger("rlboost.weights")

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
ALIGN = 64  # tensor offsets: lets a receiver view any dtype in place (torch.frombuffer + view)
_MAX_PARAM = 1 << 62  # path ints above this are nonsense, not a lookup miss
_INT_RE = re.compile(r"[0-9]{1,19}")
_RANGE_RE = re.compile(r"bytes=([0-9]*)-([0-9]*)")
_SEND_SLICE = 1 << 20  # bytes per write from memory, or per sendfile call when a rate limit applies


# torch is imported lazily: a worker's transfer path (and the peer server) does not need it, and
# importing it costs seconds of CPU on a small node.
def dtype_of(name: str) -> torch.dtype:
    import torch

    itemsize(name)
    return getattr(torch, name)


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    itemsize(name)  # rejects what a receiver could not rebuild
    return name


def layout(tensors: Mapping[str, torch.Tensor]) -> tuple[list[TensorInfo], int]:
    """Where each tensor goes in the buffer (sorted by name, so two versions of one model align)."""
    infos, off = [], 0
    for name in sorted(tensors):
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        infos.append(TensorInfo(name=name, dtype=dtype_name(t.dtype), shape=list(t.shape), offset=off, nbytes=nbytes))
        off += -(-nbytes // ALIGN) * ALIGN
    return infos, off


def tensor_views(buf: object, infos: list[TensorInfo]) -> dict[str, torch.Tensor]:
    """Tensors that are views into `buf` (no copy); they keep `buf` alive."""
    import torch

    flat = torch.frombuffer(buf, dtype=torch.uint8) if len(memoryview(buf)) else torch.empty(0, dtype=torch.uint8)
    out = {}
    for ti in infos:
        dt = dtype_of(ti.dtype)
        if ti.nbytes == 0:
            out[ti.name] = torch.empty(ti.shape, dtype=dt)
        else:
            out[ti.name] = flat[ti.offset : ti.offset + ti.nbytes].view(dt).view(ti.shape)
    return out


class HostBuffer:
    """A writable contiguous byte buffer.

    `shareable` (the publisher's): memfd-backed on Linux, so it can be sendfile'd and mapped by
    another process. Otherwise (a worker's receive buffer, served to peers by plain writes):
    anonymous memory, asking for transparent huge pages, which cut first-touch faults 512-fold where
    the kernel grants them (shmem huge pages are usually off, so a memfd would not get them). On
    this project's VMs it does not grant them, and first touch costs 0.5-3 s per GiB: see `page_in`."""

    def __init__(self, size: int, name: str = "rlboost-weights", *, shareable: bool = True) -> None:
        self.size = size
        self.file: IO[bytes] | None = None
        self.path: str | None = None
        self.sending = 0  # responses still sending from it: it must not be reused before they end
        n = max(size, 1)  # mmap refuses length 0
        if shareable and hasattr(os, "memfd_create"):
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            os.ftruncate(fd, n)
            self.file = open(fd, "rb", buffering=0)  # noqa: SIM115 - lives as long as the buffer
            self._mm = mmap.mmap(fd, n)
            self.path = f"/proc/{os.getpid()}/fd/{fd}"
        else:
            self._mm = mmap.mmap(-1, n)
            if hasattr(mmap, "MADV_HUGEPAGE"):
                self._mm.madvise(mmap.MADV_HUGEPAGE)
        self.view = memoryview(self._mm)[:size]

    def __len__(self) -> int:
        return self.size

    def page_in(self) -> HostBuffer:
        """Fault every page in now (one write per page; numpy releases the GIL meanwhile), so a
        later copy into the buffer runs at memory speed: first-touch faults cost seconds per GiB on
        the VMs measured here."""
        if self.size:
            np.frombuffer(self.view, np.uint8)[:: mmap.PAGESIZE] = 0
        return self


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


@dataclass
class _Published:
    manifest: Manifest | None  # None until hashing finished
    buf: HostBuffer
    ready: cf.Future = field(default_factory=cf.Future)  # -> Manifest
    delta: cf.Future | None = None  # -> (DeltaManifest, payloads) | None


class ChunkSource(Protocol):
    """What the chunk routes serve from: the publisher, or a worker's peer store."""

    def manifest(self, version: int) -> Manifest | None: ...

    def chunk_buffer(self, version: int, index: int) -> tuple[ChunkInfo, HostBuffer] | None: ...


@dataclass(frozen=True)
class PublishOptions:
    """How the trainer publishes: the same for every version (`WeightPublisher.stage` takes what
    changes per call: the version and its tensors)."""

    chunk_bytes: int = DEFAULT_CHUNK_BYTES  # bytes per chunk (the last one may be shorter); >= 1
    keep: int = 2  # newest versions always held (pinned or in-flight ones stay as well); >= 1
    delta: bool = True  # offer each version as a delta from the one before it
    # offer each changed chunk's delta in the smaller of the sparse and the dense encoding (False:
    # dense only, the codec every worker understands; kept for comparisons)
    sparse_delta: bool = True
    hash_threads: int = 4  # threads that hash chunks and encode deltas
    digest_alg: Algorithm = DEFAULT_DIGEST  # the chunk digest (trainer/digest.py)
    egress_bps: float | None = None  # cap on bytes/s served to workers, an emulated uplink (None or 0: none)
    # after each version, page in a buffer for the next one in the background (one more model-sized
    # buffer of host memory), so the copy that blocks training runs at memory speed instead of
    # paying first-touch page faults
    prepare_next: bool = True
    # memory for past versions' deltas, from which a worker several versions behind gets one
    # composed delta
    delta_history_bytes: int = 512 << 20


class WeightPublisher:
    """Holds recent versions in host memory and serves them. A version stays while it is among the
    newest `keep`, pinned by an in-flight step, or being pulled by a live worker (the tracker)."""

    def __init__(self, opts: PublishOptions = PublishOptions(), *, tracker: SwarmTracker | None = None) -> None:
        """`opts` (PublishOptions) says how: chunk size, versions kept, deltas, digests, the egress
        cap. `tracker`: the swarm tracker to use (None: a fresh one). `keep`, `digest_alg` and
        `limit` are read at each use, so they may be changed on the publisher afterwards."""
        if opts.chunk_bytes < 1 or opts.keep < 1:
            raise ValueError("chunk_bytes and keep must be >= 1")
        self.opts = opts
        self.chunk_bytes = opts.chunk_bytes
        self.keep = opts.keep
        self.delta_enabled = opts.delta
        self.sparse_delta = opts.sparse_delta
        self.digest_alg = opts.digest_alg
        self.tracker = tracker if tracker is not None else SwarmTracker()
        self.history = DeltaHistory(opts.delta_history_bytes)
        self.counters = ServeCounters()
        self.limit = RateLimit(opts.egress_bps) if opts.egress_bps else None
        self.last_copy_s = 0.0
        self._pool = cf.ThreadPoolExecutor(max_workers=opts.hash_threads, thread_name_prefix="weights")
        # Orchestration runs apart from the leaf work it waits on, so the pool can never deadlock.
        self._jobs = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights-publish")
        # composed deltas on a thread of their own: a slow one never holds up the next publish
        self._compose_jobs = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights-compose")
        self._composed: dict[tuple[int, int], cf.Future] = {}  # (version, base) -> Step | None
        self._lock = threading.Lock()
        self._versions: dict[int, _Published] = {}
        self._pins: Counter[int] = Counter()
        self._latest: int | None = None
        self.prepare_next = opts.prepare_next
        self._next: tuple[int, cf.Future] | None = None  # (size, future of a paged-in HostBuffer)

    # ---- publishing (training thread) ---------------------------------------------------
    def stage(self, version: int, tensors: Mapping[str, torch.Tensor]) -> cf.Future:
        """Copy `tensors` to host memory and return; hashing and the delta finish in the background.

        Returns a future of the Manifest. The version is visible as `latest` at once; its manifest
        route answers when hashing is done."""
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        with self._lock:
            if self._latest is not None and version <= self._latest:
                raise ValueError(f"version {version} is not newer than latest {self._latest}")
        import torch

        t0 = time.monotonic()
        infos, total = layout(tensors)
        buf = self._take_buffer(total, version)
        views = tensor_views(buf.view, infos)
        with torch.no_grad():
            for ti in infos:
                if ti.nbytes:  # one copy, device -> host buffer, no intermediate
                    views[ti.name].copy_(tensors[ti.name].detach())
        self.last_copy_s = time.monotonic() - t0
        pub = _Published(None, buf)
        with self._lock:
            if self._latest is not None and version <= self._latest:  # raced another publish
                raise ValueError(f"version {version} is not newer than latest {self._latest}")
            base = self._versions.get(version - 1)
            self._versions[version] = pub
            self._latest = version
            self._composed.clear()  # only the newest version is asked for as a jump
            self._collect_locked()
        self._jobs.submit(self._finish, version, pub, infos, base)
        return pub.ready

    def _take_buffer(self, size: int, version: int) -> HostBuffer:
        with self._lock:
            nxt, self._next = self._next, None
        # Not started yet (queued behind a slow delta): drop it. Paging in: waiting for the rest is
        # never slower than faulting a fresh buffer from the start.
        if nxt is not None and not nxt[1].cancel() and nxt[0] == size:
            try:
                return nxt[1].result()
            except Exception:  # e.g. out of memory: fall back to a fresh buffer
                log.warning("the prepared weight buffer failed; allocating a fresh one", exc_info=True)
        return HostBuffer(size, f"rlboost-w{version}")

    def publish(self, version: int, tensors: Mapping[str, torch.Tensor]) -> Manifest:
        """`stage` and wait for the manifest."""
        return self.stage(version, tensors).result()

    def _finish(self, version: int, pub: _Published, infos: list[TensorInfo], base: _Published | None) -> None:
        try:
            spans = [
                (off, min(self.chunk_bytes, pub.buf.size - off)) for off in range(0, pub.buf.size, self.chunk_bytes)
            ]
            alg = self.digest_alg
            digests = list(self._pool.map(lambda s: hexdigest(alg, pub.buf.view[s[0] : s[0] + s[1]]), spans))
            chunks = [
                ChunkInfo(index=i, offset=o, size=n, digest=d) for i, ((o, n), d) in enumerate(zip(spans, digests))
            ]
            m = Manifest(
                version=version,
                total_bytes=pub.buf.size,
                chunk_bytes=self.chunk_bytes,
                digest=alg,
                root=root_of(chunks, alg),
                tensors=infos,
                chunks=chunks,
                local_path=pub.buf.path,
            )
            if self.delta_enabled and base is not None and base.manifest is not None and base.manifest.tensors == infos:
                pub.delta = self._jobs.submit(self._encode_delta, m, pub, base)
            if self.prepare_next:  # queued after the delta: pullers wait on that, training does not
                size = pub.buf.size
                fut = self._jobs.submit(lambda: HostBuffer(size, f"rlboost-w{version + 1}").page_in())
                with self._lock:
                    self._next = (size, fut)
            pub.manifest = m
            pub.ready.set_result(m)
        except BaseException as e:  # the future carries it to whoever waits
            log.exception("publishing weight version %d failed", version)
            pub.ready.set_exception(e)

    def _encode_delta(self, m: Manifest, pub: _Published, base: _Published) -> tuple[DeltaManifest, list[bytes | None]]:
        assert base.manifest is not None
        shuffles = weight_delta.shuffle_widths(m.tensors, m.chunks)

        sparse = self.sparse_delta

        def one(c: ChunkInfo) -> tuple[Encoding, bytes] | None:
            old, new = base.buf.view[c.offset : c.offset + c.size], pub.buf.view[c.offset : c.offset + c.size]
            if sparse:
                return weight_delta.encode_best(old, new, shuffles[c.index])
            p = weight_delta.encode(old, new, shuffles[c.index])
            return (DENSE, p) if p is not None else None

        encoded = list(self._pool.map(one, m.chunks))
        payloads = [e[1] if e else None for e in encoded]
        dchunks = [
            DeltaChunk(
                index=i,
                size=len(e[1]) if e else 0,
                digest=hexdigest(m.digest, e[1]) if e else None,
                shuffle=shuffles[i],
                encoding=e[0] if e else DENSE,
            )
            for i, e in enumerate(encoded)
        ]
        dm = DeltaManifest(
            version=m.version,
            base=base.manifest.version,
            codec=CODEC_SPARSE if sparse else CODEC,
            total_bytes=sum(d.size for d in dchunks),
            chunks=dchunks,
        )
        if dm.base == dm.version - 1:
            self.history.add((dm, payloads))
        return dm, payloads

    def pin(self, version: int) -> None:
        """Keep `version` through garbage collection until unpinned (reference counted)."""
        with self._lock:
            self._pins[version] += 1

    def unpin(self, version: int) -> None:
        with self._lock:
            if self._pins[version] <= 0:  # Counter lookups of a missing key give 0, insert nothing
                raise ValueError(f"version {version} is not pinned")
            self._pins[version] -= 1
            if self._pins[version] == 0:
                del self._pins[version]
            self._collect_locked()

    def collect(self) -> None:
        with self._lock:
            self._collect_locked()

    def _collect_locked(self) -> None:
        newest = set(sorted(self._versions, reverse=True)[: self.keep])
        busy = self.tracker.versions_in_use()
        for v in list(self._versions):
            if v not in newest and self._pins[v] == 0 and v not in busy:
                # Dropping the reference is enough: a chunk still being sent holds its own.
                del self._versions[v]

    # ---- reading (event loop) -----------------------------------------------------------
    @property
    def latest(self) -> int | None:
        with self._lock:
            return self._latest

    def versions(self) -> list[int]:
        with self._lock:
            return sorted(self._versions)

    def _get(self, version: int) -> _Published | None:
        with self._lock:
            return self._versions.get(version)

    def manifest(self, version: int) -> Manifest | None:
        pub = self._get(version)
        return pub.manifest if pub else None

    async def wait_manifest(self, version: int, timeout_s: float = 60.0) -> Manifest | None:
        pub = self._get(version)
        if pub is None:
            return None
        return await asyncio.wait_for(asyncio.wrap_future(pub.ready), timeout_s)

    async def wait_delta(self, version: int, base: int, timeout_s: float = 60.0) -> tuple | None:
        """`version` as a delta from `base`: from the version before, the delta made at publish;
        from further back, one composed from the history (None: pull in full)."""
        pub = self._get(version)
        if pub is None or base >= version:
            return None
        m = await self.wait_manifest(version, timeout_s)
        if pub.delta is None or m is None:
            return None
        dm, payloads = await asyncio.wait_for(asyncio.wrap_future(pub.delta), timeout_s)
        if base == version - 1:
            return (dm, payloads) if dm.base == base else None
        with self._lock:
            fut = self._composed.get((version, base))
            if fut is None:
                fut = self._compose_jobs.submit(
                    self.history.compose, m, pub.buf.view, base, self.sparse_delta, self._pool.map
                )
                self._composed[(version, base)] = fut
        return await asyncio.wait_for(asyncio.wrap_future(fut), timeout_s)

    def oldest_base(self) -> int | None:
        """The oldest version a worker may hold and still get the latest as one delta."""
        latest = self.latest
        if latest is None:
            return None
        pub = self._get(latest)
        if pub is None or pub.delta is None:  # the first version, or a new layout: no delta at all
            return None
        if not pub.delta.done():  # being made: it joins the history soon
            older = self.history.oldest_base(latest - 1)
            return latest - 1 if older is None else older
        # the delta made at publish always serves the version before, whatever the history keeps
        older = self.history.oldest_base(latest)
        return latest - 1 if older is None else older

    def chunk_buffer(self, version: int, index: int) -> tuple[ChunkInfo, HostBuffer] | None:
        pub = self._get(version)
        if pub is None or pub.manifest is None or not 0 <= index < len(pub.manifest.chunks):
            return None
        return pub.manifest.chunks[index], pub.buf

    def chunk(self, version: int, index: int) -> memoryview | None:
        got = self.chunk_buffer(version, index)
        if got is None:
            return None
        c, buf = got
        return buf.view[c.offset : c.offset + c.size]

    def stats(self) -> dict:
        """For /v1/status: what the trainer has sent (egress) and what it holds."""
        return {
            "latest": self.latest,
            "held": self.versions(),
            "egress_bytes": self.counters.total,
            "egress_full_bytes": self.counters.full_bytes,
            "egress_delta_bytes": self.counters.delta_bytes,
            "chunk_requests": self.counters.requests,
            "last_copy_s": round(self.last_copy_s, 4),
            "oldest_base": self.oldest_base(),
            "delta_history": self.history.stats(),
            "swarm": self.tracker.stats(),
        }


# ---- HTTP ---------------------------------------------------------------------------------


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def _int_param(request: web.Request, name: str) -> int | None:
    raw = request.match_info.get(name, "")
    if not _INT_RE.fullmatch(raw):  # no sign, spaces, hex, or underscores
        return None
    value = int(raw)
    return value if value <= _MAX_PARAM else None


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
            return _error(416, "range not satisfiable", {"Content-Range": f"bytes */{len(view)}"})
        if isinstance(rng, str):
            return _error(400, rng)
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
        version = _int_param(request, "version")
        if version is None:
            return _error(400, "version must be a non-negative integer")
        waiter = getattr(source, "wait_manifest", None)
        m = await waiter(version) if waiter else source.manifest(version)
        if m is None:
            return _error(404, f"weight version {version} is not available")
        return web.Response(text=m.model_dump_json(), content_type="application/json")

    async def chunk(request: web.Request) -> web.StreamResponse:
        version, index = _int_param(request, "version"), _int_param(request, "index")
        if version is None or index is None:
            return _error(400, "version and chunk index must be non-negative integers")
        got = source.chunk_buffer(version, index)
        if got is None:
            return _error(404, f"weight version {version} chunk {index} is not available")
        c, buf = got
        if max_uploads is not None and counters.uploading >= max_uploads:
            counters.busy += 1
            return _error(429, "all upload slots are busy: ask another holder", {"Retry-After": "0"})
        counters.requests += 1
        resp = chunk_response(request, c, buf.view[c.offset : c.offset + c.size], buf.file, c.offset, limit, counters)
        if isinstance(resp, _BytesResponse):
            buf.sending += 1
            counters.uploading += 1
            resp.owner = buf
        return resp

    app.router.add_get("/v1/weights/{version}/manifest", manifest)
    app.router.add_get("/v1/weights/{version}/chunks/{index}", chunk)


def add_routes(app: web.Application, publisher: WeightPublisher) -> None:
    async def latest(_: web.Request) -> web.Response:
        publisher.collect()  # cheap; lets versions whose pullers went away go
        return web.json_response({"version": publisher.latest, "oldest_base": publisher.oldest_base()})

    async def delta_manifest(request: web.Request) -> web.Response:
        version, base = _int_param(request, "version"), _int_param(request, "base")
        if version is None or base is None:
            return _error(400, "version and base must be non-negative integers")
        got = await publisher.wait_delta(version, base)
        if got is None:
            return _error(404, f"no delta for weight version {version} from {base}")
        return web.Response(text=got[0].model_dump_json(), content_type="application/json")

    async def delta_chunk(request: web.Request) -> web.StreamResponse:
        version, base, index = (_int_param(request, k) for k in ("version", "base", "index"))
        if version is None or base is None or index is None:
            return _error(400, "version, base and chunk index must be non-negative integers")
        got = await publisher.wait_delta(version, base)
        if got is None or not 0 <= index < len(got[0].chunks) or got[1][index] is None:
            return _error(404, f"no delta chunk {index} for weight version {version} from {base}")
        dm, payloads = got
        publisher.counters.requests += 1
        view = memoryview(payloads[index])
        return chunk_response(
            request, dm.chunks[index], view, None, 0, publisher.limit, publisher.counters, "delta_bytes"
        )

    app.router.add_get("/v1/weights/latest", latest)
    add_chunk_routes(app, publisher, publisher.counters, publisher.limit)
    app.router.add_get("/v1/weights/{version}/delta/{base}/manifest", delta_manifest)
    app.router.add_get("/v1/weights/{version}/delta/{base}/chunks/{index}", delta_chunk)
    add_swarm_route(app, publisher.tracker, on_change=publisher.collect)
