"""The engines of a replay as the coordinator sees them: an EnginePool (rlboost/rollout/pool.py) over
modelled engines on the virtual clock, driving the live Coordinator (rlboost/rollout/coordinator.py).

Everything a step decides - dispatch, ticks (offload, migration), tail batching - is the live
coordinator's, called here from the replay's events as the live engine hub calls it from engines'
messages. This module only models what the engines do: they join and load weights, take responses,
decode them (one event per engine: its next response's end, simulator/engines.py), give them back
(offload, migration, losses) with the tokens they hold, and measure themselves by their performance
model, where a live engine is measured by the tokens it streams.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from rlboost.contracts.perf import SYNC_COSTS
from rlboost.contracts.spec import JobSpec
from rlboost.rollout.coordinator import Coordinator
from rlboost.rollout.policies.views import EngineView, ReqView
from rlboost.rollout.pool import Drafting, EngineInfo, Held, ProgressInputs
from rlboost.simulator.cores import CoreShare
from rlboost.simulator.engines import Fleet, MemoView, ModelledEngine
from rlboost.simulator.events import INF, EventQueue
from rlboost.simulator.presets import SimPolicy
from rlboost.simulator.speculation import Speculation, acceptance_model
from rlboost.simulator.step_state import StepState

_any = np.logical_or.reduce  # ndarray.any() without its Python-level wrapper (small arrays, often)


@dataclass
class StepHooks:
    """What the engines tell the trainer's side of the replay (the live trainer's step results)."""

    generation_done: Callable[[StepState], None]  # the step's last response is in
    abandoned: Callable[[StepState, list[int]], None]  # tail batching dropped these groups' responses


class ModelledPool:
    def __init__(self, spec: JobSpec, policy: SimPolicy, q: EventQueue, fleet: Fleet, cores: CoreShare) -> None:
        self.spec, self.policy, self.q, self.fleet, self.cores = spec, policy, q, fleet, cores
        self.sim = spec.simulate
        self.max_new = spec.algorithm.max_new_tokens
        self.coord: Coordinator  # set by the replay: the coordinator this pool serves
        self.hooks: StepHooks  # set by the replay once the trainer's side exists
        # the engines' window: the generating step's responses (where weights swap in flight, those of
        # the steps generating at once, StepState.joined), and each step's first index in it
        self.step: StepState | None = None
        self.parts: list[tuple[int, StepState]] = []
        self.swap_in_flight = False  # set by the replay: a new version interrupts the responses in flight
        self.swaps = 0  # responses interrupted by a weight swap and continued on the new version
        self._tick_token = 0
        self.version = -1  # the version the generating step's engines must hold to take its work
        self.published = -1  # the newest version the trainer published (ahead of `version` only while a
        # step generates on older weights: algorithm.max_staleness)
        self.migrations = 0  # partial responses continued elsewhere (preemption, offload, tail)
        self.restarted_tokens = 0  # tokens thrown away (restart policy, tail batching)
        self._pnow_key: tuple | None = None
        self._pnow = np.zeros(0)
        sp = spec.rollout.speculative
        # speculative decoding where the job asks for it and the policy models it (`sync`: veRL's default)
        self.speculation = (
            Speculation(sp.method, sp.max_tokens, lambda: self.step, acceptance=acceptance_model(self.sim))
            if policy.speculate and sp.method != "none"
            else None
        )
        if self.speculation is not None:
            fleet.spec = self.speculation.seconds_per_token
        cores.reschedule = self.schedule
        q.on("ready", self.on_ready)
        q.on("tick", self.on_tick)
        q.on("engine", self.on_engine)

    def _gen_ended(self) -> bool:
        return not self.coord.generating()

    def _owner(self, i: int) -> StepState:
        """The step a response of the window belongs to."""
        parts = self.parts
        if len(parts) == 1:
            return parts[0][1]
        for lo, o in reversed(parts):
            if i >= lo:
                return o
        raise AssertionError(f"response {i} is in no step of the window")

    def _report_done(self) -> None:
        """Steps whose last response is in: the trainer hears it (once)."""
        for _, o in list(self.parts):
            m = self.coord.marks_of(o.number)
            if o.open == 0 and m is not None and m.gen_end is None:
                self.hooks.generation_done(o)

    # ---- engines join and load weights ----------------------------------------------------
    def connect(self, e: ModelledEngine) -> None:
        """The engine dialled in: it pulls the current version."""
        if e.state != "gone":
            self.pull(e)

    def pull(self, e: ModelledEngine) -> None:
        e.state = "pulling"
        pull = self.sim.reserved_pull_s if e.kind == "reserved" else self.sim.pull_s
        if self.policy.sync and e.kind == "reserved":  # weights resharded into the engine, KV cache rebuilt
            pull = max(pull, SYNC_COSTS.weight_sync_s + SYNC_COSTS.wake_s)
        self.q.push(self.q.now + pull, "ready", (e.idx, self.version))

    def on_ready(self, payload: tuple[int, int]) -> None:
        idx, v = payload
        e = self.fleet.engines[idx]
        if e.state != "pulling" or v != self.version:
            return
        e.state, e.version = "ready", v
        if self.step is not None:
            self.coord.pool_changed(self.q.now)
        self.coord.dispatch(self.q.now)

    def publish(self) -> None:
        """The trainer published the next version: every engine serving or pulling pulls it, unless a
        step generates (algorithm.max_staleness): its engines keep their weights to its end, and the
        next step's begin_step has them pull (rollout/policies/staleness.py)."""
        self.published += 1
        if self.step is not None and not self._gen_ended():
            if self.swap_in_flight:
                self._swap()
            return
        self._take_published()

    def _swap(self) -> None:
        """In-flight weight update (AReaL's interruptible rollout): every engine gives back what it holds,
        tokens kept, pulls the new version and takes them up again, its KV cache recomputed (a prefill);
        each response's tokens then come from more than one version."""
        s = self.step
        assert s is not None
        self.version = self.published
        for e in self.fleet.engines:
            if e.state in ("ready", "pulling"):
                for i in sorted(e.live):
                    self.requeue(s, i, count=False)
                    self.swaps += 1
                e.live.clear()
                e.set_load()
                e.epoch += 1
                self.pull(e)
        self._report_done()

    def _take_published(self) -> None:
        self.step = None
        self.version = self.published
        for e in self.fleet.engines:
            e.offloaded = False
            if e.state in ("ready", "pulling"):
                self.pull(e)

    # ---- a step -----------------------------------------------------------------------------
    def begin_step(self, s: StepState, *, need_groups: int | None, share: dict[str, int] | None) -> None:
        """The trainer handed over the step's requests (queued in s.queue): the coordinator starts it."""
        w = self.step
        if self.swap_in_flight and w is not None and w.open > 0:  # beside the steps still generating
            assert need_groups is None and share is None, "tail batching and split never swap in flight"
            lo = len(w.length)
            s.gbase = lo // s.group_size
            groups = dict.fromkeys(range(s.gbase, s.gbase + s.groups), s.group_size)
            self.coord.begin_step(s.number, self.q.now, groups, overlapping=True)
            self.step = w.joined(s)
            self.parts = [(a, o) for a, o in self.parts if o.open > 0] + [(lo, s)]
        else:
            if self.version < self.published:  # a version published while the last step generated
                self._take_published()
            groups = dict.fromkeys(range(s.groups), s.group_size)
            self.coord.begin_step(s.number, self.q.now, groups, need_groups=need_groups, share=share)
            for e in self.fleet.engines:  # indices are per step: nothing of the previous step may stay live
                assert not e.live, f"engine {e.id} still holds {sorted(e.live)[:5]} at step {s.number}"
                e.heap.clear()
            self.step = s
            self.parts = [(0, s)]
        self._tick_token += 1
        self.q.push(self.q.now, "tick", self._tick_token)
        self.coord.dispatch(self.q.now)

    def on_tick(self, token: int) -> None:
        if self.step is None or token != self._tick_token or self._gen_ended():
            return
        now = self.q.now
        period = self.coord.tick(now)
        self.coord.dispatch(now)
        self.q.push(now + period, "tick", token)

    # ---- EnginePool: engines ------------------------------------------------------------------
    def n_remote(self) -> int:
        return sum(1 for e in self.fleet.alive if e.kind != "reserved" and e.state in ("ready", "pulling"))

    def reserved(self) -> list[str]:
        return [e.id for e in self.fleet.alive if e.kind == "reserved"]

    def remote_ready(self) -> bool:
        return any(e.kind != "reserved" and e.state == "ready" for e in self.fleet.alive)

    def serving(self, engine: str) -> bool:
        return self.fleet.by_id[engine].state in ("ready", "pulling")

    def clear_offloaded(self) -> None:
        for e in self.fleet.engines:
            e.offloaded = False

    def queue_len(self) -> int:
        s = self.step
        return len(s.queue) if s is not None else 0

    # ---- EnginePool: dispatch -------------------------------------------------------------------
    def accepting(self, e: ModelledEngine) -> bool:
        return e.state == "ready" and e.version == self.version and not e.offloaded and not (e.static and e.live)

    def open_engines(self, now: float) -> list[EngineView]:
        v = self.version  # self.accepting(e), inlined: this scan runs on every refill
        out = []
        for e in self.fleet.alive:
            n = len(e.live)
            if e.state == "ready" and e.version == v and not e.offloaded and n < (1 if e.static else e.capacity):
                info = e.views.get((n, True))  # self.view_info(e), inlined: it accepts
                out.append(info.view if info is not None else self.view_info(e).view)
        return out

    def queue_head(self, n: int) -> list[int]:
        s = self.step
        assert s is not None
        head: list[int] = []
        seen: set[int] = set()  # a response requeued twice sits in the queue twice: place it once
        while s.queue and len(head) < n:
            i = s.queue.popleft()
            if not s.done[i] and s.engine_of[i] < 0 and i not in seen:
                head.append(i)
                seen.add(i)
        return head

    def fresh(self, items: Sequence[int]) -> bool:
        s = self.step
        assert s is not None
        return all(s.held[i] == 0 for i in items)

    def req_views(self, items: Sequence[int], now: float) -> list[ReqView]:
        s = self.step
        assert s is not None
        idx = np.asarray(items, dtype=np.int64)
        gen = self.generated(s, idx)
        left = self.max_new - gen
        exp = self.coord.stats.expected_remaining(gen, left)
        cols = (
            gen.astype(np.int64).tolist(),
            left.astype(np.int64).tolist(),
            s.prompt_len[idx].tolist(),
            exp.tolist(),
            (now - s.admit_t[idx]).tolist(),
        )
        return [ReqView(str(i), g, b, p, x, None, d) for i, g, b, p, x, d in zip(idx.tolist(), *cols)]

    def groups(self, items: Sequence[int] | np.ndarray) -> list[Hashable]:
        s = self.step
        assert s is not None
        return (np.asarray(items, dtype=np.int64) // s.group_size).tolist()

    def avoid(self, items: Sequence[int]) -> dict[str, set[str]]:
        s = self.step
        assert s is not None
        return {str(i): {s.left_from[i]} for i in items if s.left_from.get(i)}

    def put_back(self, items: Sequence[int]) -> None:
        s = self.step
        assert s is not None
        s.queue.extendleft(reversed(items))

    def item(self, rid: str) -> int:
        return int(rid)

    def rids(self, items: np.ndarray) -> list[str]:
        return [str(i) for i in items.tolist()]

    def admit(self, plan: Sequence[tuple[int, str]], now: float) -> None:
        s = self.step
        assert s is not None
        by_engine: dict[str, list[int]] = {}
        for i, eid in plan:
            by_engine.setdefault(eid, []).append(i)
        by_id = self.fleet.by_id
        for eid, items in by_engine.items():
            self._admit(by_id[eid], s, items)

    def _admit(self, e: ModelledEngine, s: StepState, items: list[int]) -> None:
        """The engine takes these responses: each ends when the engine has decoded what it still needs."""
        now = self.q.now
        if not e.live:
            e.rebase(now)
            e.batch_n = len(items)
            self._pnow_key = None  # cached progress of this instant no longer holds
        else:
            e.advance(now)
        decoded, heap, targets, left_from = e.decoded, e.heap, s.target, s.left_from
        if len(items) <= 4:
            # a few responses (the usual refill, a migrated one): numpy's per-call cost would dominate;
            # the same arithmetic on Python scalars gives the same floats
            ctx = 0
            for i in items:
                held_i = int(s.held[i])
                t = decoded + (s.length_of[i] - held_i)
                s.engine_of[i] = e.idx
                s.held_at_admit[i] = held_i
                s.decoded_at_admit[i] = decoded
                s.admit_t[i] = now
                targets[i] = t
                left_from.pop(i, None)
                heapq.heappush(heap, (t, i))
                ctx += int(s.prompt_len[i]) + held_i
        else:
            # one array operation per field (items are distinct: dispatch places each response once)
            idx = np.asarray(items, dtype=np.int64)
            held = s.held[idx]
            target = decoded + (s.length[idx] - held)
            s.engine_of[idx] = e.idx
            s.held_at_admit[idx] = held
            s.decoded_at_admit[idx] = decoded
            s.admit_t[idx] = now
            for i, t in zip(items, target.tolist()):
                targets[i] = t
                left_from.pop(i, None)
                heapq.heappush(heap, (t, i))
            ctx = int((s.prompt_len[idx] + held).sum())
        e.live.update(items)
        # a static engine's batch starts once its requests have made the round trip (dispatch_s)
        start = now
        if e.static and self.sim.dispatch_s:
            start += self.sim.dispatch_s
            if self.sim.cpu_cores:  # the round trip is the coordinator's work too: see CoreShare
                self.cores.coordinate_until(start)
        if self.sim.cpu_cores and self.sim.serve_s:  # and so are the responses' tokens and ends
            self.cores.serve(self.sim.serve_s * len(items))
        e.stall = max(e.stall, start) + e.model.prefill_time(ctx) / e.speed
        e.set_load()
        self.schedule(e)

    # ---- the engines decode ----------------------------------------------------------------------
    def schedule(self, e: ModelledEngine) -> None:
        """The engine's next event: when its first response ends at the load it has now."""
        e.epoch += 1
        s = self.step
        heap, live = e.heap, e.live
        if s is None:
            heap.clear()
            return
        target = s.target
        while heap and (heap[0][1] not in live or target[heap[0][1]] != heap[0][0]):  # stale entries
            heapq.heappop(heap)
        if not heap:
            return
        q = self.q
        start = max(q.now, e.stall, e.last)
        p = e.progress_at(start)
        first = heap[0][0]
        t = start + max(0.0, first - p) * e.step_s
        if t <= start and first > p + 1e-9:
            # the rest is below the clock's float spacing (late in a long replay): one tick later
            # makes progress, where the same instant would be scheduled again and again
            t = math.nextafter(start, INF)
        q.seq += 1  # q.push, inlined: once per engine event
        heapq.heappush(q.heap, (t, q.seq, "engine", (e.idx, e.epoch)))

    def on_engine(self, payload: tuple[int, int]) -> None:
        idx, epoch = payload
        e = self.fleet.engines[idx]
        if epoch != e.epoch or e.state == "gone":
            return
        s = self.step
        assert s is not None
        e.advance(self.q.now)
        finished = []
        heap, live, done_at, targets, pop = e.heap, e.live, e.decoded + 1e-9, s.target, heapq.heappop
        while heap and heap[0][0] <= done_at:
            target, i = pop(heap)
            # discard at once: a response that left and came back to this engine can have two heap
            # entries with the same target (its progress counter moved by exactly what it generated)
            if i in live and targets[i] == target:
                live.discard(i)
                finished.append(i)
        for i in finished:
            self.complete(s, i)
        if finished:
            self.coord.slots_changed()
        if e.spec is None:
            n = e.batch_n if e.static and live else len(live)  # e.set_load(), inlined: once per engine event
            e.step_s = e.model.step_time(max(1, n)) / e.speed
        else:
            e.set_load()
        self.schedule(e)
        if finished:
            self._after_completions(s)

    def complete(self, s: StepState, i: int) -> None:
        assert not s.done[i], f"response {i} of step {s.number} completed twice"  # would end the replay early
        end = s.length_of[i]
        s.done[i] = True
        s.engine_of[i] = -1
        s.held[i] = end
        s.open -= 1
        o = self._owner(i)
        if o is not s:
            o.open -= 1
        self.coord.response_done(i // s.group_size, end)
        if self.speculation is not None:  # its siblings now draft from more of the group's text
            for idx in self.speculation.siblings(s, i):
                e = self.fleet.engines[idx]
                e.advance(self.q.now)
                e.set_load()
                self.schedule(e)

    def _after_completions(self, s: StepState) -> None:
        if self.coord.abandon_due(s.open):
            self.hooks.abandoned(s, self.coord.abandon(self.q.now))
        self._report_done()
        if s.open:
            self.coord.dispatch(self.q.now)

    # ---- offload, migration, losses: requeue with the tokens held ------------------------------
    def requeue(self, s: StepState, i: int, keep_tokens: bool = True, count: bool = True) -> None:
        eng = int(s.engine_of[i])
        if eng < 0 or s.done[i]:  # completed in the meantime (a plan made at the same instant)
            return
        e = self.fleet.engines[eng]
        e.advance(self.q.now)
        end = s.length_of[i]
        gen = min(end, int(s.held_at_admit[i]) + math.floor(e.decoded - float(s.decoded_at_admit[i]) + 1e-9))
        e.live.discard(i)
        s.engine_of[i] = -1
        if keep_tokens:
            if gen > 0 and count:
                self.migrations += 1
            s.held[i] = gen
        else:
            self.restarted_tokens += gen
            s.held[i] = 0
        if gen >= end:
            self.complete(s, i)
        else:
            s.queue.appendleft(i)

    def lose(self, e: ModelledEngine, drained: bool) -> None:
        """The engine is lost or leaving: the coordinator takes back everything it held (drained: its
        tokens were all flushed first; a lost engine's last chunk is what the coordinator had)."""
        s = self.step
        keep = not self.policy.restart  # token-level resume, or (baseline) start over
        if s is not None and e.live:
            for i in sorted(e.live):
                self.requeue(s, i, keep_tokens=keep)
            e.live.clear()
            e.set_load()
            self._report_done()
        e.state = "draining"
        e.epoch += 1
        self.coord.dispatch(self.q.now)

    def hand_over(self, engines: Sequence[str], now: float) -> int:
        s = self.step
        assert s is not None
        moved = 0
        for eid in engines:
            e = self.fleet.by_id[eid]
            e.offloaded = True
            for i in sorted(e.live):
                self.requeue(s, i)
                moved += 1
            e.set_load()
            self.schedule(e)
        return moved

    def after_offload(self) -> None:
        """The reserved engines handed over (Coordinator.on_offload): the trainer may train, and a step
        whose every response was already in ends."""
        s = self.step
        assert s is not None
        self.trainer_may_train(s)
        self._report_done()

    trainer_may_train: Callable[[StepState], None]  # set by the replay: the trainer's side trains what it can

    def engine_infos(self, now: float) -> list[EngineInfo]:
        return [self.view_info(e) for e in self.fleet.alive]

    def held(self, engine: str, now: float, min_on_engine_s: float) -> Held | None:
        s = self.step
        assert s is not None
        e = self.fleet.by_id[engine]
        live = np.fromiter(e.live, np.int64, len(e.live))
        on_engine_s = now - s.admit_t[live]
        # worth_a_look passes none that has not settled (min_on_engine_s): predict only the others
        settled = on_engine_s >= min_on_engine_s
        if not _any(settled):
            return None
        live, on_engine_s = live[settled], on_engine_s[settled]
        gen = self.generated(s, live)
        return Held(live, on_engine_s, gen, self.max_new - gen, s.prompt_len[live])

    def take_back(self, moves: Sequence[tuple[int, str]], now: float) -> int:
        s = self.step
        assert s is not None
        by_id = self.fleet.by_id
        moved = 0
        for i, src in moves:
            if s.engine_of[i] == by_id[src].idx:
                self.requeue(s, i)
                s.left_from[i] = src
                moved += 1
        for src in {src for _, src in moves}:
            by_id[src].set_load()
            self.schedule(by_id[src])
        return moved

    def drop_unfinished(self, keep: set[Hashable], now: float) -> list[Hashable]:
        """Tail batching: the round has its groups; drop everything else."""
        s = self.step
        assert s is not None and len(self.parts) == 1
        unfinished_groups = set()
        engines = self.fleet.engines
        for i in np.nonzero(~s.done)[0].tolist():
            if s.engine_of[i] >= 0:
                e = engines[s.engine_of[i]]
                e.advance(self.q.now)
                gen = int(s.held_at_admit[i] + math.floor(e.decoded - s.decoded_at_admit[i] + 1e-9))
                self.restarted_tokens += min(int(s.length[i]), gen)
                e.live.discard(i)
                s.engine_of[i] = -1
            else:
                self.restarted_tokens += int(s.held[i])
            s.done[i] = True
            s.dropped[i] = True
            unfinished_groups.add(i // s.group_size)
        s.open = 0
        for e in engines:
            e.set_load()
            self.schedule(e)
        return list(unfinished_groups)

    # ---- what the policies see --------------------------------------------------------------
    def view_info(self, e: ModelledEngine) -> EngineInfo:
        """An engine as dispatch and migration see it: a view by its load and whether it accepts, which
        is all it depends on (memoised on the engine)."""
        n = len(e.live)
        key = (n, self.accepting(e))
        info = e.views.get(key)
        if info is None:
            info = e.views[key] = EngineInfo.of(
                MemoView(e.id, e.kind, e.capacity, n, e.model.rate(n) if n else 0.0, e.model, key[1])
            )
        return info

    def _progress_now(self) -> np.ndarray:
        key = (self.q.now, self.q.seq)
        if self._pnow_key != key:
            # responses are held by engines not gone: the hundreds gone over a long replay are skipped
            now, pnow = self.q.now, [0.0] * len(self.fleet.engines)
            for e in self.fleet.alive:
                pnow[e.idx] = e.progress_at(now)
            self._pnow = np.array(pnow)
            self._pnow_key = key
        return self._pnow

    def generated(self, s: StepState, idx: np.ndarray) -> np.ndarray:
        """Tokens each response holds now (on an engine: what it has decoded since it was admitted)."""
        eng = s.engine_of[idx]
        held = s.held[idx].astype(np.float64)
        on = eng >= 0
        if _any(on):
            pnow = self._progress_now()
            gen = s.held_at_admit[idx] + np.floor(pnow[np.where(on, eng, 0)] - s.decoded_at_admit[idx] + 1e-9)
            held = np.where(on, np.minimum(gen, s.length[idx]), held)
        return held

    def progress_inputs(self, now: float) -> ProgressInputs:
        """What the offload policy sees (as the live pool measures it), from modelled engines."""
        s = self.step
        assert s is not None
        reserved = [e for e in self.fleet.alive if e.kind == "reserved"]
        remote = [e for e in self.fleet.alive if e.kind != "reserved" and self.accepting(e)]
        open_idx = np.nonzero(~s.done)[0]
        gen = self.generated(s, open_idx)
        on_reserved = np.isin(s.engine_of[open_idx], [e.idx for e in reserved])
        return ProgressInputs(
            # a modelled engine's measured rate is its model's: given as unmeasured, so that
            # remote_rates takes the model's own numbers (not a measurement scaled back and forth)
            remote=[EngineView(e.id, e.kind, e.capacity, len(e.live), 0.0, e.model, True) for e in remote],
            generated=gen,
            budget_left=self.max_new - gen,
            held_tokens=float(s.held[s.done].sum() + gen.sum()),
            reserved_context=float((s.prompt_len[open_idx] + gen)[on_reserved].sum()),
            reserved_rate=sum(e.model.rate(len(e.live)) for e in reserved),
        )

    def drafting(self) -> Drafting | None:
        """The engines' measured acceptance (Speculation.meter: the drafted and accepted tokens they
        would report) where the replay speculates, as the live pool's engines report theirs."""
        sp = self.speculation
        return None if sp is None else Drafting(sp.meter.rate, sp.max_tokens)
