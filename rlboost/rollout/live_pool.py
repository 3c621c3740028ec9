"""The live engines as the coordinator sees them: an EnginePool (rollout/pool.py) over the engines'
connections and the rollout book.

The coordinator (rollout/coordinator.py) decides; this pool measures each engine by the tokens it
streams (RateMeter), holds every token of the step (rollout/book.py), and carries decisions out as
messages: `generate` to the engines that take responses, `abort` to those that give them back. The
WebSocket side that feeds it (hello, token frames, finished, heartbeats) is rollout/live.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np
from aiohttp import web

from rlboost.contracts import protocol as P
from rlboost.contracts.perf import AcceleratorPerf, EngineModel, engine_model
from rlboost.contracts.speculation import AcceptanceMeter
from rlboost.rollout.book import Response, RolloutBook
from rlboost.rollout.policies.lengths import LengthStats
from rlboost.rollout.policies.views import EngineView, ReqView
from rlboost.rollout.pool import Drafting, EngineInfo, Held, ProgressInputs

log = logging.getLogger("rlboost.coordinator")

MAX_GONE = 1024  # departed engines kept for status


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
    # its welcome's resume key: only a hello presenting it may replace this connection (rollout/live.py)
    resume_key: str = ""


# siblings' tokens one generate frame carries at most (a few hundred kB of JSON)
SIBLING_TOKENS = 1 << 16


class LivePool:
    """The connected engines and the book of the step's responses (the coordinator's EnginePool)."""

    def __init__(
        self, book: RolloutBook, perf: dict[str, AcceleratorPerf], stats: LengthStats, clock: Callable[[], float]
    ) -> None:
        self.book = book
        self.perf = perf
        self.stats = stats  # the coordinator's: the expected rest of fresh requests
        self.clock = clock
        self.engines: dict[str, EngineConn] = {}
        self.gone: dict[str, EngineConn] = {}
        self.step: int | None = None  # the step in flight (the newest)
        self.steps: set[int] = set()  # every step generating (more than one: weights swap in flight)
        self.step_version: int | None = None  # and its weights version
        self.max_new_tokens = 0  # the step's response budget (a response's own is in the book)
        self.changed = asyncio.Event()  # something the step loop should look at happened
        self.dirty: set[str] = set()  # engines that may have free slots since the last dispatch
        self.full_dispatch = True  # look at every engine in the next dispatch round
        self.on_drop: Callable[[EngineConn, str], None] = lambda conn, why: None
        self.send_siblings = False  # rollout.speculative.method group: requests carry their siblings' tokens
        self.draft_max_tokens = 0  # rollout.speculative.max_tokens where the job speculates, else 0
        self.acceptance = AcceptanceMeter()  # the engines' reported drafts (drafting())

    # ---- messages --------------------------------------------------------------------------
    def post(self, conn: EngineConn, text: str) -> None:
        """Queue a message for the connection's writer (never blocks the caller)."""
        if conn.state == "gone":
            return
        if conn.outq.qsize() > 100_000:  # it reads nothing: treat it as dead
            self.on_drop(conn, "not reading its messages")
            return
        conn.outq.put_nowait(text)

    def abort(self, engine_id: str, rids: list[str]) -> None:
        conn = self.engines.get(engine_id)
        if conn is None or not rids:
            return
        conn.aborting.update(rids)
        for rid in rids:
            conn.dispatched_at.pop(rid, None)
        self.post(conn, P.Abort(rids=rids).model_dump_json())

    # ---- EnginePool: engines -------------------------------------------------------------------
    def n_remote(self) -> int:
        return sum(1 for c in self.engines.values() if c.kind != "reserved" and c.state in ("ready", "pulling"))

    def reserved(self) -> list[str]:
        return [c.id for c in self.engines.values() if c.kind == "reserved" and c.state != "gone"]

    def remote_ready(self) -> bool:
        return any(c.kind != "reserved" and c.state == "ready" for c in self.engines.values())

    def serving(self, engine: str) -> bool:
        c = self.engines.get(engine)
        return c is not None and c.state in ("ready", "pulling")

    def clear_offloaded(self) -> None:
        for c in self.engines.values():
            c.offloaded = False
        self.full_dispatch = True

    def queue_len(self) -> int:
        return len(self.book.queue)

    def model_of(self, conn: EngineConn) -> EngineModel | None:
        if conn.model is None and conn.accelerator and self.perf:
            with contextlib.suppress(KeyError, ValueError):
                conn.model = engine_model(conn.accelerator, self.perf, max(1, conn.capacity))
        return conn.model

    def accepting(self, c: EngineConn) -> bool:
        return c.state == "ready" and c.version == self.step_version and not c.offloaded

    def engine_views(self, now: float) -> list[EngineView]:
        """Every engine not gone, measured: its rate at the load it holds."""
        out = []
        for c in self.engines.values():
            if c.state == "gone":
                continue
            active = len(self.book.assigned(c.id))
            rate = c.meter.rate(now, c.busy_since, active) if active else 0.0
            out.append(EngineView(c.id, c.kind, c.capacity, active, rate, self.model_of(c), self.accepting(c)))
        return out

    def progress_inputs(self, now: float) -> ProgressInputs:
        views = self.engine_views(now)
        steps = self.steps
        unfinished = [
            r for r in self.book.responses.values() if r.version == self.step_version and not r.done and r.step in steps
        ]
        gen = self.book.lengths(unfinished)
        left = np.fromiter((r.max_new_tokens for r in unfinished), np.int64, len(unfinished)) - gen
        held = sum(r.generated for r in self.book.responses.values() if r.step in steps)
        reserved = {c.id for c in self.engines.values() if c.kind == "reserved"}
        ctx = sum(len(r.prompt) + int(g) for r, g in zip(unfinished, gen.tolist()) if r.engine in reserved)
        return ProgressInputs(
            remote=[e for e in views if e.remote and e.accepting],
            generated=gen,
            budget_left=left,
            held_tokens=float(held),
            reserved_context=float(ctx),
            reserved_rate=sum(e.tokens_per_s for e in views if e.kind == "reserved"),
        )

    def drafting(self) -> Drafting | None:
        """The engines' acceptance, from the drafted and accepted token counts they report with each
        batch's ends (count_drafts); None (the offload policy predicts plain decoding) where the job does
        not speculate or no engine has drafted yet (the vllm engine never does)."""
        if self.draft_max_tokens <= 0 or self.acceptance.drafted <= 0:
            return None
        return Drafting(self.acceptance.rate, self.draft_max_tokens)

    def count_drafts(self, drafted: int, accepted: int) -> None:
        if drafted > 0:  # a batch that drafted nothing says nothing about acceptance
            self.acceptance.update(drafted, accepted)

    # ---- EnginePool: dispatch --------------------------------------------------------------------
    def open_engines(self, now: float) -> list[EngineView]:
        # Only engines whose free slots may have changed since the last round (a `finished` frees
        # slots) need a look, unless something bigger happened (step start, requeues, new engines).
        if self.full_dispatch:
            cands = list(self.engines.values())
        else:
            cands = [c for eid in self.dirty if (c := self.engines.get(eid)) is not None]
        self.dirty.clear()
        self.full_dispatch = False
        views = []
        for c in cands:
            if self.accepting(c):
                active = len(self.book.assigned(c.id))
                if active < c.capacity:
                    rate = c.meter.rate(now, c.busy_since, active) if active else 0.0
                    views.append(EngineView(c.id, c.kind, c.capacity, active, rate, self.model_of(c), True))
        return views

    def queue_head(self, n: int) -> list[Response]:
        """The head of the queue, left in it (the book takes what is assigned)."""
        head: list[Response] = []
        v = self.step_version
        for rid in itertools.islice(self.book.queue, n * 2):
            r = self.book.responses.get(rid)
            if r is not None and not r.done and r.engine is None and r.version == v:
                head.append(r)
                if len(head) >= n:
                    break
        if not head:
            self.book.prune_queue()
        return head

    def fresh(self, items: Sequence[Response]) -> bool:
        return not any(r.generated for r in items)

    def req_views(self, items: Sequence[Response], now: float) -> list[ReqView]:
        if not items:
            return []
        if self.fresh(items):  # fresh requests are alike: one prediction for all, no per-request numpy
            budget = items[0].max_new_tokens
            exp = float(self.stats.expected_remaining([0], [budget])[0])
            return [ReqView(r.rid, 0, r.max_new_tokens, len(r.prompt), exp) for r in items]
        gen = self.book.lengths(items)
        left = np.fromiter((r.max_new_tokens for r in items), np.int64, len(items)) - gen
        exp = self.stats.expected_remaining(gen, left)
        return [
            ReqView(r.rid, int(g), int(b), len(r.prompt), float(x), r.engine)
            for r, g, b, x in zip(items, gen.tolist(), left.tolist(), exp.tolist())
        ]

    def groups(self, items: Sequence[Response | str] | np.ndarray) -> list[Hashable]:
        rs = self.book.responses
        out = []
        for x in items:
            r = x if isinstance(x, Response) else rs[str(x)]
            out.append(None if r.group is None else (r.step, r.group))  # the coordinator's keys (Coordinator.keyed)
        return out

    def avoid(self, items: Sequence[Response]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for c in self.engines.values():
            for rid in c.aborting:
                out.setdefault(rid, set()).add(c.id)
        return out

    def put_back(self, items: Sequence[Response]) -> None:
        pass  # never taken off the queue (queue_head)

    def item(self, rid: str) -> str:
        return rid

    def rids(self, items: np.ndarray) -> list[str]:
        return [str(r) for r in items.tolist()]

    def admit(self, plan: Sequence[tuple[Response | str, str]], now: float) -> None:
        v = self.step_version
        assert v is not None
        assigned = self.book.assign([(r if isinstance(r, str) else r.rid, eid) for r, eid in plan], v)
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
                        group=r.group,
                    )
                    for r in batch
                ],
                siblings=self.siblings_of(batch) if self.send_siblings else {},
            )
            self.post(conn, msg.model_dump_json())

    def siblings_of(self, batch: Sequence[Response]) -> dict[str, list[list[int]]]:
        """The tokens this coordinator holds of the batch's siblings (same step and group, not in the
        batch), per group, for the engine to draft from: finished ones first, then the longest, at most
        SIBLING_TOKENS in all, so a generate frame stays small."""
        groups = {(r.step, r.group) for r in batch if r.group is not None}
        if not groups:
            return {}
        sent = {r.rid for r in batch}
        sibs = [
            r for r in self.book.responses.values()
            if (r.step, r.group) in groups and r.rid not in sent and r.generated > 0
        ]
        sibs.sort(key=lambda r: (not r.done, -r.generated))
        out: dict[str, list[list[int]]] = {}
        budget = SIBLING_TOKENS
        for r in sibs:
            n = r.generated
            if n > budget:
                continue
            budget -= n
            out.setdefault(str(r.group), []).append(r.tokens)
        return out

    # ---- EnginePool: migration, offload, tail batching ----------------------------------------------
    def engine_infos(self, now: float) -> list[EngineInfo]:
        return [EngineInfo.of(v) for v in self.engine_views(now)]

    def held(self, engine: str, now: float, min_on_engine_s: float) -> Held | None:
        conn = self.engines[engine]
        rs = [self.book.responses[rid] for rid in self.book.assigned(engine)]
        da = conn.dispatched_at
        on_engine_s = np.fromiter((now - da.get(r.rid, now) for r in rs), np.float64, len(rs))
        settled = on_engine_s >= min_on_engine_s
        if not settled.any():
            return None
        rs = [r for r, ok in zip(rs, settled.tolist()) if ok]
        gen = self.book.lengths(rs)
        left = np.fromiter((r.max_new_tokens for r in rs), np.int64, len(rs)) - gen
        items = np.array([r.rid for r in rs], dtype=object)
        prompt_len = np.fromiter((len(r.prompt) for r in rs), np.int64, len(rs))
        return Held(items, on_engine_s[settled], gen, left, prompt_len)

    def take_back(self, moves: Sequence[tuple[str, str]], now: float) -> int:
        by_src: dict[str, list[str]] = {}
        for rid, src in moves:
            by_src.setdefault(src, []).append(rid)
        n = 0
        for src, rids in by_src.items():
            moved = self.book.requeue(src, rids)
            n += len(moved)
            self.abort(src, moved)
        self.full_dispatch = True
        self.changed.set()
        return n

    def hand_over(self, engines: Sequence[str], now: float) -> int:
        moved = 0
        for eid in engines:
            c = self.engines[eid]
            c.offloaded = True
            rids = sorted(self.book.assigned(c.id))
            moved += len(self.book.requeue(c.id, rids))
            self.abort(c.id, rids)
        self.full_dispatch = True
        self.changed.set()
        return moved

    def swap(self, version: int) -> int:
        """A new version reaches engines mid-step: each gives back what it holds (tokens kept) and every
        unfinished response of the generating steps continues on `version`; how many were on engines."""
        moved = 0
        for c in self.engines.values():
            rids = sorted(self.book.assigned(c.id))
            if rids:
                back = self.book.requeue(c.id, rids)
                moved += len(back)
                self.abort(c.id, back)
        self.book.retag(self.steps, version)
        self.full_dispatch = True
        self.changed.set()
        return moved

    def drop_unfinished(self, keep: set[Hashable], now: float) -> list[Hashable]:
        by_engine: dict[str, list[str]] = {}
        drop = []
        step = self.step
        for r in list(self.book.responses.values()):
            if r.step != step or (r.done and r.group in keep):
                continue
            if r.engine is not None:
                by_engine.setdefault(r.engine, []).append(r.rid)
            drop.append(r)
        for eid, rids in by_engine.items():
            self.book.requeue(eid, rids)
            self.abort(eid, rids)
        self.book.discard(r.rid for r in drop)
        return list({r.group for r in drop if r.group is not None} - keep)

    # ---- engines come and go ---------------------------------------------------------------------
    def released(self, conn: EngineConn) -> list[str]:
        """The engine leaves (drained, dropped): everything it held continues elsewhere."""
        moved = self.book.release(conn.id)
        self.full_dispatch = True
        self.changed.set()
        return moved

    def forget(self, conn: EngineConn) -> None:
        """A dropped connection: gone, kept a while for status."""
        if self.engines.get(conn.id) is conn:
            del self.engines[conn.id]
        conn.state = "gone"
        self.gone.pop(conn.id, None)
        self.gone[conn.id] = conn
        while len(self.gone) > MAX_GONE:  # bounded: hostile or churning ids must not grow status forever
            del self.gone[next(iter(self.gone))]
