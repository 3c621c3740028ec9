"""The rollout coordinator: every decision of a step, and the glue around it, for the live trainer and
the simulator alike.

A step's responses are dispatched to engines (the trainer cluster's reserved engine and the spot
workers); on ticks the offload policy decides when the reserved engine hands its partial responses to
the remote engines, and tail migration moves long responses off slow or crowded engines; complete
groups go to the trainer as they finish; tail batching may end a round early. The decisions are pure
policies (rollout/policies/); this class turns their answers into actions on an `EnginePool`
(rollout/pool.py), which measures the engines and carries the actions out. What differs between the
live system and a replay is injected: the clock (every method takes `now`), the engines and the
connections to them (the live pool: WebSockets and the rollout book, rollout/live.py; the
simulator's: modelled engines on a virtual clock, simulator/modelled_pool.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np

from rlboost.rollout.policies.dispatch import plan_dispatch
from rlboost.rollout.policies.lengths import LengthStats
from rlboost.rollout.policies.migration import MigrationConfig, may_gain, plan_migrations, worth_a_look
from rlboost.rollout.policies.offload import OffloadPolicy, StepOutcome, StepProgress, offload_tick, step_progress
from rlboost.rollout.policies.siblings import GroupLengths, SiblingModel
from rlboost.rollout.policies.tick import TickCadence
from rlboost.rollout.policies.views import ReqView
from rlboost.rollout.pool import EnginePool, Item

INF = float("inf")
_NONE = np.zeros(0)
_any = np.logical_or.reduce  # ndarray.any() without its Python-level wrapper (small arrays, often)
QUEUE_LOOK = 8192  # sibling scheduling ranks this much of the queue's head (a step's responses, in practice)


@dataclass(frozen=True)
class CoordinatorRules:
    """The scheduling core a coordinator runs (built from the job by rollout/scheduling.py)."""

    offload: OffloadPolicy
    cadence: TickCadence
    migration: MigrationConfig | None
    stats: LengthStats  # finished lengths so far: every remaining-length prediction
    dispatch_mode: str = "rate"  # rate | spread
    # rollout.sibling_scheduling: predictions from finished GRPO siblings (policies/siblings.py) order
    # dispatch and migration, and dispatch spreads a group over engines
    siblings: bool = False


@dataclass
class StepMarks:
    """One step on the coordinator's clock."""

    step: int
    t0: float
    n_remote: int  # remote engines serving or pulling at the step's start
    prev_step_s: float = 0.0  # the last step's length: how often to tick
    offload_at: float | None = None
    gen_end: float | None = None
    next_offload_check: float = 0.0  # the offload policy said no until then
    ticks: int = 0
    changed: bool = False  # a slot freed up or an engine joined since the last migration round
    # the step's complete groups in completion order (the trainer takes them from here) and the tokens
    # of each group's finished responses: the step's own, so that under algorithm.max_staleness the
    # trainer still takes them after the next step's generation has begun
    groups_done: deque[Hashable] = field(default_factory=deque)
    group_tokens: dict[Hashable, int] = field(default_factory=dict)


class Coordinator:
    def __init__(self, pool: EnginePool, rules: CoordinatorRules) -> None:
        self.pool = pool
        self.offload, self.cadence, self.migration, self.stats = (
            rules.offload,
            rules.cadence,
            rules.migration,
            rules.stats,
        )
        self.dispatch_mode = rules.dispatch_mode
        self.siblings = SiblingModel(self.stats) if rules.siblings else None
        self.group_lengths = GroupLengths({})
        self.marks: StepMarks | None = None  # the step generating (or, generation over, still training)
        # steps whose generation ended before the next one began (algorithm.max_staleness): their marks
        # until the trainer ends them
        self.generated: dict[int, StepMarks] = {}
        self.last_step_s = 0.0  # the last step's length (ms): how often the next one ticks
        self.offloads = 0
        self.handed_over = 0  # responses the last offload moved off the reserved engines
        self.tail_migrations = 0  # responses moved by a migration round
        # the step's groups: responses left in each and the complete ones (the trainer takes them from
        # `groups_done`, the marks' own)
        self.completed_groups: list[Hashable] = []
        self.unfinished_groups: list[Hashable] = []  # dropped by tail batching
        self._group_left: dict[Hashable, int] = {}
        self._group_marks: dict[Hashable, StepMarks] = {}  # each open group's step
        # the pool names groups per step (the live book's "p3"), not uniquely across steps: the group
        # keys above, and those pool.groups() gives, are then (step, group)
        self.keyed = False
        self.need_groups: int | None = None  # tail batching: the round ends once this many are complete
        self.share: dict[str, int] | None = None  # `split` baseline: responses per engine this step
        self.given: dict[str, int] = {}
        # what the trainer's side hears: a group completed (it may train), the reserved engine handed over
        self.on_group_done: Callable[[], None] = lambda: None
        self.on_offload: Callable[[], None] = lambda: None

    # ---- a step ----------------------------------------------------------------------------------
    def begin_step(
        self,
        step: int,
        now: float,
        groups: Mapping[Hashable, int],
        *,
        need_groups: int | None = None,
        share: dict[str, int] | None = None,
        overlapping: bool = False,
    ) -> StepMarks:
        """The step's responses are queued in the pool; `groups`: responses per group."""
        n_remote = self.pool.n_remote()
        overlapped = self.marks is not None and self.marks.gen_end is None
        if self.marks is not None:  # it trains on (and, swapping weights in flight, may still generate)
            assert self.marks.gen_end is not None or overlapping, f"step {self.marks.step} still generates"
            self.generated[self.marks.step] = self.marks
        self.offload.start_step(n_remote)
        self.marks = StepMarks(step, now, n_remote, prev_step_s=self.last_step_s)
        if self.keyed:  # group names repeat from step to step: keyed by (step, group) here
            groups = {(step, g): n for g, n in groups.items()}
        if not overlapped:
            self._group_marks = {}
        for g in groups:
            self._group_marks[g] = self.marks
        if overlapped:  # the earlier step's groups stay open beside this one's
            self._group_left.update(groups)
            if self.siblings is not None:
                self.group_lengths.extend(groups)
        else:
            self.completed_groups = []
            self.unfinished_groups = []
            self._group_left = dict(groups)
            if self.siblings is not None:
                self.group_lengths = GroupLengths(groups)
        self.need_groups = need_groups
        self.share = share
        self.given = dict.fromkeys(share, 0) if share is not None else {}
        return self.marks

    @property
    def groups_done(self) -> deque[Hashable]:
        """The generating step's complete groups not yet taken by the trainer."""
        return self.marks.groups_done if self.marks is not None else deque()

    @property
    def group_tokens(self) -> dict[Hashable, int]:
        return self.marks.group_tokens if self.marks is not None else {}

    def marks_of(self, step: int) -> StepMarks | None:
        """A step's marks while it generates or trains (None: not begun, or ended)."""
        if self.marks is not None and self.marks.step == step:
            return self.marks
        return self.generated.get(step)

    def tick_period(self, elapsed: float) -> float:
        """Seconds to the next tick, `elapsed` into the step."""
        return self.cadence.period(self.marks.prev_step_s if self.marks else 0.0, elapsed)

    def tick(self, now: float) -> float:
        """Offload and tail migration, decided by the policies from fresh measurements; seconds to the
        next tick."""
        m = self.marks
        assert m is not None
        reserved = self.pool.reserved()
        d = offload_tick(
            self.offload,
            now,
            offload_at=m.offload_at,
            next_check=m.next_offload_check,
            has_reserved=bool(reserved),
            remote_ready=self.pool.remote_ready(),
            progress=lambda: self.progress(now),
        )
        m.next_offload_check = d.next_check
        if d.action == "offload":
            self.offload_now(now, reserved)
        elif d.action == "resume":  # every remote engine is gone: the trainer's engine generates again
            self.pool.clear_offloaded()
        m.ticks += 1
        period = self.tick_period(now - m.t0)
        if self.migration is not None and self.cadence.migrate_now(
            queue_empty=not self.pool.queue_len(), changed=m.changed, tick=m.ticks
        ):
            m.changed = False
            self.migrate(now)
        return period

    def slots_changed(self) -> None:
        """A slot freed up or an engine joined: the next tick reconsiders migration (TickCadence)."""
        if self.marks is not None:
            self.marks.changed = True

    def pool_changed(self, now: float) -> None:
        """An engine became ready: the remote pool changed, so the offload policy is asked again."""
        if self.marks is not None:
            self.marks.changed = True
            self.marks.next_offload_check = now

    def response_done(self, group: Hashable | None, length: int, step: int | None = None) -> None:
        """A response of step `step` (the generating one by default) is complete (`length` tokens)."""
        self.stats.add_one(length)
        if group is None:
            return
        key = (step if step is not None else self.marks.step, group) if self.keyed else group  # type: ignore[union-attr]
        m = self._group_marks[key]
        m.group_tokens[group] = m.group_tokens.get(group, 0) + length
        left = self._group_left[key] - 1
        self._group_left[key] = left
        if self.siblings is not None:
            got = self.group_lengths.add(key, length)
            if left == 0:  # a complete group: how much its responses spread around their prompt's factor
                self.siblings.spread.add_group(got)
        if left == 0:
            del self._group_marks[key]
            m.groups_done.append(group)
            self.completed_groups.append(group)
            self.on_group_done()

    def abandon_due(self, unfinished: int) -> bool:
        """Tail batching: the round has its groups while responses still run."""
        need = self.need_groups
        return need is not None and len(self.completed_groups) >= need and unfinished > 0

    def abandon(self, now: float) -> list[Hashable]:
        """End the round: drop every response but those of complete groups; the groups dropped."""
        self.unfinished_groups = sorted(self.pool.drop_unfinished(set(self.completed_groups), now))
        return self.unfinished_groups

    def generation_done(self, now: float, step: int | None = None) -> None:
        m = self.marks if step is None else self.marks_of(step)
        assert m is not None
        m.gen_end = now

    def generating(self) -> bool:
        """A begun step still has responses to generate."""
        return (self.marks is not None and self.marks.gen_end is None) or any(
            m.gen_end is None for m in self.generated.values()
        )

    def end_step(
        self,
        now: float,
        *,
        train_busy_s: float,
        train_tokens: int,
        busy_during_tail_s: float,
        step: int | None = None,
    ) -> StepOutcome:
        """The trainer finished the step (trained and published): the offload policy learns from its
        outcome, which is returned. `step`: which one, where the next one's generation has begun
        (algorithm.max_staleness); the generating one by default."""
        m = self.marks if step is None else self.marks_of(step)
        assert m is not None and m.gen_end is not None
        if m is not self.marks:
            del self.generated[m.step]
        outcome = StepOutcome.from_marks(
            m.n_remote, m.t0, now, m.gen_end, m.offload_at, busy_during_tail_s, train_tokens, train_busy_s
        )
        self.offload.end_step(outcome)
        self.last_step_s = round(outcome.step_s, 3)
        if m is self.marks:
            self.marks = None
        return outcome

    # ---- dispatch --------------------------------------------------------------------------------
    def dispatch(self, now: float) -> None:
        """Give queued responses to engines with free slots (policies/dispatch.py)."""
        m = self.marks
        pool = self.pool
        if m is None or not pool.queue_len() or (m.gen_end is not None and not self.generating()):
            return
        views = pool.open_engines(now)
        if not views:
            return
        if self.share is not None and self._dispatch_shares(views, now):
            return
        if self.siblings is not None:
            self._dispatch_longest(views, now)
            return
        free = sum(v.free for v in views)
        head = pool.queue_head(free)
        if not head:
            return
        if len(head) == free and pool.fresh(head):
            # every free slot fills and the requests are alike: any policy gives the same placement
            plan: list[tuple[Item, str]] = []
            it = iter(head)
            for v in views:
                plan.extend((i, v.id) for _, i in zip(range(v.free), it))
        else:
            got = plan_dispatch(pool.req_views(head, now), views, self.dispatch_mode, avoid=pool.avoid(head))
            plan = self._placed(head, got)
        if plan:
            pool.admit(plan, now)

    def _placed(self, head: list[Item], got: list[tuple[str, str]]) -> list[tuple[Item, str]]:
        """plan_dispatch's (rid, engine) pairs as items; what it left unplaced goes back to the queue."""
        plan = [(self.pool.item(rid), eid) for rid, eid in got]
        placed = {i for i, _ in plan}
        self.pool.put_back([i for i in head if i not in placed])
        return plan

    def _dispatch_longest(self, views: list, now: float) -> None:
        """Sibling scheduling: of the whole queue, the longest predicted start first (Seer's
        longest-first), and each group's responses spread over engines (policies/dispatch.py)."""
        pool, model = self.pool, self.siblings
        assert model is not None
        free = sum(v.free for v in views)
        head = pool.queue_head(min(pool.queue_len(), QUEUE_LOOK))
        if not head:
            return
        reqs = pool.req_views(head, now)
        groups = pool.groups(head)
        exp = self.group_lengths.predict(
            model,
            groups,
            np.fromiter((r.generated for r in reqs), np.float64, len(reqs)),
            np.fromiter((r.budget_left for r in reqs), np.float64, len(reqs)),
        )
        if exp is not None:
            for r, x in zip(reqs, exp.tolist()):
                r.expected_left = x
        longest = sorted(range(len(reqs)), key=lambda k: -reqs[k].expected_left)[:free]
        chosen = [head[k] for k in longest]
        got = plan_dispatch(
            [reqs[k] for k in longest],
            views,
            self.dispatch_mode,
            avoid=pool.avoid(chosen),
            groups={reqs[k].rid: groups[k] for k in longest},
        )
        plan = self._placed(head, got)
        if plan:
            pool.admit(plan, now)

    def _expected(self, items: np.ndarray, generated: np.ndarray, budget_left: np.ndarray) -> np.ndarray:
        """Remaining tokens of these responses: from their finished siblings under sibling scheduling
        (once the model knows enough), else from the learned length distribution alone."""
        if self.siblings is not None:
            exp = self.group_lengths.predict(self.siblings, self.pool.groups(items), generated, budget_left)
            if exp is not None:
                return exp
        return self.stats.expected_remaining(generated, budget_left)

    def _dispatch_shares(self, views: list, now: float) -> bool:
        """`split` baseline: each engine takes up to its share of the step; True when handled (the
        queue waits for an engine still pulling the step's weights). Once every live engine has had
        its share, what is left (responses restarted after a loss) goes to any open engine."""
        share, given = self.share, self.given
        assert share is not None
        room = {v.id: min(v.free, share.get(v.id, 0) - given.get(v.id, 0)) for v in views}
        if not any(r > 0 for r in room.values()):
            return any(given[e] < share[e] and self.pool.serving(e) for e in share)
        targets = [v for v in views if room[v.id] > 0]
        plan: list[tuple[Item, str]] = []
        head = self.pool.queue_head(sum(room[v.id] for v in targets))
        for i in head:
            v = targets[0]
            plan.append((i, v.id))
            room[v.id] -= 1
            given[v.id] = given.get(v.id, 0) + 1
            if room[v.id] <= 0:
                targets.pop(0)
        if plan:
            self.pool.admit(plan, now)
        return True

    # ---- offload, migration ----------------------------------------------------------------------
    def progress(self, now: float) -> StepProgress:
        """What the offload policy sees: the remote engines and the step's remaining work."""
        m = self.marks
        p = self.pool.progress_inputs(now)
        return step_progress(
            elapsed=now - (m.t0 if m else now),
            remote=p.remote,
            generated=p.generated,
            budget_left=p.budget_left,
            held_tokens=p.held_tokens,
            reserved_context=p.reserved_context,
            reserved_rate=p.reserved_rate,
            stats=self.stats,
            drafting=self.pool.drafting(),
        )

    def offload_now(self, now: float, reserved: list[str]) -> None:
        """The offload policy said so: the reserved engines hand their partial responses over."""
        assert self.marks is not None
        self.marks.offload_at = now
        for m in self.generated.values():  # a step still generating beside it (weights swapped in flight)
            if m.gen_end is None and m.offload_at is None:
                m.offload_at = now
        self.offloads += 1
        self.handed_over = self.pool.hand_over(reserved, now)
        self.on_offload()

    def take_back_reserved(self, now: float) -> None:
        """The trainer has nothing to train (algorithm.max_staleness: it offloaded its engine to train an
        older step): its engines generate the step again, and the offload policy decides anew."""
        assert self.marks is not None
        self.marks.offload_at = None
        self.marks.next_offload_check = now
        self.pool.clear_offloaded()
        self.dispatch(now)

    def migrate(self, now: float) -> None:
        """A tail-migration round (policies/migration.py): long responses off slow or crowded engines."""
        pool = self.pool
        infos = pool.engine_infos(now)
        best = min_prefill = INF
        has_target = False
        for x in infos:
            if x.target:
                has_target = True
                best = min(best, x.seq_next_s)
                min_prefill = min(min_prefill, x.prefill_s)  # seconds per token, the fastest target
        if not has_target:
            return
        cfg = self.migration
        assert cfg is not None
        asked = False
        sources = []  # (engine view, seq_time, settled responses)
        for x in infos:
            v = x.view
            if v.active == 0 or x.seq_now_s <= best * (1 + cfg.min_gain_frac):
                continue  # nothing anywhere is meaningfully faster than staying there
            asked = True
            held = pool.held(v.id, now, cfg.min_on_engine_s)
            if held is not None:
                sources.append((v, x.seq_now_s, held))
        if not sources:
            if asked:  # still ask, with nothing: when LengthStats re-sorts its window depends on when it is asked
                self.stats.expected_remaining(_NONE, _NONE)
            return
        # one prediction for every source's responses (elementwise: the same numbers as one per source)
        if len(sources) == 1:
            h = sources[0][2]
            exps = [self._expected(h.items, h.generated, h.budget_left)]
        else:
            cuts = np.cumsum([len(h.items) for _, _, h in sources])[:-1]
            exp_all = self._expected(
                np.concatenate([h.items for _, _, h in sources]) if self.siblings is not None else _NONE,
                np.concatenate([h.generated for _, _, h in sources]),
                np.concatenate([h.budget_left for _, _, h in sources]),
            )
            exps = np.split(exp_all, cuts)
        running: dict[str, list[ReqView]] = {}
        for (v, seq_s, h), exp in zip(sources, exps):
            # only those plan_migrations could move (a necessary condition: none of its moves changes)
            keep = worth_a_look(exp, seq_s, h.on_engine_s, cfg) & may_gain(
                exp, h.prompt_len + h.generated, seq_s, best, min_prefill, cfg
            )
            if _any(keep):
                running[v.id] = self._req_views(h, keep, exp)
        if not running:
            return
        moves = plan_migrations([x.view for x in infos], running, pool.queue_len(), cfg)
        if moves:
            self.tail_migrations += pool.take_back([(pool.item(rid), src) for rid, src in moves], now)

    def _req_views(self, h, keep: np.ndarray, exp: np.ndarray) -> list[ReqView]:
        """The kept responses' views, from the same (elementwise) numbers."""
        items = h.items[keep]
        # whole numbers held as floats: the int64 cast truncates as int() did
        cols = (
            h.generated[keep].astype(np.int64).tolist(),
            h.budget_left[keep].astype(np.int64).tolist(),
            h.prompt_len[keep].tolist(),
            exp[keep].tolist(),
            h.on_engine_s[keep].tolist(),
        )
        return [ReqView(r, g, b, p, x, None, d) for r, g, b, p, x, d in zip(self.pool.rids(items), *cols)]
