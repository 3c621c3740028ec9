"""The live coordinator: engines dial in over WebSockets; the Coordinator's decisions reach them as
messages, and their tokens come back into the rollout book.

One WebSocket per engine (spot workers and the trainer's own reserved engine alike). Dispatch only
goes to engines that hold the step's weight version; a response whose engine drains, breaks its
stream or misses heartbeats continues on another engine from prompt + partial tokens
(rollout/book.py does the bookkeeping).

Every decision of a step is the Coordinator's (rollout/coordinator.py), the class the simulator runs
on a virtual clock; this module adds what only a live system has: the connections and their frames,
the step's asyncio loop and the events the trainer waits on. Token frames are binary columns
(contracts/token_frames.py) ingested with a few numpy operations per frame; JSON `tokens` frames are
still accepted. Everything else is JSON, validated with size caps.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from aiohttp import WSMsgType, web
from pydantic import ValidationError

from rlboost.contracts import protocol as P
from rlboost.contracts import token_frames
from rlboost.contracts.perf import AcceleratorPerf
from rlboost.contracts.sampling import request_seed
from rlboost.contracts.step_record import StepTiming
from rlboost.contracts.stop import StopStrings
from rlboost.rollout.book import ProtocolViolation, Response, RolloutBook
from rlboost.rollout.coordinator import Coordinator, CoordinatorRules
from rlboost.rollout.live_pool import EngineConn, LivePool
from rlboost.rollout.policies.lengths import LengthStats
from rlboost.rollout.policies.migration import MigrationConfig
from rlboost.rollout.policies.offload import NoOffload, OffloadPolicy
from rlboost.rollout.policies.tick import TickCadence

log = logging.getLogger("rlboost.coordinator")

VIOLATION = 4400  # close code: a frame broke the protocol (its responses continue elsewhere)
ID_IN_USE = 4409  # close code: hello named a live worker's id without that connection's resume key


@dataclass(frozen=True)
class RolloutRequest:
    rid: str
    prompt: list[int]
    max_new_tokens: int
    group: str | None = None  # GRPO group (prompt) id


@dataclass
class CoordinatorConfig:
    job_seed: int
    temperature: float
    chunk_tokens: int
    heartbeat_s: float
    heartbeat_timeout_s: float
    weights_url: str
    model: dict
    engine_dtype: str
    engine_batch: int
    eos_id: int
    # ---- scheduling (rollout/policies) ----
    dispatch_mode: str = "rate"  # rate | spread
    migration: MigrationConfig | None = field(default_factory=MigrationConfig)
    max_new_tokens: int = 0  # the response budget (for length statistics); 0: learn from requests
    perf: dict[str, AcceleratorPerf] = field(default_factory=dict)  # priors per accelerator
    tick: TickCadence = field(default_factory=TickCadence)  # when offload and migration are reconsidered
    binary_tokens: bool = True  # ask workers for binary token frames
    flush_s: float = 0.02  # how often workers send tokens
    sibling_scheduling: bool = False  # rollout.sibling_scheduling (rollout/policies/siblings.py)
    speculative: P.Speculation = field(default_factory=P.Speculation)  # rollout.speculative, for the engines
    top_k: int = 0  # algorithm.top_k / top_p, for the engines (off by default)
    top_p: float = 1.0
    # algorithm.stop with the task's decoder: the book ends responses at stop strings (contracts/stop.py)
    stop: StopStrings | None = None
    # algorithm.weight_swap in_flight: a new version interrupts the responses in flight, which continue
    # on it, and the next step generates beside the last one's tail (rollout/policies/staleness.py)
    swap_in_flight: bool = False
    # the model's vocabulary (the learner's embedding rows): a worker's token id outside it is a protocol
    # violation (rollout/book.py), never a sample; None: ids are only checked against the pool's int32 range
    vocab_size: int | None = None


class StepGroups:
    """One step's complete groups and the coordinator's events (trainer/streaming.py's GroupSource): the
    step's own, where the next step's generation has begun (algorithm.max_staleness)."""

    def __init__(self, coord: LiveCoordinator, step: int) -> None:
        self.coord, self.step = coord, step
        self.offloaded, self.group_ready = coord.offloaded, coord.group_ready

    @property
    def groups_done(self) -> deque[Hashable]:
        m = self.coord.marks_of(self.step)
        return m.groups_done if m is not None else deque()

    @property
    def group_tokens(self) -> dict[Hashable, int]:
        m = self.coord.marks_of(self.step)
        return m.group_tokens if m is not None else {}


class LiveCoordinator(Coordinator):
    def __init__(
        self, cfg: CoordinatorConfig, offload: OffloadPolicy | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        stats = LengthStats(max(1, cfg.max_new_tokens or 1))
        book = RolloutBook(cfg.eos_id, stop=cfg.stop, vocab_size=cfg.vocab_size)
        self.pool: LivePool = LivePool(book, cfg.perf, stats, clock)
        super().__init__(
            self.pool,
            CoordinatorRules(
                offload or NoOffload(), cfg.tick, cfg.migration, stats, cfg.dispatch_mode, cfg.sibling_scheduling
            ),
        )
        self.cfg = cfg
        self.keyed = True
        self.pool.send_siblings = cfg.speculative.method == "group"
        self.pool.draft_max_tokens = cfg.speculative.max_tokens if cfg.speculative.method != "none" else 0
        self.clock = clock
        self.version = -1  # latest published version
        self.offloaded = asyncio.Event()  # set when the reserved engine handed over this step
        self.group_ready = asyncio.Event()  # a group completed
        self.on_group_done = self.group_ready.set
        self.on_offload = self._offloaded
        self.pool.on_drop = lambda conn, why: asyncio.get_running_loop().create_task(self._drop(conn, why))
        self._monitor: asyncio.Task | None = None
        self._on_response: dict[int, Callable[[Response], None]] = {}  # per generating step
        self.tokens_total = 0
        self.tokens_spot = 0  # generated by spot (non-reserved) engines; cost-report splits spend by it
        self._tokens_at_step_end = (0, 0)  # (tokens_total, tokens_spot) when the last step ended
        self.responses_total = 0
        self.swapped = 0  # responses a new version interrupted in flight (weight_swap in_flight)
        self.rejected_frames = 0
        self.frames_total = 0

    @property
    def book(self) -> RolloutBook:
        return self.pool.book

    @property
    def engines(self) -> dict[str, EngineConn]:
        return self.pool.engines

    @property
    def gone(self) -> dict[str, EngineConn]:
        return self.pool.gone

    @property
    def step_version(self) -> int | None:
        return self.pool.step_version

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._monitor = asyncio.get_running_loop().create_task(self._watch_heartbeats())

    async def close(self, reason: str = "job finished") -> None:
        if self._monitor:
            self._monitor.cancel()
        for conn in list(self.engines.values()):
            with contextlib.suppress(Exception):
                await self._send(conn, P.Shutdown(reason=reason))
                await conn.ws.close()

    def receivers(self) -> list[EngineConn]:
        """The engines a new version goes to now."""
        return [c for c in self.engines.values() if c.state in ("ready", "pulling")]

    async def publish(self, version: int, offers: dict[str, P.Offer] | None = None) -> None:
        """A new weight version exists: every connected engine pulls it before more work; those in
        `offers` (worker id -> offer) get it by the transport offered (e.g. the trainer's broadcast)."""
        self.version = version
        pool = self.pool
        swap = self.cfg.swap_in_flight and bool(pool.steps)
        if swap:  # every response in flight continues on the new version (AReaL's interruptible rollout)
            pool.step_version = version
            self.swapped += pool.swap(version)
        plain = P.NewVersion(version=version).model_dump_json()
        for conn in self.receivers():
            conn.state = "pulling"
            offer = (offers or {}).get(conn.id)
            text = plain if offer is None else P.NewVersion(version=version, offer=offer).model_dump_json()
            self.pool.post(conn, text)

    # ---- a step ------------------------------------------------------------------------
    async def run_step(
        self,
        step: int,
        version: int,
        requests: list[RolloutRequest],
        *,
        need_groups: int | None = None,
        on_response: Callable[[Response], None] | None = None,
        offload_at_start: bool = False,
    ) -> list[Response]:
        """Generate all requests with weights `version`; returns when every response is complete.

        need_groups (tail batching): return as soon as that many groups are complete; the other
        responses are aborted and dropped (see `self.unfinished_groups`). offload_at_start: the trainer's
        accelerators are training an older step (algorithm.max_staleness), so its engines hand over at once
        (`take_back_reserved` returns the step to them)."""
        if self.cfg.swap_in_flight:  # a version published since the step drew its prompts: begin on it
            version = max(version, self.version)
        pool, book = self.pool, self.book
        beside = bool(pool.steps)  # weights swap in flight: an earlier step still generates
        assert not beside or self.cfg.swap_in_flight, f"step {step} begun while steps {pool.steps} generate"
        pool.step, pool.step_version = step, version
        pool.steps.add(step)
        if on_response is not None:
            self._on_response[step] = on_response
        if not beside:
            self.offloaded.clear()
        if not self.cfg.max_new_tokens and requests:
            self.stats.budget = max(r.max_new_tokens for r in requests)
        now = self.clock()
        groups = Counter(r.group for r in requests if r.group is not None)
        self.begin_step(step, now, groups, need_groups=need_groups, overlapping=beside)
        book.add(
            Response(
                rid=r.rid,
                step=step,
                version=version,
                prompt=r.prompt,
                max_new_tokens=r.max_new_tokens,
                seed=request_seed(self.cfg.job_seed, r.rid),
                group=r.group,
            )
            for r in requests
        )
        if offload_at_start and pool.reserved():
            self.offload_now(now, pool.reserved())
        next_tick = now
        pool.full_dispatch = True
        try:
            while book.outstanding(step):
                self._drain_completed()
                if self.abandon_due(book.outstanding(step)):
                    self.abandon(self.clock())
                    break
                self.dispatch(self.clock())
                now = self.clock()
                if now >= next_tick and step == max(pool.steps):
                    next_tick = now + self.tick(now)  # the newest generating step's loop ticks for all
                pool.changed.clear()
                if not book.outstanding(step):
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(pool.changed.wait(), timeout=self.cadence.tick_s)
                await asyncio.sleep(0.002)  # coalesce a burst of events into one round
            self._drain_completed()
        finally:
            pool.steps.discard(step)
            self._on_response.pop(step, None)
            if not pool.steps:
                pool.step_version = None
                for conn in self.engines.values():
                    conn.offloaded = False
        self.generation_done(self.clock(), step)
        done = book.collect(step)
        self.responses_total += len(done)
        return done

    def end_step(  # type: ignore[override]
        self,
        train_busy_s: float = 0.0,
        train_tokens: int = 0,
        busy_during_tail_s: float = 0.0,
        step: int | None = None,
    ) -> StepTiming | None:
        """The trainer finished the step (trained and published): the offload policy learns; what the
        coordinator measured of the step (None: it timed none), with the tokens generated since the
        last step ended (every engine's, and the spot workers' part). `step`: which one, where the next
        one's generation has begun (algorithm.max_staleness)."""
        m = self.marks if step is None else self.marks_of(step)
        if m is None or m.gen_end is None:
            return None
        o = super().end_step(
            self.clock(),
            train_busy_s=train_busy_s,
            train_tokens=train_tokens,
            busy_during_tail_s=busy_during_tail_s,
            step=m.step,
        )
        gen, spot = self.tokens_total - self._tokens_at_step_end[0], self.tokens_spot - self._tokens_at_step_end[1]
        self._tokens_at_step_end = (self.tokens_total, self.tokens_spot)
        return StepTiming(
            spot_workers=o.n_remote,
            step_s=round(o.step_s, 3),
            gen_s=round(o.gen_s, 3),
            offload_s=None if o.box_s is None else round(o.box_s, 3),
            trainer_idle_s=round(o.trainer_idle_s, 3),
            remote_idle_s=round(o.remote_idle_s, 3),
            gen_tokens=gen,
            spot_tokens=spot,
        )

    def take_back_reserved(self, now: float) -> None:
        super().take_back_reserved(now)
        self.offloaded.clear()  # the step's feeder waits for the offload policy's own hand-over

    def step_groups(self, step: int) -> StepGroups:
        """Step `step`'s complete groups, as the trainer's feeder takes them."""
        return StepGroups(self, step)

    def _drain_completed(self) -> None:
        for r in self.book.drain_completed():
            self.response_done(r.group, r.generated, r.step)
            on_response = self._on_response.get(r.step)
            if on_response is not None:
                on_response(r)

    def _offloaded(self) -> None:
        m = self.marks
        assert m is not None and m.offload_at is not None
        log.info(  # users count steps from 1 (the trainer's log says "step 1/N" for index 0)
            "step %d: offload after %.2fs, %d partial responses continue on remote engines",
            m.step + 1, m.offload_at - m.t0, self.handed_over,
        )
        self.offloaded.set()

    # ---- engine connections ------------------------------------------------------------
    async def handle_ws(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(heartbeat=None, max_msg_size=P.MAX_FRAME_BYTES)
        await ws.prepare(request)
        conn: EngineConn | None = None
        try:
            first = await asyncio.wait_for(ws.receive(), timeout=10)
            hello = self._parse(first)
            if not isinstance(hello, P.Hello) or hello.protocol != P.PROTOCOL_VERSION:
                await ws.close(code=4400, message=b"expected hello with protocol 1")
                return ws
            old = self.engines.get(hello.worker_id)
            if old is not None and not self._may_replace(old, hello):
                # another connection naming a live worker's id: refused, the live one keeps its work
                self.rejected_frames += 1
                log.warning("a second connection for engine %s refused: its id is in use", hello.worker_id)
                await ws.close(code=ID_IN_USE, message=b"worker id in use by a live connection")
                return ws
            if old is not None:  # its own reconnect (or its old connection is closing): replaces it
                await self._drop(old, "replaced by its reconnect")
            conn = EngineConn(
                hello.worker_id,
                hello.kind,
                hello.engine,
                hello.capacity,
                ws,
                accelerator=hello.accelerator,
                cuda=hello.cuda,
                cloud=hello.cloud,
                region=hello.region,
            )
            conn.resume_key = secrets.token_hex(16)
            self.engines[conn.id] = conn
            self.gone.pop(conn.id, None)
            await self._send(conn, self._welcome(conn.id, conn.resume_key))
            conn.writer = asyncio.get_running_loop().create_task(self._writer(conn))
            log.info("engine %s (%s, %s) connected", conn.id, conn.kind, conn.engine)
            async for frame in ws:
                if frame.type == WSMsgType.BINARY:
                    try:
                        cols = token_frames.decode(frame.data)
                    except token_frames.FrameError as e:
                        self.rejected_frames += 1
                        await self._drop(conn, f"malformed token frame ({e})", code=VIOLATION)
                        break
                    conn.last_seen = self.clock()
                    self.on_tokens(conn, cols)
                elif frame.type == WSMsgType.TEXT:
                    msg = self._parse(frame)
                    if msg is None:
                        self.rejected_frames += 1
                        await self._drop(conn, "malformed frame", code=VIOLATION)
                        break
                    conn.last_seen = self.clock()
                    self.on_message(conn, msg)
                else:
                    break  # close, error
        except (asyncio.TimeoutError, ConnectionError):
            pass
        except ProtocolViolation as e:
            # as a disconnect: its responses continue elsewhere (the finally), and it is closed
            log.warning("engine %s: protocol violation: %s", conn.id if conn else "?", e)
            self.rejected_frames += 1
            if conn is not None:
                await self._drop(conn, f"protocol violation ({e})", code=VIOLATION)
        finally:
            if conn is not None and self.engines.get(conn.id) is conn:
                await self._drop(conn, "connection closed")
            if conn is not None and conn.writer is not None:
                conn.writer.cancel()
        return ws

    @staticmethod
    def _may_replace(old: EngineConn, hello: P.Hello) -> bool:
        """A hello may take over a connected worker's id only as that worker's reconnect: it presents the
        resume key the live connection's welcome gave, or that connection is closing already."""
        if old.ws.closed:
            return True
        return hello.resume_key is not None and hmac.compare_digest(hello.resume_key, old.resume_key)

    def _welcome(self, worker_id: str, resume_key: str = "") -> P.Welcome:
        c = self.cfg
        return P.Welcome(
            worker_id=worker_id,
            resume_key=resume_key,
            version=self.version,
            weights_url=c.weights_url,
            chunk_tokens=c.chunk_tokens,
            heartbeat_s=c.heartbeat_s,
            seed=c.job_seed,
            temperature=c.temperature,
            top_k=c.top_k,
            top_p=c.top_p,
            model=c.model,
            engine_dtype=c.engine_dtype,
            engine_batch=c.engine_batch,
            binary_tokens=c.binary_tokens,
            flush_s=c.flush_s,
            speculative=c.speculative,
        )

    @staticmethod
    def _parse(frame) -> P.Hello | P.Ready | P.Tokens | P.Finished | P.Draining | P.Heartbeat | None:
        if frame.type != WSMsgType.TEXT:
            return None
        try:
            return P.worker_msg.validate_json(frame.data)
        except ValidationError:
            return None

    def on_tokens(self, conn: EngineConn, cols: token_frames.TokenColumns) -> None:
        n = self.book.accept_columns(conn.id, cols.version, cols.handles, cols.offsets, cols.counts, cols.ids, cols.lps)
        self.frames_total += 1
        if n:
            self._count_tokens(conn, n)
            self._abort_stopped()

    def _abort_stopped(self) -> None:
        """Responses a stop string just ended are complete: their engines stop generating them."""
        stopped = self.book.take_stopped()
        if not stopped:
            return
        by_engine: dict[str, list[str]] = {}
        for eid, rid in stopped:
            by_engine.setdefault(eid, []).append(rid)
        for eid, rids in by_engine.items():
            self.pool.abort(eid, rids)
            self.pool.dirty.add(eid)
        self.slots_changed()
        self.pool.changed.set()

    def _count_tokens(self, conn: EngineConn, n: int) -> None:
        conn.tokens += n
        self.tokens_total += n
        if conn.kind != "reserved":
            self.tokens_spot += n
        conn.meter.add(self.clock(), n, len(self.book.assigned(conn.id)))

    def on_message(self, conn: EngineConn, msg) -> None:
        pool = self.pool
        if isinstance(msg, P.Tokens):
            n = self.book.accept_chunks(conn.id, [(c.rid, c.offset, c.ids, c.logprobs, c.version) for c in msg.chunks])
            self.frames_total += 1
            if n:
                self._count_tokens(conn, n)
                self._abort_stopped()
        elif isinstance(msg, P.Finished):
            if not len(msg.rids) == len(msg.reasons) == len(msg.lengths):
                raise ProtocolViolation("finished: rids, reasons and lengths differ in length")
            self._count_drafts(conn, msg)
            for rid, reason, length in zip(msg.rids, msg.reasons, msg.lengths):
                self.book.finish(conn.id, rid, reason, length)
                conn.dispatched_at.pop(rid, None)
                if rid in conn.aborting:
                    conn.aborting.discard(rid)
                    pool.full_dispatch = True  # it may go to this engine again, or was held back
            if any(why == "aborted" for why in msg.reasons):
                pool.full_dispatch = True  # requeued work
            pool.dirty.add(conn.id)
            self.slots_changed()
            pool.changed.set()
        elif isinstance(msg, P.Ready):
            if msg.capacity is not None:
                conn.capacity = msg.capacity
                conn.model = None
            if msg.version == self.version:
                conn.version = msg.version
                if conn.state != "draining":
                    conn.state = "ready"
                pool.full_dispatch = True
                self.pool_changed(0.0)  # ask the offload policy again at once: the remote pool changed
                pool.changed.set()
        elif isinstance(msg, P.Heartbeat):
            conn.tokens_per_s = msg.tokens_per_s
        elif isinstance(msg, P.Draining):
            conn.state = "draining"
            moved = pool.released(conn)
            log.info("engine %s draining (%s): %d responses continue elsewhere", conn.id, msg.reason, len(moved))
        elif isinstance(msg, P.Hello):
            raise ProtocolViolation("second hello on one connection")

    def _count_drafts(self, conn: EngineConn, msg: P.Finished) -> None:
        """Speculative decoding counts of the responses this engine held (before their ends complete them)."""
        drafted = accepted = 0
        for rid, d, a, n in zip(msg.rids, msg.drafted, msg.accepted, msg.draft_passes):
            r = self.book.responses.get(rid)
            if r is not None and r.engine == conn.id and not r.done:
                r.drafted, r.accepted, r.draft_passes = r.drafted + d, r.accepted + a, r.draft_passes + n
                drafted, accepted = drafted + d, accepted + a
        self.pool.count_drafts(drafted, accepted)  # the offload's prediction of the pool (drafting())

    async def _writer(self, conn: EngineConn) -> None:
        while True:
            text = await conn.outq.get()
            if not await self._send_raw(conn, text):
                await self._drop(conn, "send failed")
                return

    async def _send(self, conn: EngineConn, msg: P.Msg) -> bool:
        return await self._send_raw(conn, msg.model_dump_json())

    async def _send_raw(self, conn: EngineConn, text: str) -> bool:
        try:
            async with conn.send_lock:
                await asyncio.wait_for(conn.ws.send_str(text), timeout=10)
            return True
        except (ConnectionError, asyncio.TimeoutError, RuntimeError):
            return False

    async def _drop(self, conn: EngineConn, why: str, code: int = 1000) -> None:
        self.pool.forget(conn)
        moved = self.pool.released(conn)
        if moved:
            log.info("engine %s dropped (%s): %d responses continue elsewhere", conn.id, why, len(moved))
        with contextlib.suppress(Exception):
            await conn.ws.close(code=code, message=why.encode("ascii", "replace")[:120])

    async def _watch_heartbeats(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.cfg.heartbeat_timeout_s / 4))
            now = self.clock()
            for conn in list(self.engines.values()):
                if now - conn.last_seen > self.cfg.heartbeat_timeout_s:
                    await self._drop(conn, "missed heartbeats")

    # ---- status ------------------------------------------------------------------------
    def workers_snapshot(self) -> list[dict]:
        out = []
        now = self.clock()
        for conn in [*self.engines.values(), *self.gone.values()]:
            held = self.book.assigned(conn.id)
            active = len(held)
            measured = conn.meter.rate(now, conn.busy_since) if active else 0.0
            out.append(
                {
                    "worker_id": conn.id,
                    "kind": conn.kind,
                    "engine": conn.engine,
                    "state": conn.state,
                    "version": conn.version,
                    "tokens_per_s": round(max(conn.tokens_per_s, measured), 1),
                    "tokens": conn.tokens,
                    "active": active,
                    # held responses that already have tokens: what a kill now would migrate
                    "partial": sum(1 for r in map(self.book.responses.get, held) if r is not None and r.generated > 0),
                }
            )
        return out
