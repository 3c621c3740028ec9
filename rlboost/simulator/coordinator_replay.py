"""The coordinator's side of a replay: engines joining, dispatch, offload, migration and losses, decided
by the same scheduling core as the live coordinator (rlboost/rollout/coordinator.py) on modelled engines.

Decisions come from rlboost/rollout/policies: `offload_tick` and `step_progress` (offload), `TickCadence`
(when offload and migration are reconsidered), `plan_dispatch`, `plan_migrations` (after the
`worth_a_look` / `may_gain` pre-filters, which pass every response plan_migrations could move). This
module only builds the views those functions read, from the modelled engines, and carries out what
they decide.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlboost.contracts.perf import SYNC_COSTS
from rlboost.contracts.spec import JobSpec
from rlboost.rollout.policies.dispatch import plan_dispatch
from rlboost.rollout.policies.lengths import LengthStats
from rlboost.rollout.policies.migration import MigrationConfig, may_gain, plan_migrations, worth_a_look
from rlboost.rollout.policies.offload import OffloadPolicy, StepProgress, offload_tick, step_progress
from rlboost.rollout.policies.tick import TickCadence
from rlboost.rollout.policies.views import EngineView, ReqView
from rlboost.simulator.cores import CoreShare
from rlboost.simulator.engines import Fleet, MemoView, ModelledEngine
from rlboost.simulator.events import INF, EventQueue
from rlboost.simulator.presets import SimPolicy
from rlboost.simulator.step_state import StepState

_NONE = np.zeros(0)
_any = np.logical_or.reduce  # ndarray.any() without its Python-level wrapper (small arrays, often)


@dataclass(frozen=True)
class CoordinatorRules:
    """The scheduling core a replay's coordinator runs (built from the job by rlboost/rollout/scheduling.py)."""

    offload: OffloadPolicy
    cadence: TickCadence
    migration: MigrationConfig | None
    stats: LengthStats


@dataclass
class StepHooks:
    """What the coordinator tells the trainer's side of the replay (the live coordinator's GroupFeeder
    and step results)."""

    train_more: Callable[[StepState], None]  # a group completed, or the box ended: the trainer may train
    generation_done: Callable[[StepState], None]  # the step's last response is in
    abandoned: Callable[[StepState, list[int]], None]  # tail batching dropped these groups' responses


class CoordinatorReplay:
    def __init__(
        self, spec: JobSpec, policy: SimPolicy, q: EventQueue, fleet: Fleet, cores: CoreShare, rules: CoordinatorRules
    ) -> None:
        self.spec, self.policy, self.q, self.fleet, self.cores = spec, policy, q, fleet, cores
        self.sim = spec.simulate
        self.offload, self.cadence, self.migration, self.stats = (
            rules.offload,
            rules.cadence,
            rules.migration,
            rules.stats,
        )
        self.max_new = spec.algorithm.max_new_tokens
        self.hooks: StepHooks  # set by the replay once the trainer's side exists
        self.step: StepState | None = None
        self.version = -1  # the weights version the trainer published; engines must hold it to take work
        self.migrations = 0  # partial responses continued elsewhere (preemption, offload, tail)
        self.restarted_tokens = 0  # tokens thrown away (restart policy, tail batching)
        self._pnow_key: tuple | None = None
        self._pnow = np.zeros(0)
        cores.reschedule = self.schedule
        q.on("ready", self.on_ready)
        q.on("tick", self.on_tick)
        q.on("engine", self.on_engine)

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
            self.step.changed = True
            self.step.next_offload_check = self.q.now  # the pool changed
        self.dispatch()

    def publish(self) -> None:
        """The trainer published the next version: every engine serving or pulling pulls it."""
        self.step = None
        self.version += 1
        for e in self.fleet.engines:
            e.offloaded = False
            if e.state in ("ready", "pulling"):
                self.pull(e)

    # ---- a step -----------------------------------------------------------------------------
    def begin_step(self, s: StepState, prev_step_s: float) -> None:
        """The trainer handed over the step's requests (queued in s.queue)."""
        s.n_remote = sum(1 for e in self.fleet.alive if e.kind != "reserved" and e.state in ("ready", "pulling"))
        self.offload.start_step(s.n_remote)
        for e in self.fleet.engines:  # indices are per step: nothing of the previous step may stay live
            assert not e.live, f"engine {e.id} still holds {sorted(e.live)[:5]} at step {s.number}"
            e.heap.clear()
        self.step = s
        s.prev_step_s = prev_step_s
        s.tick = self.cadence.period(s.prev_step_s, 0.0)
        self.q.push(self.q.now, "tick", s.number)
        self.dispatch()

    def on_tick(self, number: int) -> None:
        s = self.step
        if s is None or s.number != number or s.gen_end is not None:
            return
        now = self.q.now
        reserved = [e for e in self.fleet.alive if e.kind == "reserved"]
        d = offload_tick(  # the coordinator's decision, on this clock
            self.offload,
            now,
            offload_at=s.offload_at,
            next_check=s.next_offload_check,
            has_reserved=bool(reserved),
            remote_ready=any(e.kind != "reserved" and e.state == "ready" for e in self.fleet.alive),
            progress=lambda: self.progress(s, reserved),
        )
        s.next_offload_check = d.next_check
        if d.action == "offload":
            self.offload_now(s, reserved)
        elif d.action == "resume":
            for e in self.fleet.engines:
                e.offloaded = False  # every remote engine is gone: the trainer's engine generates again
        s.ticks += 1
        s.tick = self.cadence.period(s.prev_step_s, now - s.t0)
        if self.migration is not None and self.cadence.migrate_now(
            queue_empty=not s.queue, changed=s.changed, tick=s.ticks
        ):
            s.changed = False
            self.migrate(s)
        self.dispatch()
        self.q.push(now + s.tick, "tick", number)

    # ---- dispatch -----------------------------------------------------------------------------
    def accepting(self, e: ModelledEngine) -> bool:
        return e.state == "ready" and e.version == self.version and not e.offloaded and not (e.static and e.live)

    def dispatch(self) -> None:
        s = self.step
        if s is None or not s.queue or s.gen_end is not None:
            return
        v = self.version  # self.accepting(e), inlined: this scan runs on every refill
        open_e = [
            e
            for e in self.fleet.alive
            if e.state == "ready"
            and e.version == v
            and not e.offloaded
            and len(e.live) < (1 if e.static else e.capacity)
        ]
        if not open_e:
            return
        if s.share is not None and self._dispatch_shares(s, open_e):
            return
        free = sum(e.capacity - len(e.live) for e in open_e)
        head: list[int] = []
        seen: set[int] = set()  # a response requeued twice sits in the queue twice: place it once
        while s.queue and len(head) < free:
            i = s.queue.popleft()
            if not s.done[i] and s.engine_of[i] < 0 and i not in seen:
                head.append(i)
                seen.add(i)
        if not head:
            return
        if len(head) == free and all(s.held[i] == 0 for i in head):
            # every free slot fills and the requests are alike: any policy gives the same placement
            plan, it = [], iter(head)
            for e in open_e:
                plan.extend((i, e) for _, i in zip(range(e.capacity - len(e.live)), it))
        else:
            views = [self.view(e) for e in open_e]
            by_id = {e.id: e for e in open_e}
            reqs = self.req_views(s, head)
            avoid = {str(i): {s.left_from[i]} for i in head if s.left_from.get(i)}
            got = plan_dispatch(reqs, views, self.policy.dispatch, avoid=avoid)
            plan = [(int(rid), by_id[eid]) for rid, eid in got]
            placed = {i for i, _ in plan}
            s.queue.extendleft(reversed([i for i in head if i not in placed]))
        by_engine: dict[int, list[int]] = {}
        for i, e in plan:
            by_engine.setdefault(e.idx, []).append(i)
        for idx, items in by_engine.items():
            self.admit(self.fleet.engines[idx], s, items)

    def _dispatch_shares(self, s: StepState, open_e: list[ModelledEngine]) -> bool:
        """`split` baseline: each engine takes up to its share of the step; True when handled (the
        queue waits for an engine still pulling the step's weights). Once every live engine has had
        its share, what is left (responses restarted after a loss) goes to any open engine."""
        assert s.share is not None
        room = {e.idx: min(e.capacity - len(e.live), s.share.get(e.idx, 0) - s.given.get(e.idx, 0)) for e in open_e}
        if not any(v > 0 for v in room.values()):
            engines = self.fleet.engines
            return any(s.given[i] < s.share[i] and engines[i].state in ("ready", "pulling") for i in s.share)
        by_engine: dict[int, list[int]] = {}
        targets = [e for e in open_e if room[e.idx] > 0]
        seen: set[int] = set()
        while s.queue and targets:
            i = s.queue.popleft()
            if s.done[i] or s.engine_of[i] >= 0 or i in seen:
                continue
            seen.add(i)
            e = targets[0]
            by_engine.setdefault(e.idx, []).append(i)
            room[e.idx] -= 1
            s.given[e.idx] = s.given.get(e.idx, 0) + 1
            if room[e.idx] <= 0:
                targets.pop(0)
        for idx, items in by_engine.items():
            self.admit(self.fleet.engines[idx], s, items)
        return True

    def admit(self, e: ModelledEngine, s: StepState, items: list[int]) -> None:
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
            s.changed = True
        n = e.batch_n if e.static and live else len(live)  # e.set_load(), inlined: once per engine event
        e.step_s = e.model.step_time(max(1, n)) / e.speed
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
        self.stats.add((end,))
        g = i // s.group_size
        s.group_left[g] -= 1
        if s.group_left[g] == 0:
            s.groups_done.append(g)
            s.completed_groups += 1
            self.hooks.train_more(s)

    def _after_completions(self, s: StepState) -> None:
        need = s.tail_round.need_groups if s.tail_round is not None else None
        if need is not None and s.completed_groups >= need and s.open > 0:
            self._abandon(s)
        if s.open == 0:
            self.hooks.generation_done(s)
        else:
            self.dispatch()

    # ---- offload, migration, losses: requeue with the tokens held ------------------------------
    def requeue(self, s: StepState, i: int, keep_tokens: bool = True) -> None:
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
            if gen > 0:
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
            if s.open == 0 and s.gen_end is None:
                self.hooks.generation_done(s)
        e.state = "draining"
        e.epoch += 1
        self.dispatch()

    def offload_now(self, s: StepState, reserved: list[ModelledEngine]) -> None:
        """The offload policy's box is over: the trainer's engines hand their responses to the rest."""
        s.offload_at = self.q.now
        for e in reserved:
            e.offloaded = True
            for i in sorted(e.live):
                self.requeue(s, i)
            e.set_load()
            self.schedule(e)
        self.hooks.train_more(s)
        if s.open == 0:
            self.hooks.generation_done(s)

    def migrate(self, s: StepState) -> None:
        # one pass over the fleet: every view, and the fastest target's seq_time and prefill
        alive = self.fleet.alive
        infos = [self.view_info(e) for e in alive]
        views: list[EngineView] = [x[0] for x in infos]
        best = min_prefill = INF
        has_target = False
        for _, target, st_next, prefill1, _ in infos:
            if target:
                has_target = True
                best = min(best, st_next)
                min_prefill = min(min_prefill, prefill1)  # seconds per token, the fastest target
        if not has_target:
            return
        cfg = self.migration
        assert cfg is not None
        now, max_new = self.q.now, self.max_new
        asked = False
        sources = []  # (view, seq_time, responses, seconds on the engine, generated, budget left)
        for (v, _, _, _, seq_s), e in zip(infos, alive):
            if v.active == 0 or seq_s <= best * (1 + cfg.min_gain_frac):
                continue
            asked = True
            live = np.fromiter(e.live, np.int64, len(e.live))
            on_engine_s = now - s.admit_t[live]
            # worth_a_look passes none that has not settled (min_on_engine_s): predict only the others
            settled = on_engine_s >= cfg.min_on_engine_s
            if not _any(settled):
                continue
            live, on_engine_s = live[settled], on_engine_s[settled]
            gen = self.generated(s, live)
            sources.append((v, seq_s, live, on_engine_s, gen, max_new - gen))
        if not sources:
            if asked:  # still ask, with nothing: when LengthStats re-sorts its window depends on when it is asked
                self.stats.expected_remaining(_NONE, _NONE)
            return
        # one prediction for every source's responses (elementwise: the same numbers as one per source)
        if len(sources) == 1:
            exps = [self.stats.expected_remaining(sources[0][4], sources[0][5])]
        else:
            cuts = np.cumsum([len(x[2]) for x in sources])[:-1]
            exp_all = self.stats.expected_remaining(
                np.concatenate([x[4] for x in sources]), np.concatenate([x[5] for x in sources])
            )
            exps = np.split(exp_all, cuts)
        running: dict[str, list[ReqView]] = {}
        for (v, seq_s, live, on_engine_s, gen, left), exp in zip(sources, exps):
            keep = worth_a_look(exp, seq_s, on_engine_s, cfg) & may_gain(
                exp, s.prompt_len[live] + gen, seq_s, best, min_prefill, cfg
            )
            if _any(keep):  # the kept ones' views from the same (elementwise) numbers
                running[v.id] = self._req_views_of(s, live[keep], gen[keep], left[keep], exp[keep])
        if not running:
            return
        moves = plan_migrations(views, running, len(s.queue), cfg)
        by_id = {e.id: e for e in alive}
        for rid, src in moves:
            i = int(rid)
            if s.engine_of[i] == by_id[src].idx:
                self.requeue(s, i)
                s.left_from[i] = src
        for src in {src for _, src in moves}:
            by_id[src].set_load()
            self.schedule(by_id[src])

    def _abandon(self, s: StepState) -> None:
        """Tail batching: the round has its groups; drop everything else."""
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
        self.hooks.abandoned(s, sorted(unfinished_groups))

    # ---- what the policies see --------------------------------------------------------------
    def view(self, e: ModelledEngine) -> EngineView:
        return self.view_info(e)[0]

    def view_info(self, e: ModelledEngine) -> tuple[EngineView, bool, float, float, float]:
        """An engine's view, whether it is a migration target (accepting, a slot free), the view's
        seq_time one sequence more and prefill_s(1) (as a target), and its seq_time now (as a source)."""
        n = len(e.live)
        key = (n, self.accepting(e))
        info = e.views.get(key)
        if info is None:  # an engine's view depends on its load and whether it accepts, nothing else
            v = MemoView(e.id, e.kind, e.capacity, n, e.model.rate(n) if n else 0.0, e.model, key[1])
            target = v.accepting and v.free > 0
            info = e.views[key] = (
                v,
                target,
                v.seq_time(v.active + 1) if target else INF,
                v.prefill_s(1) if target else INF,
                v.seq_time(v.active),
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

    def req_views(self, s: StepState, items: list[int]) -> list[ReqView]:
        idx = np.asarray(items, dtype=np.int64)
        gen = self.generated(s, idx)
        left = self.max_new - gen
        return self._req_views_of(s, idx, gen, left, self.stats.expected_remaining(gen, left))

    def _req_views_of(
        self, s: StepState, idx: np.ndarray, gen: np.ndarray, left: np.ndarray, exp: np.ndarray
    ) -> list[ReqView]:
        """ReqViews of responses idx whose generated tokens, budget left and expected rest are known."""
        since = self.q.now - s.admit_t[idx]
        # whole numbers held as floats: the int64 cast truncates as int() did
        cols = (
            gen.astype(np.int64).tolist(),
            left.astype(np.int64).tolist(),
            s.prompt_len[idx].tolist(),
            exp.tolist(),
            since.tolist(),
        )
        return [ReqView(str(i), g, b, p, x, None, d) for i, g, b, p, x, d in zip(idx.tolist(), *cols)]

    def progress(self, s: StepState, reserved: list[ModelledEngine]) -> StepProgress:
        """What the offload policy sees (the coordinator's `progress`, from modelled engines)."""
        remote = [e for e in self.fleet.alive if e.kind != "reserved" and self.accepting(e)]
        open_idx = np.nonzero(~s.done)[0]
        gen = self.generated(s, open_idx)
        on_reserved = np.isin(s.engine_of[open_idx], [e.idx for e in reserved])
        return step_progress(
            elapsed=self.q.now - s.t0,
            # a modelled engine's measured rate is its model's: given as unmeasured, so that
            # remote_rates takes the model's own numbers (not a measurement scaled back and forth)
            remote=[EngineView(e.id, e.kind, e.capacity, len(e.live), 0.0, e.model, True) for e in remote],
            generated=gen,
            budget_left=self.max_new - gen,
            held_tokens=float(s.held[s.done].sum() + gen.sum()),
            reserved_context=float((s.prompt_len[open_idx] + gen)[on_reserved].sum()),
            reserved_rate=sum(e.model.rate(len(e.live)) for e in reserved),
            stats=self.stats,
        )
