"""The rollout coordinator: engines dial in, it dispatches a step's requests and holds every token.

One WebSocket per engine (spot workers and the trainer's own reserved engine alike). Dispatch only
goes to engines that hold the step's weight version; a response whose engine drains, breaks its
stream or misses heartbeats continues on another engine from prompt + partial tokens
(rlboost/rollout/book.py does the bookkeeping).

The decisions are made by pure policies (rlboost/rollout/policies/), the same functions the simulator runs:
dispatch (which engine gets which request), tail migration, and adaptive offload of the reserved
engine. This module only measures (per-engine token rates, finished lengths), builds the views the
policies read, and turns their answers into messages.

Token frames are binary columns (rlboost/contracts/token_frames.py) ingested with a few numpy operations per
frame; JSON `tokens` frames are still accepted. Everything else is JSON, validated with size caps.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from aiohttp import WSMsgType, web
from pydantic import ValidationError

from rlboost.contracts import protocol as P
from rlboost.contracts import token_frames
from rlboost.contracts.perf import AcceleratorPerf, EngineModel, engine_model
from rlboost.contracts.sampling import request_seed
from rlboost.rollout.book import ProtocolViolation, Response, RolloutBook
from rlboost.rollout.policies.dispatch import plan_dispatch
from rlboost.rollout.policies.lengths import LengthStats
from rlboost.rollout.policies.migration import MigrationConfig, plan_migrations
from rlboost.rollout.policies.offload import (
    NoOffload,
    OffloadPolicy,
    StepOutcome,
    StepProgress,
    offload_tick,
    step_progress,
)
from rlboost.rollout.policies.tick import TickCadence
from rlboost.rollout.policies.views import EngineView, ReqView

log = logging.getLogger("rlboost.coordinator")


class RateMeter:
    """The coordinator's own measurement of an engine: tokens per *sequence-second* over a sliding
    window (tokens / integral of the number of sequences it held), so a batch that grows or shrinks
    does not read as a faster or slower engine. `rate()` is that times the sequences held now."""

    def __init__(self, window_s: float = 3.0) -> None:
        self.window_s = window_s
        self.events: deque[tuple[float, int, float]] = deque()  # (t, tokens, sequence-seconds)
        self.tokens = 0
        self.seq_s = 0.0
        self.last_t: float | None = None
        self.last_active = 0

    def add(self, now: float, n: int, active: int | None = None) -> None:
        seq_s = 0.0
        if self.last_t is not None:
            seq_s = self.last_active * max(0.0, now - self.last_t)
        self.last_t = now
        if active is not None:
            self.last_active = active
        self.events.append((now, n, seq_s))
        self.tokens += n
        self.seq_s += seq_s

    def per_seq(self, now: float, since: float) -> float:
        """Tokens/s of one sequence, from tokens after `since` (when the engine last went busy)."""
        while self.events and (now - self.events[0][0] > self.window_s or self.events[0][0] < since):
            _, n, q = self.events.popleft()
            self.tokens -= n
            self.seq_s -= q
        return self.tokens / self.seq_s if self.seq_s > 0.5 else 0.0

    def rate(self, now: float, since: float, active: int | None = None) -> float:
        """Aggregate tokens/s at `active` sequences (default: as many as it holds now)."""
        return self.per_seq(now, since) * (self.last_active if active is None else active)


@dataclass
class EngineConn:
    id: str
    kind: str
    engine: str
    capacity: int
    ws: web.WebSocketResponse
    state: str = "pulling"  # pulling | ready | draining | gone
    version: int | None = None
    last_seen: float = field(default_factory=time.monotonic)
    tokens: int = 0
    tokens_per_s: float = 0.0  # as the worker reports it (heartbeat)
    connected_at: float = field(default_factory=time.monotonic)
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    accelerator: str | None = None
    cuda: bool = False  # its engine runs on a GPU (hello)
    cloud: str | None = None  # where it runs, as it says in hello
    region: str | None = None
    model: EngineModel | None = None
    meter: RateMeter = field(default_factory=RateMeter)
    busy_since: float = 0.0  # when it last went from idle to busy (rate window start)
    offloaded: bool = False  # the reserved engine handed its work over for the rest of the step
    dispatched_at: dict[str, float] = field(default_factory=dict)
    # rids this engine was told to abort and has not confirmed yet (`finished`): never send them back
    # to it before, or two copies of one request could run there
    aborting: set[str] = field(default_factory=set)
    # outgoing messages, written by one task per connection: a slow reader delays only itself
    outq: asyncio.Queue = field(default_factory=asyncio.Queue)
    writer: asyncio.Task | None = None


MAX_GONE = 1024  # departed engines kept for status


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
    # ---- scheduling (rlboost/rollout/policies) ----
    dispatch_mode: str = "rate"  # rate | spread
    migration: MigrationConfig | None = field(default_factory=MigrationConfig)
    max_new_tokens: int = 0  # the response budget (for length statistics); 0: learn from requests
    perf: dict[str, AcceleratorPerf] = field(default_factory=dict)  # priors per accelerator
    tick: TickCadence = field(default_factory=TickCadence)  # when offload and migration are reconsidered
    binary_tokens: bool = True  # ask workers for binary token frames
    flush_s: float = 0.02  # how often workers send tokens


@dataclass
class StepMarks:
    step: int
    t0: float
    n_remote: int
    box_planned: float | None
    offload_at: float | None = None
    gen_end: float | None = None
    next_offload_check: float = 0.0  # the offload policy said no until then
    ticks: int = 0
    changed: bool = False  # a slot freed up or an engine joined since the last migration round


class Coordinator:
    def __init__(
        self, cfg: CoordinatorConfig, offload: OffloadPolicy | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.book = RolloutBook(cfg.eos_id)
        self.engines: dict[str, EngineConn] = {}
        self.gone: dict[str, EngineConn] = {}
        self.version = -1  # latest published version
        self.step_version: int | None = None  # version of the step in flight
        self.offload: OffloadPolicy = offload or NoOffload()
        self.lengths = LengthStats(max(1, cfg.max_new_tokens or 1))
        self.marks: StepMarks | None = None
        self.step_log: list[dict] = []
        self.offloaded = asyncio.Event()  # set when the reserved engine handed over this step
        self.groups_done: deque[str] = deque()  # completed groups, in completion order
        self.group_tokens: dict[str, int] = {}  # tokens of each group's finished responses
        self.completed_groups: list[str] = []  # this step's complete groups (groups_done is consumed)
        self.group_ready = asyncio.Event()
        self._group_left: dict[str, int] = {}
        self._group_of: dict[str, str] = {}
        self._changed = asyncio.Event()
        self._dirty: set[str] = set()  # engines that may have free slots since the last dispatch
        self._full_dispatch = True  # look at every engine in the next dispatch round
        self._monitor: asyncio.Task | None = None
        self._on_response: Callable[[Response], None] | None = None
        self.tokens_total = 0
        self.tokens_spot = 0  # generated by spot (non-reserved) engines; cost-report splits spend by it
        self._tokens_at_step_end = (0, 0)  # (tokens_total, tokens_spot) when the last step ended
        self.responses_total = 0
        self.rejected_frames = 0
        self.frames_total = 0
        self.tail_migrations = 0
        self.offloads = 0
        self.discarded = 0

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
        plain = P.NewVersion(version=version).model_dump_json()
        for conn in self.receivers():
            conn.state = "pulling"
            offer = (offers or {}).get(conn.id)
            self._post(conn, plain if offer is None else P.NewVersion(version=version, offer=offer).model_dump_json())

    # ---- a step ------------------------------------------------------------------------
    async def run_step(
        self,
        step: int,
        version: int,
        requests: list[RolloutRequest],
        *,
        need_groups: int | None = None,
        on_response: Callable[[Response], None] | None = None,
    ) -> list[Response]:
        """Generate all requests with weights `version`; returns when every response is complete.

        need_groups (tail batching): return as soon as that many groups are complete; the other
        responses are aborted and dropped (see `self.unfinished_groups`)."""
        self.step_version = version
        self._on_response = on_response
        self.offloaded.clear()
        self.groups_done.clear()
        self.group_tokens.clear()
        self.completed_groups = []
        self.unfinished_groups: list[str] = []
        if not self.cfg.max_new_tokens and requests:
            self.lengths.budget = max(r.max_new_tokens for r in requests)
        self._group_left.clear()
        self._group_of.clear()
        for r in requests:
            if r.group is not None:
                self._group_of[r.rid] = r.group
                self._group_left[r.group] = self._group_left.get(r.group, 0) + 1
        n_remote = sum(1 for c in self.engines.values() if c.kind != "reserved" and c.state in ("ready", "pulling"))
        now = self.clock()
        self.marks = StepMarks(step, now, n_remote, self.offload.start_step(n_remote))
        self.book.add(
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
        next_tick = now
        t_start = now
        self._full_dispatch = True
        try:
            while self.book.outstanding(step):
                self._drain_completed()
                if need_groups is not None and len(self.completed_groups) >= need_groups:
                    await self._abandon_rest(step)
                    break
                await self._dispatch()
                now = self.clock()
                if now >= next_tick:
                    next_tick = now + self.tick_period(now - t_start)
                    await self._tick(now)
                self._changed.clear()
                if not self.book.outstanding(step):
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=self.cfg.tick.tick_s)
                await asyncio.sleep(0.002)  # coalesce a burst of events into one round
            self._drain_completed()
        finally:
            self.step_version = None
            for conn in self.engines.values():
                conn.offloaded = False
        self.marks.gen_end = self.clock()
        done = self.book.collect(step)
        self.responses_total += len(done)
        return done

    def tick_period(self, elapsed: float = 0.0) -> float:
        last = self.step_log[-1]["step_s"] if self.step_log else 0.0
        return self.cfg.tick.period(last, elapsed)

    def end_step(self, train_busy_s: float = 0.0, train_tokens: int = 0, busy_during_tail_s: float = 0.0) -> dict:
        """The trainer finished the step (trained and published): let the offload policy learn."""
        m = self.marks
        if m is None or m.gen_end is None:
            return {}
        now = self.clock()
        outcome = StepOutcome.from_marks(
            m.n_remote, m.t0, now, m.gen_end, m.offload_at, busy_during_tail_s, train_tokens, train_busy_s
        )
        self.offload.end_step(outcome)
        rec = {
            "step": m.step,
            "n_remote": m.n_remote,
            "step_s": round(outcome.step_s, 3),
            "gen_s": round(outcome.gen_s, 3),
            "box_s": None if outcome.box_s is None else round(outcome.box_s, 3),
            "trainer_idle_s": round(outcome.trainer_idle_s, 3),
            "remote_idle_s": round(outcome.remote_idle_s, 3),
            # since the last step ended: what every engine generated, and the spot workers' part
            "gen_tokens": self.tokens_total - self._tokens_at_step_end[0],
            "spot_tokens": self.tokens_spot - self._tokens_at_step_end[1],
        }
        self._tokens_at_step_end = (self.tokens_total, self.tokens_spot)
        self.step_log.append(rec)
        self.marks = None
        return rec

    def _drain_completed(self) -> None:
        done = self.book.drain_completed()
        if not done:
            return
        self.lengths.add(r.generated for r in done)
        for r in done:
            g = self._group_of.get(r.rid)
            if g is not None:
                self.group_tokens[g] = self.group_tokens.get(g, 0) + r.generated
                self._group_left[g] -= 1
                if self._group_left[g] == 0:
                    self.completed_groups.append(g)
                    self.groups_done.append(g)
                    self.group_ready.set()
            if self._on_response is not None:
                self._on_response(r)

    async def _abandon_rest(self, step: int) -> None:
        """Tail batching: the round has its groups; abort and drop everything else of the step."""
        kept = set(self.completed_groups)
        by_engine: dict[str, list[str]] = {}
        drop = []
        for r in list(self.book.responses.values()):
            if r.step != step or (r.done and self._group_of.get(r.rid) in kept):
                continue
            if r.engine is not None:
                by_engine.setdefault(r.engine, []).append(r.rid)
            drop.append(r.rid)
        for eid, rids in by_engine.items():
            self.book.requeue(eid, rids)
            await self._abort(eid, rids)
        self.unfinished_groups = sorted({self._group_of[rid] for rid in drop if rid in self._group_of} - kept)
        self.discarded += len(drop)
        self.book.discard(drop)

    # ---- policies ----------------------------------------------------------------------
    def _model_of(self, conn: EngineConn) -> EngineModel | None:
        if conn.model is None and conn.accelerator and self.cfg.perf:
            with contextlib.suppress(KeyError, ValueError):
                conn.model = engine_model(conn.accelerator, self.cfg.perf, max(1, conn.capacity))
        return conn.model

    def _engine_views(self, now: float) -> list[EngineView]:
        v = self.step_version
        out = []
        for c in self.engines.values():
            if c.state == "gone":
                continue
            active = len(self.book.assigned(c.id))
            out.append(
                EngineView(
                    id=c.id,
                    kind=c.kind,
                    capacity=c.capacity,
                    active=active,
                    tokens_per_s=c.meter.rate(now, c.busy_since, active) if active else 0.0,
                    model=self._model_of(c),
                    accepting=c.state == "ready" and c.version == v and not c.offloaded,
                )
            )
        return out

    def _req_views(
        self, rs: list[Response], now: float, dispatched_at: dict[str, float] | None = None
    ) -> list[ReqView]:
        if not rs:
            return []
        gen = self.book.lengths(rs)
        left = np.fromiter((r.max_new_tokens for r in rs), np.int64, len(rs)) - gen
        exp = self.lengths.expected_remaining(gen, left)
        da = dispatched_at or {}
        return [
            ReqView(r.rid, int(g), int(b), len(r.prompt), float(x), r.engine, now - da.get(r.rid, now))
            for r, g, b, x in zip(rs, gen.tolist(), left.tolist(), exp.tolist())
        ]

    async def _dispatch(self) -> None:
        v = self.step_version
        if v is None or not self.book.queue:
            self._dirty.clear()
            return
        now = self.clock()
        # Only engines whose free slots may have changed since the last round (a `finished` frees
        # slots) need a look, unless something bigger happened (step start, requeues, new engines).
        if self._full_dispatch:
            cands = list(self.engines.values())
        else:
            cands = [c for eid in self._dirty if (c := self.engines.get(eid)) is not None]
        self._dirty.clear()
        self._full_dispatch = False
        views = []
        for c in cands:
            if c.state == "ready" and c.version == v and not c.offloaded:
                active = len(self.book.assigned(c.id))
                if active < c.capacity:
                    rate = c.meter.rate(now, c.busy_since, active) if active else 0.0
                    views.append(EngineView(c.id, c.kind, c.capacity, active, rate, self._model_of(c), True))
        total_free = sum(e.free for e in views)
        if total_free <= 0:
            return
        head: list[Response] = []
        for rid in itertools.islice(self.book.queue, total_free * 2):
            r = self.book.responses.get(rid)
            if r is not None and not r.done and r.engine is None and r.version == v:
                head.append(r)
                if len(head) >= total_free:
                    break
        if not head:
            self.book.prune_queue()
            return
        if any(r.generated for r in head):
            reqs = self._req_views(head, now)
        else:  # fresh requests are alike: one prediction for all, no per-request numpy
            budget = head[0].max_new_tokens
            exp = float(self.lengths.expected_remaining([0], [budget])[0])
            reqs = [ReqView(r.rid, 0, r.max_new_tokens, len(r.prompt), exp) for r in head]
        avoid: dict[str, set[str]] = {}
        for c in self.engines.values():
            for rid in c.aborting:
                avoid.setdefault(rid, set()).add(c.id)
        plan = plan_dispatch(reqs, views, self.cfg.dispatch_mode, avoid=avoid)
        if not plan:
            return
        by_engine: dict[str, list[str]] = {}
        for rid, eid in plan:
            by_engine.setdefault(eid, []).append(rid)
        assigned = self.book.assign(plan, v)
        for eid, batch in assigned.items():
            conn = self.engines.get(eid)
            if conn is None:
                continue
            if not self.book.assigned(eid) - {r.rid for r in batch}:
                conn.busy_since = now  # it was idle: its rate window starts now
            for r in batch:
                conn.dispatched_at[r.rid] = now
            msg = P.Generate(
                requests=[
                    P.GenSpec(
                        rid=r.rid,
                        prompt=r.prompt,
                        prefix=r.tokens if r.generated else [],
                        max_new_tokens=r.remaining,
                        seed=r.seed,
                        version=r.version,
                        handle=r.handle,
                    )
                    for r in batch
                ]
            )
            self._post(conn, msg.model_dump_json())

    async def _tick(self, now: float) -> None:
        """Offload and tail migration, decided by the policies from fresh measurements."""
        m = self.marks
        if m is None:
            return
        reserved = [c for c in self.engines.values() if c.kind == "reserved" and c.state != "gone"]
        d = offload_tick(
            self.offload,
            now,
            offload_at=m.offload_at,
            next_check=m.next_offload_check,
            has_reserved=bool(reserved),
            remote_ready=any(c.kind != "reserved" and c.state == "ready" for c in self.engines.values()),
            progress=lambda: self.progress(now),
        )
        m.next_offload_check = d.next_check
        if d.action == "offload":
            await self._offload(now, m, reserved)
        elif d.action == "resume":
            # every remote engine is gone: the trainer's engine generates again rather than stall
            for c in self.engines.values():
                c.offloaded = False
            self._full_dispatch = True
        m.ticks += 1
        if self.cfg.migration is not None and self.cfg.tick.migrate_now(
            queue_empty=not self.book.queue, changed=m.changed, tick=m.ticks
        ):
            m.changed = False
            await self._migrate(now)

    def progress(self, now: float) -> StepProgress:
        """What the offload policy sees: measured remote rates and expected remaining tokens."""
        v = self.step_version
        m = self.marks
        views = self._engine_views(now)
        unfinished = [
            r for r in self.book.responses.values() if r.version == v and not r.done and m and r.step == m.step
        ]
        gen = self.book.lengths(unfinished)
        left = np.fromiter((r.max_new_tokens for r in unfinished), np.int64, len(unfinished)) - gen
        held = sum(r.generated for r in self.book.responses.values() if m and r.step == m.step)
        reserved = {c.id for c in self.engines.values() if c.kind == "reserved"}
        ctx = sum(len(r.prompt) + int(g) for r, g in zip(unfinished, gen.tolist()) if r.engine in reserved)
        return step_progress(
            elapsed=now - (m.t0 if m else now),
            remote=[e for e in views if e.remote and e.accepting],
            generated=gen,
            budget_left=left,
            held_tokens=float(held),
            reserved_context=float(ctx),
            reserved_rate=sum(e.tokens_per_s for e in views if e.kind == "reserved"),
            stats=self.lengths,
        )

    async def _offload(self, now: float, m: StepMarks, reserved: list[EngineConn]) -> None:
        """The policy said so (offload_tick): the reserved engines hand their partial responses over."""
        m.offload_at = now
        self.offloads += 1
        moved = 0
        for c in reserved:
            c.offloaded = True
            rids = sorted(self.book.assigned(c.id))
            moved += len(self.book.requeue(c.id, rids))
            await self._abort(c.id, rids)
        log.info(  # users count steps from 1 (the trainer's log says "step 1/N" for index 0)
            "step %d: offload after %.2fs, %d partial responses continue on remote engines",
            m.step + 1, now - m.t0, moved,
        )
        self._full_dispatch = True
        self.offloaded.set()
        self._changed.set()

    async def _migrate(self, now: float) -> None:
        views = self._engine_views(now)
        if not any(e.accepting and e.free > 0 for e in views):
            return
        best = min((e.seq_time(e.active + 1) for e in views if e.accepting and e.free > 0), default=None)
        cfg = self.cfg.migration
        assert cfg is not None
        running: dict[str, list[ReqView]] = {}
        for e in views:
            if e.active == 0 or best is None or e.seq_time(e.active) <= best * (1 + cfg.min_gain_frac):
                continue
            conn = self.engines[e.id]
            rs = [self.book.responses[rid] for rid in self.book.assigned(e.id)]
            running[e.id] = self._req_views(rs, now, conn.dispatched_at)
        if not running:
            return
        moves = plan_migrations(views, running, len(self.book.queue), cfg)
        if not moves:
            return
        by_src: dict[str, list[str]] = {}
        for rid, src in moves:
            by_src.setdefault(src, []).append(rid)
        for src, rids in by_src.items():
            moved = self.book.requeue(src, rids)
            self.tail_migrations += len(moved)
            await self._abort(src, moved)
        self._full_dispatch = True
        self._changed.set()

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
            if old is not None:  # a reconnect replaces the stale connection
                await self._drop(old, "replaced by a new connection")
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
            self.engines[conn.id] = conn
            self.gone.pop(conn.id, None)
            await self._send(conn, self._welcome(conn.id))
            conn.writer = asyncio.get_running_loop().create_task(self._writer(conn))
            log.info("engine %s (%s, %s) connected", conn.id, conn.kind, conn.engine)
            async for frame in ws:
                if frame.type == WSMsgType.BINARY:
                    try:
                        cols = token_frames.decode(frame.data)
                    except token_frames.FrameError as e:
                        self.rejected_frames += 1
                        await self._drop(conn, f"malformed token frame ({e})")
                        break
                    conn.last_seen = self.clock()
                    self._on_tokens(conn, cols)
                elif frame.type == WSMsgType.TEXT:
                    msg = self._parse(frame)
                    if msg is None:
                        self.rejected_frames += 1
                        await self._drop(conn, "malformed frame")
                        break
                    conn.last_seen = self.clock()
                    await self._on_message(conn, msg)
                else:
                    break  # close, error
        except (asyncio.TimeoutError, ConnectionError):
            pass
        except ProtocolViolation as e:
            log.warning("engine %s: protocol violation: %s", conn.id if conn else "?", e)
            self.rejected_frames += 1
        finally:
            if conn is not None and self.engines.get(conn.id) is conn:
                await self._drop(conn, "connection closed")
            if conn is not None and conn.writer is not None:
                conn.writer.cancel()
        return ws

    def _welcome(self, worker_id: str) -> P.Welcome:
        c = self.cfg
        return P.Welcome(
            worker_id=worker_id,
            version=self.version,
            weights_url=c.weights_url,
            chunk_tokens=c.chunk_tokens,
            heartbeat_s=c.heartbeat_s,
            seed=c.job_seed,
            temperature=c.temperature,
            model=c.model,
            engine_dtype=c.engine_dtype,
            engine_batch=c.engine_batch,
            binary_tokens=c.binary_tokens,
            flush_s=c.flush_s,
        )

    @staticmethod
    def _parse(frame) -> P.Hello | P.Ready | P.Tokens | P.Finished | P.Draining | P.Heartbeat | None:
        if frame.type != WSMsgType.TEXT:
            return None
        try:
            return P.worker_msg.validate_json(frame.data)
        except ValidationError:
            return None

    def _on_tokens(self, conn: EngineConn, cols: token_frames.TokenColumns) -> None:
        n = self.book.accept_columns(conn.id, cols.version, cols.handles, cols.offsets, cols.counts, cols.ids, cols.lps)
        self.frames_total += 1
        if n:
            self._count_tokens(conn, n)

    def _count_tokens(self, conn: EngineConn, n: int) -> None:
        conn.tokens += n
        self.tokens_total += n
        if conn.kind != "reserved":
            self.tokens_spot += n
        conn.meter.add(self.clock(), n, len(self.book.assigned(conn.id)))

    async def _on_message(self, conn: EngineConn, msg) -> None:
        if isinstance(msg, P.Tokens):
            n = self.book.accept_chunks(conn.id, [(c.rid, c.offset, c.ids, c.logprobs, c.version) for c in msg.chunks])
            self.frames_total += 1
            if n:
                self._count_tokens(conn, n)
        elif isinstance(msg, P.Finished):
            if not len(msg.rids) == len(msg.reasons) == len(msg.lengths):
                raise ProtocolViolation("finished: rids, reasons and lengths differ in length")
            for rid, reason, length in zip(msg.rids, msg.reasons, msg.lengths):
                self.book.finish(conn.id, rid, reason, length)
                conn.dispatched_at.pop(rid, None)
                if rid in conn.aborting:
                    conn.aborting.discard(rid)
                    self._full_dispatch = True  # it may go to this engine again, or was held back
            if any(why == "aborted" for why in msg.reasons):
                self._full_dispatch = True  # requeued work
            self._dirty.add(conn.id)
            self._slots_changed()
        elif isinstance(msg, P.Ready):
            if msg.capacity is not None:
                conn.capacity = msg.capacity
                conn.model = None
            if msg.version == self.version:
                conn.version = msg.version
                if conn.state != "draining":
                    conn.state = "ready"
                self._full_dispatch = True
                if self.marks is not None:
                    self.marks.next_offload_check = 0.0  # the remote pool changed
                self._slots_changed()
        elif isinstance(msg, P.Heartbeat):
            conn.tokens_per_s = msg.tokens_per_s
        elif isinstance(msg, P.Draining):
            conn.state = "draining"
            moved = self.book.release(conn.id)
            log.info("engine %s draining (%s): %d responses continue elsewhere", conn.id, msg.reason, len(moved))
            self._full_dispatch = True
            self._changed.set()
        elif isinstance(msg, P.Hello):
            raise ProtocolViolation("second hello on one connection")

    def _slots_changed(self) -> None:
        """Slots freed up or an engine joined: the next tick reconsiders migration (TickCadence)."""
        if self.marks is not None:
            self.marks.changed = True
        self._changed.set()

    async def _abort(self, engine_id: str, rids: list[str]) -> None:
        conn = self.engines.get(engine_id)
        if conn is None or not rids:
            return
        conn.aborting.update(rids)
        for rid in rids:
            conn.dispatched_at.pop(rid, None)
        self._post(conn, P.Abort(rids=rids).model_dump_json())

    def _post(self, conn: EngineConn, text: str) -> None:
        """Queue a message for the connection's writer (never blocks the caller)."""
        if conn.state == "gone":
            return
        if conn.outq.qsize() > 100_000:  # it reads nothing: treat it as dead
            asyncio.get_running_loop().create_task(self._drop(conn, "not reading its messages"))
            return
        conn.outq.put_nowait(text)

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

    async def _drop(self, conn: EngineConn, why: str) -> None:
        if self.engines.get(conn.id) is conn:
            del self.engines[conn.id]
        conn.state = "gone"
        self.gone.pop(conn.id, None)
        self.gone[conn.id] = conn
        while len(self.gone) > MAX_GONE:  # bounded: hostile or churning ids must not grow status forever
            del self.gone[next(iter(self.gone))]
        moved = self.book.release(conn.id)
        self._full_dispatch = True
        if moved:
            log.info("engine %s dropped (%s): %d responses continue elsewhere", conn.id, why, len(moved))
        with contextlib.suppress(Exception):
            await conn.ws.close()
        self._changed.set()

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
