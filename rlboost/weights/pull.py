"""Pull client for published weights (rlboost/weights/publisher.py is the server side).

A pull reads the manifest, then fetches chunks on `parallel` threads (the worker's `PullOptions` say
how many, and everything else about how it pulls), each with its own keep-alive connection, straight
into one buffer that the engine then loads from (tensors are views into it).
Every chunk is hashed as it lands and counts only when its digest matches the manifest's
(rlboost/contracts/digest.py: BLAKE3 unless the manifest says otherwise).

Sources, in order of preference:
  1. a delta from the version this worker already holds (rlboost/weights/delta_codec.py: sparse or dense
     per chunk), when offered;
  2. peers that hold the chunk (other workers; the trainer's tracker says who holds what);
  3. the trainer ("origin"), for chunks the tracker granted to this puller (so each chunk leaves the
     trainer about once per region, however many workers pull), or for everything when there is no
     tracker. The puller reports its region (`cloud/region`) and the tracker offers peers of that
     region only (rlboost/weights/region_fanout.py).

Failures: a broken body resumes with a `Range` request for the rest (from any source, since chunk
bytes are fixed by their hash); a dead peer, or one that serves wrong bytes, is dropped and
reported, and its chunks are fetched elsewhere; origin failures are retried with backoff, `retries`
times per chunk. Every request has a deadline, so a pull either finishes or raises WeightPullError.

Beside this module: the control plane (manifest, latest version, errors and retries:
rlboost/weights/pull_control.py) and the fetch threads' shared schedule of chunks and sources
(rlboost/weights/pull_schedule.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
from pydantic import ValidationError

from rlboost.contracts import digest
from rlboost.contracts.retry import retry
from rlboost.contracts.weight_manifest import DeltaManifest, Manifest
from rlboost.weights.buffers import HostBuffer, tensor_views
from rlboost.weights.chunk_http import HttpConn, Partial, SourceError
from rlboost.weights.delta_codec import decode_chunk
from rlboost.weights.pull_control import PULL_BACKOFF, ControlClient, WeightPullError, fetch_manifest, retryable
from rlboost.weights.pull_schedule import ORIGIN, ChunkSchedule
from rlboost.weights.serving import RateLimit
from rlboost.weights.tracker import decode_bits, encode_bits

if TYPE_CHECKING:
    import torch

    from rlboost.weights.store import Held, WeightStore


@dataclass(frozen=True)
class PullOptions:
    """How a worker pulls: the same for every version it pulls (`pull_weights` takes what changes
    per call: the version, the session, the stats, the store, the progress callback)."""

    token: str | None = None  # the job token, sent as a Bearer header to the trainer and to peers
    parallel: int = 4  # fetch threads, each with its own keep-alive connection
    retries: int = 5  # origin attempts per chunk, and retries of each control-plane request
    timeout_s: float = 30.0  # bounds each request
    swarm: bool = True  # ask the trainer's tracker for peers (False: everything from the trainer)
    delta: bool = True  # with a store: pull as a delta from the version it holds, when offered
    local: bool = False  # map the trainer's buffer when on the same machine
    region: str | None = None  # this worker's `cloud/region`, reported to the tracker
    peer_id: str | None = None  # this puller's name in the tracker
    peer_url: str | None = None  # where this puller serves verified chunks to peers (None: nowhere)
    announce_s: float = 0.25  # how often the tracker hears what this puller holds
    # benchmarks only: an emulated NIC, no digest check, bytes left in the store (return {}, so torch
    # is never imported), and an emulated slow link for bytes from the trainer or from a peer in
    # another region
    ingress_bps: float | None = None
    verify: bool = True
    as_tensors: bool = True
    cross_region_bps: float | None = None


@dataclass
class PullStats:
    """Filled in by `pull_weights(..., stats=PullStats())`."""

    version: int = -1
    mode: str = "full"  # full | delta | local
    total_bytes: int = 0
    bytes_received: int = 0  # on the wire, including bytes thrown away by re-fetches
    from_origin: int = 0
    from_peers: int = 0
    from_peers_elsewhere: int = 0  # of from_peers: from peers the tracker placed in another region
    delta_bytes: int = 0  # compressed delta bytes received
    chunks: int = 0
    unchanged_chunks: int = 0
    retries: int = 0
    bad_peers: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        mib = 1 << 20
        rate = self.total_bytes / mib / self.seconds if self.seconds else 0.0
        return (
            f"version {self.version} ({self.mode}): {self.total_bytes / mib:.1f} MiB in {self.seconds:.2f}s "
            f"({rate:.0f} MiB/s); wire {self.bytes_received / mib:.1f} MiB = origin {self.from_origin / mib:.1f} "
            f"+ peers {self.from_peers / mib:.1f} + delta {self.delta_bytes / mib:.1f}; retries {self.retries}"
            + (f"; dropped peers {self.bad_peers}" if self.bad_peers else "")
        )


class _Corrupt(Exception):
    pass


# ---- one chunk over one connection (runs on a fetch thread) ------------------------------------


def fetch_into(
    conn: HttpConn,
    path: str,
    expect: str,
    dest: memoryview,
    part: Partial,
    *,
    limit: RateLimit | None = None,
    stop: threading.Event | None = None,
    verify: bool = True,
) -> int:
    """Fill `dest` (all of it: the body is len(dest) bytes) with the body at `path`, resuming at
    part.got. Returns bytes read off the wire.

    Raises SourceError (the source failed; `part` keeps what arrived) or _Corrupt (hash mismatch;
    `part` is reset, since none of the bytes can be trusted)."""
    size = len(dest)
    headers = {"Range": f"bytes={part.got}-{size - 1}"} if part.got else {}
    status, h = conn.request(path, headers)
    if status == 200:
        if part.got:  # the server ignored the range: start over
            part.reset()
    elif status == 206:
        if not h.get("content-range", "").startswith(f"bytes {part.got}-"):
            conn.close()
            raise SourceError(f"unexpected Content-Range {h.get('content-range')!r}")
    else:
        detail = conn.read_text(h, 200)
        raise SourceError(f"HTTP {status}: {detail}", retryable=retryable(status), status=status)
    length = h.get("content-length")
    if length is None or not length.isdigit() or int(length) != size - part.got:
        conn.close()
        raise SourceError(f"body length {length} != {size - part.got} expected")
    n = conn.read_body_into(dest, size - part.got, part, limit, stop)
    if h.get("connection", "").lower() == "close":
        conn.close()
    if verify and part.hasher.hexdigest() != expect:
        part.reset()
        raise _Corrupt(f"{part.alg} mismatch")
    return n


# ---- the pull --------------------------------------------------------------------------------


class _Rate:
    """Bytes per second of a growing counter, smoothed over its last few samples."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.per_s = 0.0
        self._last: tuple[float, int] | None = None

    def add(self, total: int) -> None:
        now = self.clock()
        if self._last is not None and now - self._last[0] >= 0.02:
            inst = (total - self._last[1]) / (now - self._last[0])
            self.per_s = inst if self.per_s == 0 else 0.5 * self.per_s + 0.5 * inst
        if self._last is None or now - self._last[0] >= 0.02:
            self._last = (now, total)


class _BothLimits:
    """Bytes that pass two emulated links (the NIC, and the slow path between regions)."""

    def __init__(self, a: RateLimit, b: RateLimit) -> None:
        self.a, self.b = a, b

    def reserve(self, n: int) -> float:
        return max(self.a.reserve(n), self.b.reserve(n))


@dataclass
class _Ctx:
    """One pull: what its phases and fetch threads share (the options, the manifest, the buffer the
    chunks land in, the counters)."""

    base: str  # origin base URL
    version: int
    opts: PullOptions
    cl: ControlClient
    m: Manifest
    buf: HostBuffer
    mark: Callable[[int], None]  # chunk i is verified in `buf` (a store serves it to peers from then on)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    done_bytes: int = 0
    peer_region: dict[str, str | None] = field(default_factory=dict)
    limit: RateLimit | None = field(init=False)
    # benchmarks: bytes from another region (the trainer, or a peer the tracker says is elsewhere)
    # also pass this slower bucket
    cross_limit: RateLimit | None = field(init=False)
    pool: cf.ThreadPoolExecutor = field(init=False)  # the fetch threads

    def __post_init__(self) -> None:
        o = self.opts
        self.limit = RateLimit(o.ingress_bps) if o.ingress_bps else None
        self.cross_limit = RateLimit(o.cross_region_bps, burst=64 << 10) if o.cross_region_bps else None
        self.pool = cf.ThreadPoolExecutor(max_workers=max(1, o.parallel), thread_name_prefix="pull")

    @property
    def stats(self) -> PullStats:
        return self.cl.stats

    def limit_for(self, src: str) -> Any:
        if self.cross_limit is None or (src != ORIGIN and self.peer_region.get(src) == self.opts.region):
            return self.limit
        return _BothLimits(self.limit, self.cross_limit) if self.limit else self.cross_limit

    def conn(self, pool: dict[str, HttpConn], src: str) -> HttpConn:
        if src not in pool:
            try:
                pool[src] = HttpConn(self.base if src == ORIGIN else src, self.opts.token, self.opts.timeout_s)
            except ValueError as e:  # a peer URL that is no URL (the tracker relays what peers say)
                raise SourceError(str(e), retryable=False) from e
        return pool[src]

    def count(self, n: int, **fields: int) -> None:
        with self.lock:
            self.stats.bytes_received += n
            for k, v in fields.items():
                setattr(self.stats, k, getattr(self.stats, k) + v)


def _full_loop(ctx: _Ctx, plan: ChunkSchedule) -> None:
    """One fetch thread: take a chunk, fetch it from its source, verify, repeat."""
    m, buf = ctx.m, ctx.buf
    pool: dict[str, HttpConn] = {}
    try:
        while (job := plan.take()) is not None:
            c, src = job
            info = m.chunks[c]
            dest = buf.view[info.offset : info.offset + info.size]
            part = plan.partials.get(c) or plan.partials.setdefault(c, Partial.new(m.digest))
            before = part.got
            try:
                n = fetch_into(
                    ctx.conn(pool, src),
                    f"/v1/weights/{ctx.version}/chunks/{c}",
                    info.digest,
                    dest,
                    part,
                    limit=ctx.limit_for(src),
                    stop=ctx.stop,
                    verify=ctx.opts.verify,
                )
            except (SourceError, _Corrupt) as e:
                corrupt = isinstance(e, _Corrupt)
                # 404: the peer no longer holds v; 429: its upload slots are full. Neither is a fault:
                # ask another holder (the next tracker answer lists this one again).
                absent = isinstance(e, SourceError) and e.status in (404, 429) and src != ORIGIN
                ctx.count(info.size - before if corrupt else part.got - before, retries=0 if absent else 1)
                if isinstance(e, SourceError) and not e.retryable and src == ORIGIN:
                    plan.fail(WeightPullError(f"weight version {ctx.version} chunk {c}: {e}"))
                    return
                suspects = (part.sources | {src}) - {ORIGIN} if corrupt else set()
                if corrupt:
                    part.sources.clear()
                elif src != ORIGIN and part.got > before:
                    part.sources.add(src)
                fails = plan.failed(
                    c,
                    src,
                    e,
                    # A peer that served bytes of a bad chunk is dropped, and so is one that failed
                    # a request for any other reason.
                    drop=(suspects | ({src} if isinstance(e, SourceError) and not absent else set())) - {ORIGIN},
                    forget=src if absent else None,
                )
                if src == ORIGIN:
                    time.sleep(PULL_BACKOFF.delay(fails))
                elif absent:  # a busy swarm: don't hammer the same holders at once
                    time.sleep(0.01 + 0.02 * random.random())
                continue
            part.sources.add(src)
            if src == ORIGIN:
                ctx.count(n, from_origin=n)
            else:
                elsewhere = n if ctx.peer_region.get(src) != ctx.opts.region else 0
                ctx.count(n, from_peers=n, from_peers_elsewhere=elsewhere)
            ctx.mark(c)
            with ctx.lock:
                ctx.done_bytes += info.size
            plan.done(c, src)
    except BaseException as e:  # a bug must not leave the pull waiting forever
        plan.fail(e)
    finally:
        for conn in pool.values():
            conn.close()


@dataclass
class _DeltaJob:
    """The delta phase's work, shared by its threads."""

    dm: DeltaManifest
    base_buf: HostBuffer  # the held version the deltas apply to
    todo: list[int]  # changed chunks no thread has taken yet
    rebuilt: set[int]  # chunks in place and verified (copied unchanged, or rebuilt from their delta)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _delta_loop(ctx: _Ctx, job: _DeltaJob) -> None:
    """One delta thread: fetch a compressed chunk delta, rebuild the chunk, verify it against the
    full manifest. A chunk that fails stays out of `job.rebuilt` and is fetched in full afterwards."""
    dm, m, buf, base_buf = job.dm, ctx.m, ctx.buf, job.base_buf
    conn = HttpConn(ctx.base, ctx.opts.token, ctx.opts.timeout_s)
    scratch = bytearray(max((d.size for d in dm.chunks), default=0))
    try:
        while not ctx.stop.is_set():
            with job.lock:
                if not job.todo:
                    return
                c = job.todo.pop()
            d, info = dm.chunks[c], m.chunks[c]
            sl = slice(info.offset, info.offset + info.size)
            payload = memoryview(scratch)[: d.size]

            def once(c: int = c, d=d, info=info, sl=sl, payload=payload) -> bool:  # bound: ruff B023
                part = Partial.new(m.digest)
                try:
                    n = fetch_into(
                        conn,
                        f"/v1/weights/{ctx.version}/delta/{dm.base}/chunks/{c}",
                        d.digest or "",
                        payload,
                        part,
                        limit=ctx.limit_for(ORIGIN),
                        stop=ctx.stop,
                    )
                    ctx.count(n, delta_bytes=n)
                    decode_chunk(base_buf.view[sl], payload, buf.view[sl], d.shuffle, d.encoding)
                except (SourceError, _Corrupt, ValueError):
                    ctx.count(0, retries=1)
                    raise
                return digest.hexdigest(m.digest, buf.view[sl]) == info.digest

            try:
                ok = retry(once, tries=3, backoff=PULL_BACKOFF, on=(SourceError, _Corrupt, ValueError))
            except (SourceError, _Corrupt, ValueError):
                ok = False  # fetched in full afterwards
            if ok:
                job.rebuilt.add(c)
                ctx.mark(c)
                with ctx.lock:
                    ctx.done_bytes += info.size
    finally:
        conn.close()


async def pull_weights(
    base_url: str,
    version: int,
    opts: PullOptions | None = None,
    *,
    session: aiohttp.ClientSession | None = None,
    stats: PullStats | None = None,
    store: WeightStore | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, torch.Tensor]:
    """Fetch, verify and load weight `version`; returns tensors that are views into one buffer.

    `opts` (PullOptions) says how: threads, timeouts, retries, the swarm, the region. With a `store`
    (rlboost/weights/store.py) verified chunks are served to peers as they land, and the version held
    before is the base for a delta. `on_progress(done_bytes, total_bytes)` is called from the event
    loop as chunks land."""
    o = opts if opts is not None else PullOptions()
    base = base_url.rstrip("/")
    st = stats if stats is not None else PullStats()
    st.version, t0 = version, time.monotonic()
    own = session is None
    cl = ControlClient(session or aiohttp.ClientSession(), o.token, o.timeout_s, o.retries, st)
    try:
        m = await fetch_manifest(cl, base, version)
        st.total_bytes, st.chunks = m.total_bytes, len(m.chunks)
        if o.local and m.local_path:
            from rlboost.weights.local import open_local

            mapped = await asyncio.to_thread(open_local, m)
            if mapped is not None:
                st.mode = "local"
                if on_progress:
                    on_progress(m.total_bytes, m.total_bytes)
                return tensor_views(mapped, m.tensors)
        buf = store.buffer(m.total_bytes) if store is not None else HostBuffer(m.total_bytes, shareable=False)
        mark = store.begin(m, buf) if store is not None else (lambda _c: None)
        ctx = _Ctx(base, version, o, cl, m, buf, mark)
        try:
            todo = list(range(len(m.chunks)))
            held = store.base_for(m) if (store is not None and o.delta) else None
            if held is not None:
                todo = await _delta_phase(ctx, held)
            if todo:
                await _full_phase(ctx, todo, on_progress)
        except BaseException:
            if store is not None:
                store.abandon(version)
            raise
        finally:
            ctx.stop.set()
            ctx.pool.shutdown(wait=False)
        if store is not None:
            store.complete(version)
        if on_progress:
            on_progress(m.total_bytes, m.total_bytes)
        return tensor_views(buf.view, m.tensors) if o.as_tensors else {}
    finally:
        if own:
            await cl.session.close()
        st.seconds = time.monotonic() - t0


async def _delta_phase(ctx: _Ctx, held: Held) -> list[int]:
    """Rebuild what a delta from the held version can give; returns the chunks still to fetch."""
    m, buf, version = ctx.m, ctx.buf, ctx.version
    body = await ctx.cl.get_json(
        f"{ctx.base}/v1/weights/{version}/delta/{held.manifest.version}/manifest", "weight delta", missing_ok=True
    )
    try:
        dm = DeltaManifest.model_validate(body) if body is not None else None
    except ValidationError:
        dm = None
    if dm is None or dm.version != version or len(dm.chunks) != len(m.chunks):
        return list(range(len(m.chunks)))
    ctx.stats.mode = "delta"
    rebuilt: set[int] = set()
    changed = []
    for d in dm.chunks:
        info, old = m.chunks[d.index], held.manifest.chunks[d.index]
        if d.size == 0 and info.digest == old.digest and info.offset == old.offset and info.size == old.size:
            # Unchanged, and the held bytes were verified against this very hash: copy, no re-hash.
            buf.view[info.offset : info.offset + info.size] = held.buf.view[old.offset : old.offset + old.size]
            rebuilt.add(d.index)
            ctx.mark(d.index)
            ctx.stats.unchanged_chunks += 1
        elif d.size > 0 and d.digest:
            changed.append(d.index)
    job = _DeltaJob(dm, held.buf, changed, rebuilt)
    loop = asyncio.get_running_loop()
    n = max(1, min(ctx.opts.parallel, len(changed)))
    futs = [loop.run_in_executor(ctx.pool, _delta_loop, ctx, job) for _ in range(n if changed else 0)]
    await asyncio.gather(*futs)
    return [c for c in range(len(m.chunks)) if c not in rebuilt]


async def _full_phase(ctx: _Ctx, todo: list[int], on_progress: Callable[[int, int], None] | None) -> None:
    """Fetch the chunks in `todo` from peers and the trainer, announcing to the tracker meanwhile."""
    o, m, cl, base, version = ctx.opts, ctx.m, ctx.cl, ctx.base, ctx.version
    parallel = max(1, o.parallel)
    loop = asyncio.get_running_loop()
    need = asyncio.Event()
    seed = hash((o.peer_id, version)) & 0xFFFF_FFFF

    def on_need() -> None:  # from a fetch thread
        with contextlib.suppress(RuntimeError):  # the loop is closing
            loop.call_soon_threadsafe(need.set)

    plan = ChunkSchedule(f"weight version {version}", todo, o.retries, seed, on_need)
    have = set(range(len(m.chunks))) - set(todo)
    if not o.swarm:
        plan.update(None, None, grant_all=True)
    futs = [loop.run_in_executor(ctx.pool, _full_loop, ctx, plan) for _ in range(parallel)]
    gathered = asyncio.gather(*futs)
    pid = o.peer_id or f"puller-{id(plan):x}"
    failures = 0
    reported = 0
    rate = _Rate()
    try:
        while not gathered.done():
            if o.swarm and not plan.grant_all:
                with ctx.lock:
                    rate.add(ctx.done_bytes)
                # Grants for ~0.1 s of this puller's own rate: a fast lone puller keeps its threads
                # fed between announces; a link-limited one in a swarm leaves chunks for the others.
                want = max(4, min(16, round(rate.per_s * 0.1 / m.chunk_bytes / parallel))) * parallel
                plan.low_water = want // 2
                body = {
                    "peer_id": pid,
                    "url": o.peer_url,
                    "n_chunks": len(m.chunks),
                    "have": encode_bits(have | (set(todo) - plan.todo), len(m.chunks)),
                    "want": want,
                    "bad": sorted(plan.new_bad),
                    "region": o.region,
                }
                try:
                    status, view = await cl.post_json(f"{base}/v1/weights/{version}/swarm", body)
                    if status == 404 or status == 405:  # no tracker on this trainer: origin only
                        plan.update(None, None, grant_all=True)
                    elif status == 200 and isinstance(view, dict):
                        failures = 0
                        plan.new_bad.clear()
                        n = len(m.chunks)
                        listed = [p for p in view.get("peers", []) if p.get("url")]
                        peers = {p["url"]: decode_bits(p["have"], n) for p in listed}
                        peers.pop(o.peer_url, None)
                        ctx.peer_region.update({p["url"]: p.get("region") for p in listed})
                        plan.update(peers, {c for c in view.get("origin", []) if isinstance(c, int) and 0 <= c < n})
                    else:
                        failures += 1
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError):
                    failures += 1
                if failures >= 3:  # the tracker is gone: fetch what peers lack from origin
                    plan.update(None, None, grant_all=True)
            if on_progress:
                with ctx.lock:
                    d = ctx.done_bytes
                if d != reported:
                    on_progress(d, m.total_bytes)
                    reported = d
            need.clear()
            waiter = asyncio.ensure_future(need.wait())
            await asyncio.wait([gathered, waiter], timeout=o.announce_s, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            await asyncio.sleep(0.01)  # idle threads ask often: keep the tracker's load bounded
        await gathered
    finally:
        plan.stop()
        ctx.stop.set()
        st = ctx.stats
        st.bad_peers = sorted(plan.bad)
    if plan.error is not None:
        raise plan.error if isinstance(plan.error, WeightPullError) else WeightPullError(str(plan.error))
    if plan.todo:
        raise WeightPullError(f"weight version {version}: {len(plan.todo)} chunks never arrived")
    if o.swarm and failures < 3:  # done: releases this puller's grants and lets GC see it finished
        n = len(m.chunks)
        body = {"peer_id": pid, "url": o.peer_url, "n_chunks": n, "have": encode_bits(range(n), n), "done": True}
        body["bad"], body["region"] = sorted(plan.new_bad), o.region
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            await cl.post_json(f"{base}/v1/weights/{version}/swarm", body)
