"""Weight publisher: the trainer side of pull-based weight transfer.

A published version is one contiguous host buffer (every tensor's raw bytes, 64-byte aligned) plus a
manifest (rlboost/contracts/weight_manifest.py, the schema shared with the delta codec and the puller): the
tensor table (name, dtype, shape, offset) and the chunk list with a digest each (BLAKE3 by default,
rlboost/contracts/digest.py). The buffer lives in a memfd on Linux, so chunks go out with
sendfile (no user-space copy) and the trainer's own engine can map the same pages
(rlboost/weights/local.py). Versions are immutable, so serving needs no locking beyond the version
table.

`stage` blocks only for the copy to host memory; hashing (and the optional delta from the previous
version, rlboost/weights/delta_codec.py: per chunk the smaller of a sparse and a dense XOR encoding) run on
a thread pool, and the manifest route waits for them. A worker further behind gets one delta
composed from the kept chain of per-version deltas (rlboost/weights/delta_chain.py), as far back as the
history's memory budget reaches.

Routes (authentication is applied by the server's middleware, not here):
    GET  /v1/weights/latest                                -> {"version": int | null, "oldest_base": int | null}
    GET  /v1/weights/{version}/manifest                    -> Manifest JSON
    GET  /v1/weights/{version}/chunks/{index}              -> octet-stream, X-Digest; Range: bytes=a-b -> 206
    GET  /v1/weights/{version}/delta/{base}/manifest       -> DeltaManifest JSON (404: pull in full)
    GET  /v1/weights/{version}/delta/{base}/chunks/{index} -> the compressed delta of chunk `index`
    POST /v1/weights/{version}/swarm                       -> peer tracker (rlboost/weights/tracker.py)
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from rlboost.contracts.digest import DEFAULT as DEFAULT_DIGEST
from rlboost.contracts.digest import Algorithm, hexdigest
from rlboost.contracts.weight_manifest import (
    CODEC,
    CODEC_SPARSE,
    DENSE,
    ChunkInfo,
    DeltaChunk,
    DeltaManifest,
    Encoding,
    Manifest,
    TensorInfo,
    root_of,
)
from rlboost.weights import delta_codec
from rlboost.weights.buffers import HostBuffer, layout, tensor_views
from rlboost.weights.delta_chain import DeltaHistory
from rlboost.weights.serving import (
    RateLimit,
    ServeCounters,
    add_chunk_routes,
    chunk_response,
    error_response,
    int_param,
)
from rlboost.weights.tracker import SwarmTracker, add_swarm_route

if TYPE_CHECKING:
    import torch

log = logging.getLogger("rlboost.weights")

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024


@dataclass
class _Published:
    manifest: Manifest | None  # None until hashing finished
    buf: HostBuffer
    ready: cf.Future = field(default_factory=cf.Future)  # -> Manifest
    delta: cf.Future | None = None  # -> (DeltaManifest, payloads) | None


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
    digest_alg: Algorithm = DEFAULT_DIGEST  # the chunk digest (rlboost/contracts/digest.py)
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
        shuffles = delta_codec.shuffle_widths(m.tensors, m.chunks)

        sparse = self.sparse_delta

        def one(c: ChunkInfo) -> tuple[Encoding, bytes] | None:
            old, new = base.buf.view[c.offset : c.offset + c.size], pub.buf.view[c.offset : c.offset + c.size]
            if sparse:
                return delta_codec.encode_best(old, new, shuffles[c.index])
            p = delta_codec.encode(old, new, shuffles[c.index])
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


def add_routes(app: web.Application, publisher: WeightPublisher) -> None:
    async def latest(_: web.Request) -> web.Response:
        publisher.collect()  # cheap; lets versions whose pullers went away go
        return web.json_response({"version": publisher.latest, "oldest_base": publisher.oldest_base()})

    async def delta_manifest(request: web.Request) -> web.Response:
        version, base = int_param(request, "version"), int_param(request, "base")
        if version is None or base is None:
            return error_response(400, "version and base must be non-negative integers")
        got = await publisher.wait_delta(version, base)
        if got is None:
            return error_response(404, f"no delta for weight version {version} from {base}")
        return web.Response(text=got[0].model_dump_json(), content_type="application/json")

    async def delta_chunk(request: web.Request) -> web.StreamResponse:
        version, base, index = (int_param(request, k) for k in ("version", "base", "index"))
        if version is None or base is None or index is None:
            return error_response(400, "version, base and chunk index must be non-negative integers")
        got = await publisher.wait_delta(version, base)
        if got is None or not 0 <= index < len(got[0].chunks) or got[1][index] is None:
            return error_response(404, f"no delta chunk {index} for weight version {version} from {base}")
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
