"""Discrete-event replay of one job under one policy, on a virtual clock.

What runs for real (the same functions as `rlboost launch`):
  SpotMarket.choose_victims; the controller's reconcile (reconcile_fleet: placement order, capacity
  backoff) and fleet policy; the coordinator's tick cadence (TickCadence: when offload and migration
  are reconsidered), offload_tick and step_progress (remote_rates), plan_dispatch, plan_migrations;
  the task's prompt sampler and request ids and seeds, LengthModel (the synthetic workload's lengths),
  LengthStats, TailBatcher.
What is modelled:
  engines (continuous batching, step_time(n), prefill stalls - the synthetic engine's model; a torch
  engine batches statically, each batch after a dispatch round trip), training (tokens / train rate),
  boot, weight pulls, the step's fixed overhead, and for a local job the processes' share of this
  machine's cores (simulate.cpu_cores, simulator/cores.py).

Timing follows the live job: the trainer is billed from when it serves, spot workers from launch to
the controller poll that sees them gone; the market is replayed at `local.time_scale` trace seconds
per second for `provider: local` jobs (1 otherwise).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from contracts.engine import STATIC_BATCH_ENGINES
from contracts.lengths import LengthModel, prompt_key
from contracts.perf import SYNC_COSTS, EngineModel
from contracts.provider_kinds import provider_kind
from contracts.sampling import request_id, request_seed
from contracts.spec import JobSpec
from providers.pricing import Offer
from providers.spot_market import AvailabilityTrace, SpotMarket
from rollout import scheduling
from rollout.policies.dispatch import plan_dispatch
from rollout.policies.fleet import StepSample
from rollout.policies.lengths import LengthStats
from rollout.policies.migration import may_gain, plan_migrations, worth_a_look
from rollout.policies.offload import (
    OffloadPolicy,
    StepOutcome,
    StepProgress,
    make_offload,
    offload_tick,
    step_progress,
)
from rollout.policies.overlap import busy_between, busy_total, left_to_train, may_train_group, trained_part
from rollout.policies.reconcile import CandidateBackoff, reconcile_fleet
from rollout.policies.tail_batching import TailBatcher
from rollout.policies.views import EngineView, ReqView
from rollout.scheduling import FleetClock, fleet_goal
from simulator.cores import Work, share
from simulator.workload import replay_task

INF = float("inf")
# (length model, seed, step, group size, prompt keys) -> the step's full response lengths, shared by
# the replays of one process (a sweep's points replay the same steps); bounded, ~16 kB a step
_LENGTHS_SEEN: dict[tuple, np.ndarray] = {}
_LENGTHS_SEEN_MAX = 8192
_NONE = np.zeros(0)
_any = np.logical_or.reduce  # ndarray.any() without its Python-level wrapper (small arrays, often)


@dataclass(frozen=True)
class SimPolicy:
    name: str
    offload: str = "predictive"  # none | rlboost | predictive
    dispatch: str = "rate"  # rate | spread
    migration: bool = True  # tail migration
    restart: bool = False  # responses of a lost worker restart from scratch (no token-level resume)
    tail_batching: bool = False
    spot: bool = True  # False: the reserved cluster alone
    # responses are split between the engines up front, in proportion to their rates (a baseline
    # without token-level dispatch: each engine keeps its share of the step)
    split: bool = False
    # a synchronous colocated step (veRL/TRL): generate, then old-logprob (+ ref) forward passes, then
    # train, then sync weights into the engine and rebuild its KV cache (perf.SYNC_COSTS)
    sync: bool = False
    # how many of max_workers to hold: None = all of them (a fixed fleet), "job" = the job file's
    # rollout.objective, or "cost" / "throughput" (rollout/policies/fleet.py, as the controller)
    objective: str | None = None
    label: str = ""


PRESETS: dict[str, SimPolicy] = {
    p.name: p
    for p in (
        SimPolicy("on-demand", "none", "spread", False, spot=False, label="rlboost's trainer alone"),
        SimPolicy(
            "sync",
            "none",
            "spread",
            False,
            spot=False,
            sync=True,
            label="synchronous colocated step (veRL/TRL): generate, logprobs, train, sync weights",
        ),
        SimPolicy(
            "spot-restart",
            "none",
            "rate",
            False,
            restart=True,
            split=True,
            label="spot workers take their share of each step; lost responses restart",
        ),
        SimPolicy("rlboost-rule", "rlboost", "spread", True, label="RLBoost's published offload rule"),
        SimPolicy(
            "rlboost",
            "predictive",
            "rate",
            True,
            objective="job",
            label="predictive offload, rate dispatch, migration, fleet sized by the job's objective",
        ),
        SimPolicy("rlboost-fixed", "predictive", "rate", True, label="rlboost holding max_workers always"),
        SimPolicy("rlboost-cost", "predictive", "rate", True, objective="cost", label="rlboost, objective cost"),
        SimPolicy(
            "rlboost-throughput",
            "predictive",
            "rate",
            True,
            objective="throughput",
            label="rlboost, objective throughput",
        ),
        SimPolicy("rlboost-tail", "predictive", "rate", True, tail_batching=True, label="... + tail batching"),
    )
}


def policy_from_spec(spec: JobSpec) -> SimPolicy:
    ro = spec.rollout
    return SimPolicy(
        "job",
        ro.offload_policy,
        ro.dispatch_policy,
        ro.migration,
        tail_batching=ro.tail_batching,
        spot=ro.max_workers > 0,
        objective="job",
        label="the job file's own settings",
    )


@dataclass
class SimResult:
    policy: SimPolicy
    steps: int
    run_s: float  # first step start -> last step end (sim seconds)
    job_s: float  # launch -> teardown
    trained_tokens: int
    dollars: float
    spot_dollars: float
    trainer_dollars: float
    preemptions: int
    migrations: int  # partial responses continued elsewhere (preemption, offload, tail)
    restarted_tokens: int  # tokens thrown away (restart policy, tail batching)
    time_scale: float
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (t, spot workers held, tokens)
    step_log: list[dict] = field(default_factory=list)

    @property
    def steps_per_hour(self) -> float:
        return self.steps / self.run_s * 3600 if self.run_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.trained_tokens / self.run_s if self.run_s > 0 else 0.0

    @property
    def tokens_per_dollar(self) -> float:
        return self.trained_tokens / self.dollars if self.dollars > 0 else 0.0

    @property
    def mean_spot_workers(self) -> float:
        """Spot workers held (booting or serving), averaged over the job's time."""
        if not self.timeline or self.job_s <= 0:
            return 0.0
        area = 0.0
        for (t0, n, _), (t1, _, _) in zip(self.timeline, [*self.timeline[1:], (self.job_s, 0, 0)]):
            area += n * (min(t1, self.job_s) - t0)
        return area / self.job_s


class _MemoView(EngineView):
    """An EngineView that remembers its seq_time answers: the policies ask the same view for the same
    load many times per plan, and a view never changes (the simulator makes a new one per load)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self._st: dict[int, float] = {}

    def seq_time(self, n: int, default: EngineModel | None = None) -> float:
        if default is not None:
            return super().seq_time(n, default)
        st = self._st.get(n)
        if st is None:
            st = self._st[n] = super().seq_time(n)
        return st


class _Engine:
    """A modelled engine: continuous batching at step_time(n), decode paused during prefill. A static
    engine (torch) takes a batch only when empty and decodes at the batch's size until its last one ends."""

    __slots__ = (
        "P",
        "batch_n",
        "cap",
        "epoch",
        "heap",
        "id",
        "idx",
        "kill_at",
        "killed_at",
        "kind",
        "last",
        "live",
        "model",
        "noticed",
        "offer",
        "offloaded",
        "speed",
        "st",
        "stall",
        "started",
        "state",
        "static",
        "version",
        "victim",
        "views",
    )

    def __init__(
        self, idx: int, eid: str, kind: str, model: EngineModel, offer: Offer | None, t: float, static: bool
    ) -> None:
        self.idx, self.id, self.kind, self.model, self.offer = idx, eid, kind, model, offer
        self.static = static
        self.batch_n = 0  # a static engine: the size of the batch it runs
        self.state = "booting"  # booting | pulling | ready | draining | gone
        self.version = -1
        self.offloaded = False
        self.P = 0.0
        self.last = t
        self.stall = t
        self.live: set[int] = set()
        self.heap: list[tuple[float, int]] = []
        self.epoch = 0
        self.cap = model.capacity
        self.speed = 1.0  # its share of a CPU core when the job's processes share a machine (local)
        self.st = model.step_time(1)
        self.started = t
        self.victim = False
        self.noticed = False
        self.kill_at = INF  # when the market kills it (notice lead over)
        self.killed_at = INF  # the poll that killed it; the next poll reaps it and billing ends
        self.views: dict[tuple[int, bool], tuple] = {}  # (load, accepting) -> Simulation._view_info

    def advance(self, t: float) -> None:
        start = max(self.last, self.stall)
        if self.live and t > start:
            self.P += (t - start) / self.st
        if t > self.last:
            self.last = t

    def progress_at(self, t: float) -> float:
        start = max(self.last, self.stall)
        return self.P + (t - start) / self.st if self.live and t > start else self.P

    def set_load(self) -> None:
        self.st = self.model.step_time(self.batch_size()) / self.speed

    def batch_size(self) -> int:
        """Sequences a decode step runs: the live ones, or a static engine's whole batch while it runs."""
        return max(1, self.batch_n if self.static and self.live else len(self.live))

    def rebase(self, t: float) -> None:
        """Restart the progress count while the engine holds nothing: P counts decode steps, and over
        a long replay a lifetime count grows until its float spacing exceeds the finish tolerance;
        an event then finds no progress and is scheduled again at the same instant, forever."""
        assert not self.live
        self.advance(t)
        self.P = 0.0
        self.heap.clear()


class Simulation:
    def __init__(
        self,
        spec: JobSpec,
        trace: AvailabilityTrace,
        policy: SimPolicy,
        trainer_offer: Offer,
        spot_offers: list[Offer],
        lengths: LengthModel | None = None,
        max_steps: int | None = None,
        horizon_s: float | None = None,
    ) -> None:
        self.spec, self.policy = spec, policy
        self.sim = spec.simulate
        # the local provider bills on the trace clock, which runs time_scale times the wall clock
        self.scale = spec.local.time_scale if provider_kind(spec.provider).billing_clock == "trace" else 1.0
        if spec.local.capacity_scale != 1.0:
            trace = trace.scaled(spec.local.capacity_scale)
        self.market = SpotMarket(trace, notice_fraction=spec.local.notice_fraction, seed=spec.algorithm.seed)
        self.trace = trace
        self.trainer_offer, self.spot_offers = trainer_offer, spot_offers if policy.spot else []
        self.lengths = lengths or scheduling.length_model(spec)
        self.max_steps = max_steps if max_steps is not None else spec.algorithm.steps
        # replay until: --hours, else the job's steps (the trace's last capacity holds on, as live),
        # else (no step limit) the end of the trace
        if horizon_s is None:
            horizon_s = self.sim.hours * 3600 if self.sim.hours else (INF if max_steps is None else trace.duration)
        self.horizon = horizon_s / self.scale  # sim seconds
        self.rng = random.Random(spec.algorithm.seed)  # backoff jitter
        self.task = replay_task(spec)  # never loads a model or a tokenizer
        self.prompt_rng = np.random.default_rng(spec.algorithm.seed)
        self.train_rate = scheduling.trainer_tokens_per_s(spec)
        # a synchronous step trains only after its last response
        self.overlap = scheduling.trains_while_generating(spec) and not policy.sync
        self.offload: OffloadPolicy = make_offload(
            policy.offload,
            train_tokens_per_s=self.train_rate,
            overlap=self.overlap,
            min_box_s=spec.rollout.offload_min_box_s,
        )
        self.cadence = scheduling.tick_cadence(spec)
        self.migration = scheduling.migration_config(spec) if policy.migration else None
        if policy.migration and self.migration is None:
            from rollout.policies.migration import MigrationConfig

            self.migration = MigrationConfig()
        self.batcher = (
            TailBatcher(spec.algorithm.prompts_per_step, spec.rollout.tail_over_launch)
            if policy.tail_batching
            else None
        )
        self.stats = LengthStats(spec.algorithm.max_new_tokens)
        self.placement = scheduling.placement_tracker(spec, self.spot_offers)
        self.objective = spec.rollout.objective if policy.objective == "job" else policy.objective
        self.fleet = scheduling.fleet_policy(spec, self.spot_offers)
        self.fleet_target = spec.rollout.max_workers
        self.deadline_at_risk = False
        self.trainer_busy_until = -INF
        self.coordinating_until = -INF
        self.works: dict[tuple, Work] = {}  # CPU work under way where cores are shared (simulator/cores.py)
        self.static_batch = spec.rollout.engine in STATIC_BATCH_ENGINES
        self.backoff = {o.key: CandidateBackoff() for o in self.spot_offers}
        self.events: list = []
        self.seq = 0
        self.now = 0.0
        self.engines: list[_Engine] = []
        # the engines not gone, in launch order: a long replay launches hundreds of workers, and every
        # event that looks at the fleet would otherwise walk all of them
        self.alive: list[_Engine] = []
        self.worker_seq = 0
        self.published = -1
        self.trainer_up = INF
        self.done = False
        self.end_t = INF
        # accounting
        self.bill: list[tuple[float, float, float, bool]] = []  # (start clock, end clock, $/h, spot)
        self.preemptions = 0
        self.migrations = 0
        self.restarted_tokens = 0
        self.trained_tokens = 0
        self.steps_done = 0
        self.first_step_t: float | None = None
        self.last_step_end = 0.0
        self.timeline: list[tuple[float, int, int]] = []
        self.step_log: list[dict] = []
        self._step = None
        self._pnow_key: tuple | None = None
        self._pnow = np.zeros(0)

    # ---- event plumbing ----------------------------------------------------------------
    def push(self, t: float, kind: str, payload=None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    def clock(self, t: float | None = None) -> float:
        """Trace/billing clock (seconds)."""
        return (self.now if t is None else t) * self.scale

    def run(self) -> SimResult:
        tb = self.sim.trainer_boot_s
        self.push(self.sim.boot_s if tb is None else tb, "trainer_up")
        self.push(0.0, "poll")
        # bound handlers looked up once: the loop runs once per event, hundreds of thousands of times
        on = {k[4:]: getattr(self, k) for k in dir(type(self)) if k.startswith("_on_")}
        events, horizon, pop = self.events, self.horizon, heapq.heappop
        cores = self.sim.cpu_cores
        while events and not self.done:
            t, _, kind, payload = pop(events)
            if t > horizon and kind != "end":
                self._finish(horizon)
                break
            self.now = t
            on[kind](payload)
            if cores:
                self._share_cores(cores)
        if not self.done:
            self._finish(self.now)
        return self._result()

    # ---- a local job's processes share this machine's cores ------------------------------
    def _share_cores(self, cores: float) -> None:
        """After every event: each busy process (a worker starting up, pulling weights or holding
        responses; the trainer warm-starting, training, or dispatching a batch's round trip) runs at
        min(1, cores / busy) of its rate alone. Engines and start-ups are re-timed when it changes;
        the trainer's training is timed as it starts, pulls and round trips are measured timings."""
        speed = share(cores, self._busy_engines() + self._trainer_busy())
        for key, w in self.works.items():
            if w.speed != speed:
                self.push(w.retime(self.now, speed), "work_done", (key, w.epoch))
        for e in self.alive:
            if e.speed != speed:
                if e.live:
                    e.advance(self.now)  # progress so far at the old speed
                e.speed = speed
                if e.live:
                    e.set_load()
                    self._schedule(e)

    def _start_work(self, key: tuple, seconds: float) -> None:
        """CPU work of `seconds` alone (a local job's start-up, the warm start); its end is
        _on_work_done. Without shared cores it is a plain delay, as on a cloud."""
        if not self.sim.cpu_cores:
            self.push(self.now + seconds, "work_done", (key, 0))
            return
        w = self.works[key] = Work(seconds, self.now)
        self.push(w.retime(self.now, 1.0), "work_done", (key, w.epoch))  # run() re-times it at once

    def _on_work_done(self, payload: tuple[tuple, int]) -> None:
        key, epoch = payload
        w = self.works.get(key)
        if w is not None:
            if w.epoch != epoch:
                return  # re-timed since
            del self.works[key]
        if key[0] == "warm":
            self._start_step()
        else:  # ("boot", engine index)
            self._connected(key[1])

    def _trainer_busy(self) -> bool:
        return max(self.trainer_busy_until, self.coordinating_until) > self.now or ("warm",) in self.works

    def _on_coordinated(self, _) -> None:
        pass  # a round trip is over: run's loop re-shares the cores

    def _busy_engines(self) -> int:
        return sum(1 for e in self.alive if e.live or e.state in ("booting", "pulling"))

    def _trainer_speed(self) -> float:
        """The trainer's share of a core for work it starts now."""
        cores = self.sim.cpu_cores
        return share(cores, self._busy_engines() + 1) if cores else 1.0

    # ---- trainer and steps -------------------------------------------------------------
    def _on_trainer_up(self, _) -> None:
        self.trainer_up = self.now
        self.bill_start_trainer = self.clock()
        self.published = 0
        if self.spec.rollout.trainer_engine:
            acc = scheduling.reserved_accelerator(self.spec)
            e = self._new_engine("reserved", "reserved", scheduling.engine_model_for(self.spec, acc), None)
            rb = self.sim.reserved_boot_s
            self._start_work(("boot", e.idx), self.sim.boot_s if rb is None else rb)
        if self.sim.warm_start_s > 0:  # billed and taking workers, but no step before the warm start
            self._start_work(("warm",), self.sim.warm_start_s)
        else:
            self._start_step()

    def _new_engine(self, eid: str, kind: str, model: EngineModel, offer: Offer | None) -> _Engine:
        e = _Engine(len(self.engines), eid, kind, model, offer, self.now, self.static_batch)
        self.engines.append(e)
        self.alive.append(e)
        return e

    def _connected(self, idx: int) -> None:
        e = self.engines[idx]
        if e.state == "gone":
            return
        if e.kind == "spot":
            self.placement.joined(e.id, self.clock())
        self._pull(e)

    def _pull(self, e: _Engine) -> None:
        e.state = "pulling"
        pull = self.sim.reserved_pull_s if e.kind == "reserved" else self.sim.pull_s
        if self.policy.sync and e.kind == "reserved":  # weights resharded into the engine, KV cache rebuilt
            pull = max(pull, SYNC_COSTS.weight_sync_s + SYNC_COSTS.wake_s)
        self.push(self.now + pull, "ready", (e.idx, self.published))

    def _on_ready(self, payload) -> None:
        idx, v = payload
        e = self.engines[idx]
        if e.state != "pulling" or v != self.published:
            return
        e.state, e.version = "ready", v
        if self._step is not None:
            self._step.changed = True
            self._step.next_offload_check = self.now  # the pool changed
        self._dispatch()

    def _start_step(self) -> None:
        spec, algo = self.spec, self.spec.algorithm
        k = self.steps_done
        rnd = None
        if self.batcher is not None:
            n_fresh = self.batcher.launch_count()
            rnd = self.batcher.next_round(self.task.sample(self.prompt_rng, n_fresh) if n_fresh else [])
            problems = rnd.prompts
        else:
            problems = self.task.sample(self.prompt_rng, algo.prompts_per_step)
        G = algo.group_size
        n = len(problems) * G
        s = _Step(k, self.now, n, G, rnd, problems)
        prompt_len = []  # response j = prompt j // G, sample j % G
        for prob in problems:
            prompt_len.extend([spec.rollout.synthetic.prompt_tokens or len(prob.prompt_ids)] * G)
        if n:
            full_arr = self._full_lengths(k, problems, G)
            s.end[:] = np.minimum(full_arr, algo.max_new_tokens)
            s.end_l = s.end.tolist()
            s.eos[:] = full_arr <= algo.max_new_tokens
            s.prompt_len[:] = prompt_len
        s.queue.extend(range(n))
        if self.policy.split:
            pool = [e for e in self.alive if e.state in ("ready", "pulling") and not e.victim]
            rates = [e.model.full_rate() for e in pool]
            total_rate = sum(rates)
            s.share = {e.idx: math.ceil(n * r / total_rate) for e, r in zip(pool, rates)}
            s.given = dict.fromkeys(s.share, 0)
        n_remote = sum(1 for e in self.alive if e.kind != "reserved" and e.state in ("ready", "pulling"))
        s.n_remote = n_remote
        self.offload.start_step(n_remote)
        if self.first_step_t is None:
            self.first_step_t = self.now
        for e in self.engines:  # indices are per step: nothing of the previous step may stay live
            assert not e.live, f"engine {e.id} still holds {sorted(e.live)[:5]} at step {k}"
            e.heap.clear()
        self._step = s
        s.prev_step_s = self.step_log[-1]["step_s"] if self.step_log else 0.0
        s.tick = self.cadence.period(s.prev_step_s, 0.0)
        self.push(self.now, "tick", k)
        self._dispatch()

    def _full_lengths(self, k: int, problems, G: int) -> np.ndarray:
        """Every response's full length this step (response j = prompt j // G, sample j % G). Each
        replay of a sweep draws the same prompts at the same step: the lengths are computed once per
        process (a sha256 per response) and looked up after."""
        seed = self.spec.algorithm.seed
        keys = tuple(prompt_key(prob.prompt_ids) for prob in problems)
        ck = (self.lengths, seed, k, G, keys)
        full = _LENGTHS_SEEN.get(ck)
        if full is None:
            out: list[int] = []
            for i, pkey in enumerate(keys):
                seeds = [request_seed(seed, request_id(k, i, g)) for g in range(G)]
                out.extend(self.lengths.lengths_from_key(pkey, seeds))
            full = np.asarray(out, np.int64)
            full.flags.writeable = False
            if len(_LENGTHS_SEEN) >= _LENGTHS_SEEN_MAX:
                _LENGTHS_SEEN.clear()
            _LENGTHS_SEEN[ck] = full
        return full

    def _on_tick(self, k: int) -> None:
        s = self._step
        if s is None or s.k != k or s.gen_end is not None:
            return
        reserved = [e for e in self.alive if e.kind == "reserved"]
        d = offload_tick(  # the coordinator's decision, on this clock
            self.offload,
            self.now,
            offload_at=s.offload_at,
            next_check=s.next_offload_check,
            has_reserved=bool(reserved),
            remote_ready=any(e.kind != "reserved" and e.state == "ready" for e in self.alive),
            progress=lambda: self._progress(s, reserved),
        )
        s.next_offload_check = d.next_check
        if d.action == "offload":
            self._offload(s, reserved)
        elif d.action == "resume":
            for e in self.engines:
                e.offloaded = False  # every remote engine is gone: the trainer's engine generates again
        s.ticks += 1
        s.tick = self.cadence.period(s.prev_step_s, self.now - s.t0)
        if self.migration is not None and self.cadence.migrate_now(
            queue_empty=not s.queue, changed=s.changed, tick=s.ticks
        ):
            s.changed = False
            self._migrate(s)
        self._dispatch()
        self.push(self.now + s.tick, "tick", k)

    # ---- dispatch ----------------------------------------------------------------------
    def _accepting(self, e: _Engine) -> bool:
        return e.state == "ready" and e.version == self.published and not e.offloaded and not (e.static and e.live)

    def _dispatch(self) -> None:
        s = self._step
        if s is None or not s.queue or s.gen_end is not None:
            return
        v = self.published  # self._accepting(e), inlined: this scan runs on every refill
        open_e = [
            e
            for e in self.alive
            if e.state == "ready" and e.version == v and not e.offloaded and len(e.live) < (1 if e.static else e.cap)
        ]
        if not open_e:
            return
        if s.share is not None and self._dispatch_shares(s, open_e):
            return
        free = sum(e.cap - len(e.live) for e in open_e)
        head: list[int] = []
        seen: set[int] = set()  # a response requeued twice sits in the queue twice: place it once
        while s.queue and len(head) < free:
            i = s.queue.popleft()
            if not s.done[i] and s.eng[i] < 0 and i not in seen:
                head.append(i)
                seen.add(i)
        if not head:
            return
        if len(head) == free and all(s.held[i] == 0 for i in head):
            # every free slot fills and the requests are alike: any policy gives the same placement
            plan, it = [], iter(head)
            for e in open_e:
                plan.extend((i, e) for _, i in zip(range(e.cap - len(e.live)), it))
        else:
            views = [self._view(e) for e in open_e]
            by_id = {e.id: e for e in open_e}
            reqs = self._req_views(s, head)
            avoid = {str(i): {s.left_from[i]} for i in head if s.left_from.get(i)}
            got = plan_dispatch(reqs, views, self.policy.dispatch, avoid=avoid)
            plan = [(int(rid), by_id[eid]) for rid, eid in got]
            placed = {i for i, _ in plan}
            s.queue.extendleft(reversed([i for i in head if i not in placed]))
        by_engine: dict[int, list[int]] = {}
        for i, e in plan:
            by_engine.setdefault(e.idx, []).append(i)
        for idx, items in by_engine.items():
            self._admit(self.engines[idx], s, items)

    def _dispatch_shares(self, s: _Step, open_e: list[_Engine]) -> bool:
        """`split` baseline: each engine takes up to its share of the step; True when handled (the
        queue waits for an engine still pulling the step's weights). Once every live engine has had
        its share, what is left (responses restarted after a loss) goes to any open engine."""
        room = {e.idx: min(e.cap - len(e.live), s.share.get(e.idx, 0) - s.given.get(e.idx, 0)) for e in open_e}
        if not any(v > 0 for v in room.values()):
            pending = any(s.given[i] < s.share[i] and self.engines[i].state in ("ready", "pulling") for i in s.share)
            return pending
        by_engine: dict[int, list[int]] = {}
        targets = [e for e in open_e if room[e.idx] > 0]
        seen: set[int] = set()
        while s.queue and targets:
            i = s.queue.popleft()
            if s.done[i] or s.eng[i] >= 0 or i in seen:
                continue
            seen.add(i)
            e = targets[0]
            by_engine.setdefault(e.idx, []).append(i)
            room[e.idx] -= 1
            s.given[e.idx] = s.given.get(e.idx, 0) + 1
            if room[e.idx] <= 0:
                targets.pop(0)
        for idx, items in by_engine.items():
            self._admit(self.engines[idx], s, items)
        return True

    def _admit(self, e: _Engine, s: _Step, items: list[int]) -> None:
        if not e.live:
            e.rebase(self.now)
            e.batch_n = len(items)
            self._pnow_key = None  # cached progress of this instant no longer holds
        else:
            e.advance(self.now)
        P, now, heap, tgts, left_from = e.P, self.now, e.heap, s.tgt, s.left_from
        if len(items) <= 4:
            # a few responses (the usual refill, a migrated one): numpy's per-call cost would dominate;
            # the same arithmetic on Python scalars gives the same floats
            ctx = 0
            for i in items:
                held_i = int(s.held[i])
                t = P + (s.end_l[i] - held_i)
                s.eng[i] = e.idx
                s.pos0[i] = held_i
                s.p0[i] = P
                s.admit_t[i] = now
                tgts[i] = t
                left_from.pop(i, None)
                heapq.heappush(heap, (t, i))
                ctx += int(s.prompt_len[i]) + held_i
        else:
            # one array operation per field (items are distinct: dispatch places each response once)
            idx = np.asarray(items, dtype=np.int64)
            held = s.held[idx]
            tgt = P + (s.end[idx] - held)
            s.eng[idx] = e.idx
            s.pos0[idx] = held
            s.p0[idx] = P
            s.admit_t[idx] = now
            for i, t in zip(items, tgt.tolist()):
                tgts[i] = t
                left_from.pop(i, None)
                heapq.heappush(heap, (t, i))
            ctx = int((s.prompt_len[idx] + held).sum())
        e.live.update(items)
        # a static engine's batch starts once its requests have made the round trip (dispatch_s)
        start = self.now
        if e.static and self.sim.dispatch_s:
            start += self.sim.dispatch_s
            if self.sim.cpu_cores:  # the round trip is the coordinator's work too: see _share_cores
                self.coordinating_until = max(self.coordinating_until, start)
                self.push(start, "coordinated")
        e.stall = max(e.stall, start) + e.model.prefill_time(ctx) / e.speed
        e.set_load()
        self._schedule(e)

    def _schedule(self, e: _Engine) -> None:
        e.epoch += 1
        s = self._step
        heap, live = e.heap, e.live
        if s is None:
            heap.clear()
            return
        tgt = s.tgt
        while heap and (heap[0][1] not in live or tgt[heap[0][1]] != heap[0][0]):  # stale entries
            heapq.heappop(heap)
        if not heap:
            return
        start = max(self.now, e.stall, e.last)
        p = e.progress_at(start)
        first = heap[0][0]
        t = start + max(0.0, first - p) * e.st
        if t <= start and first > p + 1e-9:
            # the rest is below the clock's float spacing (late in a long replay): one tick later
            # makes progress, where the same instant would be scheduled again and again
            t = math.nextafter(start, INF)
        self.seq += 1  # self.push, inlined: once per engine event
        heapq.heappush(self.events, (t, self.seq, "engine", (e.idx, e.epoch)))

    def _on_engine(self, payload) -> None:
        idx, epoch = payload
        e = self.engines[idx]
        if epoch != e.epoch or e.state == "gone":
            return
        s = self._step
        e.advance(self.now)
        finished = []
        heap, live, done_at, tgts, pop = e.heap, e.live, e.P + 1e-9, s.tgt, heapq.heappop
        while heap and heap[0][0] <= done_at:
            tgt, i = pop(heap)
            # discard at once: a response that left and came back to this engine can have two heap
            # entries with the same target (its progress counter moved by exactly what it generated)
            if i in live and tgts[i] == tgt:
                live.discard(i)
                finished.append(i)
        for i in finished:
            self._complete(s, i)
        if finished:
            s.changed = True
        n = e.batch_n if e.static and live else len(live)  # e.set_load(), inlined: once per engine event
        e.st = e.model.step_time(max(1, n)) / e.speed
        self._schedule(e)
        if finished:
            self._after_completions(s)

    def _complete(self, s: _Step, i: int) -> None:
        assert not s.done[i], f"response {i} of step {s.k} completed twice"  # would end the replay early
        end = s.end_l[i]
        s.done[i] = True
        s.eng[i] = -1
        s.held[i] = end
        s.open -= 1
        self.stats.add((end,))
        g = i // s.G
        s.group_left[g] -= 1
        if s.group_left[g] == 0:
            s.groups_done.append(g)
            s.completed_groups += 1
            self._train_more(s)

    def _after_completions(self, s: _Step) -> None:
        if s.rnd is not None and not s.rnd.long and s.completed_groups >= s.rnd.keep and s.open > 0:
            self._abandon(s)
        if s.open == 0:
            self._generation_done(s)
        else:
            self._dispatch()

    # ---- offload, migration, preemption: requeue with tokens held -------------------------
    def _requeue(self, s: _Step, i: int, keep_tokens: bool = True) -> None:
        eng = int(s.eng[i])
        if eng < 0 or s.done[i]:  # completed in the meantime (a plan made at the same instant)
            return
        e = self.engines[eng]
        e.advance(self.now)
        end = s.end_l[i]
        gen = min(end, int(s.pos0[i]) + math.floor(e.P - float(s.p0[i]) + 1e-9))
        e.live.discard(i)
        s.eng[i] = -1
        if keep_tokens:
            if gen > 0:
                self.migrations += 1
            s.held[i] = gen
        else:
            self.restarted_tokens += gen
            s.held[i] = 0
        if gen >= end:
            self._complete(s, i)
        else:
            s.queue.appendleft(i)

    def _view(self, e: _Engine) -> EngineView:
        return self._view_info(e)[0]

    def _view_info(self, e: _Engine) -> tuple[EngineView, bool, float, float, float]:
        """An engine's view, whether it is a migration target (accepting, a slot free), the view's
        seq_time one sequence more and prefill_s(1) (as a target), and its seq_time now (as a source)."""
        n = len(e.live)
        key = (n, self._accepting(e))
        info = e.views.get(key)
        if info is None:  # an engine's view depends on its load and whether it accepts, nothing else
            v = _MemoView(e.id, e.kind, e.cap, n, e.model.rate(n) if n else 0.0, e.model, key[1])
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
        key = (self.now, self.seq)
        if self._pnow_key != key:
            # responses are held by engines not gone: the hundreds gone over a long replay are skipped
            now, pnow = self.now, [0.0] * len(self.engines)
            for e in self.alive:
                pnow[e.idx] = e.progress_at(now)
            self._pnow = np.array(pnow)
            self._pnow_key = key
        return self._pnow

    def _generated(self, s: _Step, idx: np.ndarray) -> np.ndarray:
        eng = s.eng[idx]
        held = s.held[idx].astype(np.float64)
        on = eng >= 0
        if _any(on):
            pnow = self._progress_now()
            gen = s.pos0[idx] + np.floor(pnow[np.where(on, eng, 0)] - s.p0[idx] + 1e-9)
            held = np.where(on, np.minimum(gen, s.end[idx]), held)
        return held

    def _req_views(self, s: _Step, items: list[int]) -> list[ReqView]:
        idx = np.asarray(items, dtype=np.int64)
        gen = self._generated(s, idx)
        left = self.spec.algorithm.max_new_tokens - gen
        return self._req_views_of(s, idx, gen, left, self.stats.expected_remaining(gen, left))

    def _req_views_of(
        self, s: _Step, idx: np.ndarray, gen: np.ndarray, left: np.ndarray, exp: np.ndarray
    ) -> list[ReqView]:
        """ReqViews of responses idx whose generated tokens, budget left and expected rest are known."""
        since = self.now - s.admit_t[idx]
        # whole numbers held as floats: the int64 cast truncates as int() did
        cols = (
            gen.astype(np.int64).tolist(),
            left.astype(np.int64).tolist(),
            s.prompt_len[idx].tolist(),
            exp.tolist(),
            since.tolist(),
        )
        return [ReqView(str(i), g, b, p, x, None, d) for i, g, b, p, x, d in zip(idx.tolist(), *cols)]

    def _progress(self, s: _Step, reserved: list[_Engine]) -> StepProgress:
        """What the offload policy sees (the coordinator's `progress`, from modelled engines)."""
        remote = [e for e in self.alive if e.kind != "reserved" and self._accepting(e)]
        open_idx = np.nonzero(~s.done)[0]
        gen = self._generated(s, open_idx)
        on_reserved = np.isin(s.eng[open_idx], [e.idx for e in reserved])
        return step_progress(
            elapsed=self.now - s.t0,
            # a modelled engine's measured rate is its model's: given as unmeasured, so that
            # remote_rates takes the model's own numbers (not a measurement scaled back and forth)
            remote=[EngineView(e.id, e.kind, e.cap, len(e.live), 0.0, e.model, True) for e in remote],
            generated=gen,
            budget_left=self.spec.algorithm.max_new_tokens - gen,
            held_tokens=float(s.held[s.done].sum() + gen.sum()),
            reserved_context=float((s.prompt_len[open_idx] + gen)[on_reserved].sum()),
            reserved_rate=sum(e.model.rate(len(e.live)) for e in reserved),
            stats=self.stats,
        )

    def _offload(self, s: _Step, reserved: list[_Engine]) -> None:
        s.offload_at = self.now
        for e in reserved:
            e.offloaded = True
            for i in sorted(e.live):
                self._requeue(s, i)
            e.set_load()
            self._schedule(e)
        self._train_more(s)
        if s.open == 0:
            self._generation_done(s)

    def _migrate(self, s: _Step) -> None:
        # one pass over the fleet: every view, and the fastest target's seq_time and prefill
        infos = [self._view_info(e) for e in self.alive]
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
        now, max_new = self.now, self.spec.algorithm.max_new_tokens
        asked = False
        sources = []  # (view, seq_time, responses, seconds on the engine, generated, budget left)
        for (v, _, _, _, st), e in zip(infos, self.alive):
            if v.active == 0 or st <= best * (1 + cfg.min_gain_frac):
                continue
            asked = True
            live = np.fromiter(e.live, np.int64, len(e.live))
            on_engine_s = now - s.admit_t[live]
            # worth_a_look passes none that has not settled (min_on_engine_s): predict only the others
            settled = on_engine_s >= cfg.min_on_engine_s
            if not _any(settled):
                continue
            live, on_engine_s = live[settled], on_engine_s[settled]
            gen = self._generated(s, live)
            sources.append((v, st, live, on_engine_s, gen, max_new - gen))
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
        for (v, st, live, on_engine_s, gen, left), exp in zip(sources, exps):
            keep = worth_a_look(exp, st, on_engine_s, cfg) & may_gain(
                exp, s.prompt_len[live] + gen, st, best, min_prefill, cfg
            )
            if _any(keep):  # the kept ones' views from the same (elementwise) numbers
                running[v.id] = self._req_views_of(s, live[keep], gen[keep], left[keep], exp[keep])
        if not running:
            return
        moves = plan_migrations(views, running, len(s.queue), cfg)
        by_id = {e.id: e for e in self.alive}
        for rid, src in moves:
            i = int(rid)
            if s.eng[i] == by_id[src].idx:
                self._requeue(s, i)
                s.left_from[i] = src
        for src in {src for _, src in moves}:
            by_id[src].set_load()
            self._schedule(by_id[src])

    def _abandon(self, s: _Step) -> None:
        """Tail batching: the round has its groups; drop everything else."""
        unfinished_groups = set()
        for i in np.nonzero(~s.done)[0].tolist():
            if s.eng[i] >= 0:
                e = self.engines[s.eng[i]]
                e.advance(self.now)
                self.restarted_tokens += min(int(s.end[i]), int(s.pos0[i] + math.floor(e.P - s.p0[i] + 1e-9)))
                e.live.discard(i)
                s.eng[i] = -1
            else:
                self.restarted_tokens += int(s.held[i])
            s.done[i] = True
            s.dropped[i] = True
            unfinished_groups.add(i // s.G)
        s.open = 0
        for e in self.engines:
            e.set_load()
            self._schedule(e)
        self.batcher.close_round(s.rnd, [s.problems[g] for g in sorted(unfinished_groups)])

    # ---- training ----------------------------------------------------------------------
    def _train_more(self, s: _Step) -> None:
        """Overlapped training: once offloaded, the trainer trains finished groups one by one."""
        if not may_train_group(self.overlap, s.offload_at, s.gen_end) or s.train_busy_until > self.now:
            return
        self._group_trained(s)  # one that ended at this very instant, before its event was handled
        if not s.groups_done:
            return
        g = s.groups_done.popleft()
        tokens = int(s.end[g * s.G : (g + 1) * s.G].sum())
        rate = self.train_rate * self._trainer_speed()
        dt = tokens / rate
        s.busy.append((self.now, self.now + dt))
        s.groups_started += 1
        s.group_training = (self.now, tokens, s.groups_started, rate)
        s.train_busy_until = self.trainer_busy_until = self.now + dt
        self.push(s.train_busy_until, "trained", (s.k, s.groups_started))

    def _group_trained(self, s: _Step) -> None:
        if s.group_training is not None and s.train_busy_until <= self.now:
            s.pretrained += s.group_training[1]
            s.group_training = None

    def _on_trained(self, payload: tuple[int, int]) -> None:
        k, gid = payload
        s = self._step
        if s is None or s.k != k or s.gen_end is not None:
            return
        if s.group_training is not None and s.group_training[2] == gid:
            self._group_trained(s)
        self._train_more(s)

    def _generation_done(self, s: _Step) -> None:
        s.gen_end = self.now
        kept = ~s.dropped
        total = int(s.end[kept].sum())
        if s.group_training is not None:  # a group was mid-training (or just done): keep the part done
            started, tokens, _, rate = s.group_training
            s.pretrained += trained_part(tokens, started, self.now, rate)
            s.group_training = None
            a, b = s.busy[-1]
            s.busy[-1] = (a, min(b, self.now))
        left = left_to_train(total, s.pretrained, self.overlap)
        t_train_end = self.now + left / (self.train_rate * self._trainer_speed())
        if self.policy.sync:  # old-logprob + ref forward passes before training (the KV-cache free is
            # in simulate.step_overhead_s, as for rlboost's trainer, whose engine shares its GPUs too)
            t_train_end += SYNC_COSTS.forward_s(total, self.train_rate)
        s.busy.append((self.now, t_train_end))
        self.trainer_busy_until = t_train_end
        self.push(t_train_end + self.sim.step_overhead_s, "step_end", (s.k, total))

    def _on_step_end(self, payload) -> None:
        k, total = payload
        s = self._step
        busy_tail = busy_between(s.busy, s.offload_at, s.gen_end)
        outcome = StepOutcome.from_marks(
            s.n_remote, s.t0, self.now, s.gen_end, s.offload_at, busy_tail, total, busy_total(s.busy)
        )
        self.offload.end_step(outcome)
        if self.objective is not None and self.spot_offers:
            self._size_fleet(s, outcome, total)
        self.step_log.append(
            {
                "step": k,
                "t0": round(s.t0, 3),
                "step_s": round(outcome.step_s, 3),
                "gen_s": round(outcome.gen_s, 3),
                "box_s": None if outcome.box_s is None else round(outcome.box_s, 3),
                "trainer_idle_s": round(outcome.trainer_idle_s, 3),
                "remote_idle_s": round(outcome.remote_idle_s, 3),
                "n_remote": s.n_remote,
                "tokens": total,
                "long": bool(s.rnd.long) if s.rnd is not None else False,
            }
        )
        self.trained_tokens += total
        self.steps_done += 1
        self.last_step_end = self.now
        self._step = None
        self.published += 1
        for e in self.engines:
            e.offloaded = False
            if e.state in ("ready", "pulling"):
                self._pull(e)
        self._sample()
        if self.steps_done >= self.max_steps:
            # the controller sees `done` at its next poll and tears everything down
            self.push(self.now + self.sim.poll_s / 2, "end")
            return
        self._start_step()

    def _on_end(self, _) -> None:
        self._finish(self.now)

    # ---- the controller: market replay and reconcile (as rlboost_cli/controller.py) -----
    def _on_poll(self, _) -> None:
        t = self.now
        T = self.clock()
        # as LocalProvider.poll: reap what died since the last poll (billing ends now), then kill the
        # noticed victims whose lead time is over, then replay the market
        for e in list(self.alive):  # _gone takes reaped engines out of self.alive
            if e.kind == "spot" and e.state != "gone" and e.killed_at < t:
                self._gone(e, preempted=True)
        for e in self.alive:
            if e.kind == "spot" and e.state != "gone" and e.killed_at == INF and e.kill_at <= t:
                e.killed_at = t
                if e.state != "draining":
                    self._lose(e, drained=False)
        running = [e for e in self.alive if e.kind == "spot" and not e.victim]
        for iid, notice in self.market.choose_victims(T, [e.id for e in running]):
            e = next(x for x in running if x.id == iid)
            e.victim = True
            self.preemptions += 1
            lead = self.spec.local.notice_seconds
            if notice and lead > 0:
                e.noticed = True
                e.kill_at = t + lead
                self.push(t + 0.05, "drain", e.idx)  # the worker sees the notice file and drains
            else:
                e.kill_at = e.killed_at = t
                self._lose(e, drained=False)
        if self.trainer_up <= t and not self.done and self.policy.spot:
            self._reconcile(t, T)
        self._sample()
        self.push(self._next_poll(t), "poll")

    def _next_poll(self, t: float) -> float:
        """The next poll that can change anything (the live controller polls every poll_s; polls in
        between are no-ops here, so they are skipped)."""
        p = self.sim.poll_s
        cand = []
        if self.trainer_up > t:
            cand.append(t + p)
        elif self._want() > 0 and self.spot_offers:
            cand.append(max(t + p, min(b.until for b in self.backoff.values())))
        for e in self.alive:
            if e.kind == "spot" and e.kill_at < INF:
                cand.append(t + p if e.killed_at < INF else max(t + p, e.kill_at))
        nxt = self.trace.next_change(self.clock(t))
        if nxt is not None:
            cand.append(nxt / self.scale)
        if not cand:
            return t + 3600.0 * 24 * 365
        target = min(cand)
        steps = max(1, math.ceil((target - t) / p - 1e-9))
        return t + steps * p

    def _want(self) -> int:
        live = [e for e in self.alive if e.kind == "spot" and not e.noticed]
        return self.fleet_target - len(live) if self.policy.spot else 0

    def _size_fleet(self, s: _Step, outcome: StepOutcome, tokens: int) -> None:
        """After a step, as the controller: the fleet policy picks the size; surplus workers (idle
        between steps) are released, newest first."""
        best = self.placement.order(self.spot_offers, self.clock())[0]
        sample = StepSample(s.n_remote, outcome.step_s, outcome.gen_s, outcome.train_busy_s, tokens)
        d = self.fleet.decide(
            sample,
            fleet_goal(
                self.spec,
                self.objective,
                FleetClock(self.steps_done + 1, self.clock(), self._spent(), self.placement.boot_estimate_s()),
            ),
            self.trainer_offer.hourly_price,
            best.hourly_price,
            current=self.fleet_target,
            useful=self.placement.useful(best, self.clock()),
        )
        self.fleet_target = d.workers
        self.deadline_at_risk = self.deadline_at_risk or d.deadline_at_risk
        live = [e for e in self.alive if e.kind == "spot" and not e.noticed]
        for e in sorted(live, key=lambda e: -e.started)[: max(0, len(live) - d.workers)]:
            self._gone(e, preempted=False)

    def _spent(self) -> float:
        """Dollars so far, on the billing clock."""
        now = self.clock()
        closed = sum((b - a) / 3600 * p for a, b, p, _ in self.bill)
        open_ = sum(
            (now - e.started) / 3600 * (e.offer.hourly_price if e.offer else 0.0)
            for e in self.alive
            if e.kind == "spot"
        )
        return closed + open_ + (now - self.bill_start_trainer) / 3600 * self.trainer_offer.hourly_price

    def _reconcile(self, t: float, T: float) -> None:
        """The controller's reconcile (rollout/policies/reconcile.py), launching into the replayed market."""

        def launch(offer: Offer) -> bool:
            self.worker_seq += 1
            iid = f"w{self.worker_seq:05d}"
            alive = sum(1 for e in self.alive if e.kind == "spot" and not e.victim)
            if alive >= self.market.capacity(T):
                self.placement.capacity_failure(offer.key)
                return False
            # a replayed instance runs as soon as the market grants it: the provider's RUNNING, for
            # which the controller resets the candidate's backoff
            self.backoff[offer.key].ok()
            model = scheduling.engine_model_for(self.spec, offer.accelerator)
            e = self._new_engine(iid, "spot", model, offer)
            e.started = T
            self.placement.launched(iid, offer.key, T)
            self._start_work(("boot", e.idx), self.sim.boot_s)
            return True

        order = self.placement.order(self.spot_offers, T)
        reconcile_fleet(self._want(), order, self.backoff, t, launch, rng=self.rng)

    def _on_drain(self, idx: int) -> None:
        e = self.engines[idx]
        if e.state != "gone":
            self._lose(e, drained=True)

    def _lose(self, e: _Engine, drained: bool) -> None:
        """The coordinator takes back everything the engine held (drained: all tokens flushed)."""
        s = self._step
        keep = not self.policy.restart  # token-level resume, or (baseline) start over
        if s is not None and e.live:
            for i in sorted(e.live):
                self._requeue(s, i, keep_tokens=keep)
            e.live.clear()
            e.set_load()
            if s.open == 0 and s.gen_end is None:
                self._generation_done(s)
        e.state = "draining"
        e.epoch += 1
        self._dispatch()

    def _gone(self, e: _Engine, preempted: bool) -> None:
        if e.state not in ("draining", "gone"):
            self._lose(e, drained=False)
        e.state = "gone"
        self.alive.remove(e)
        self.bill.append((e.started, self.clock(), e.offer.hourly_price if e.offer else 0.0, True))
        self.placement.ended(e.id, self.clock(), preempted)

    def _sample(self) -> None:
        # held = booting or serving; a draining worker is on its way out (its replacement may already boot)
        live = sum(1 for e in self.alive if e.kind == "spot" and e.state != "draining")
        if not self.timeline or self.timeline[-1][1] != live or self.timeline[-1][2] != self.trained_tokens:
            self.timeline.append((self.now, live, self.trained_tokens))

    def _finish(self, t: float) -> None:
        if self.done:
            return
        self.done = True
        self.now = t
        self.end_t = t
        for e in self.engines:
            if e.kind == "spot" and e.state != "gone":
                e.state = "gone"
                self.bill.append((e.started, self.clock(), e.offer.hourly_price if e.offer else 0.0, True))
        self.alive = [e for e in self.alive if e.state != "gone"]
        if self.trainer_up < INF:
            self.bill.append((self.bill_start_trainer, self.clock(), self.trainer_offer.hourly_price, False))
        self._sample()

    def _result(self) -> SimResult:
        spot = sum((b - a) / 3600 * p for a, b, p, is_spot in self.bill if is_spot)
        trainer = sum((b - a) / 3600 * p for a, b, p, is_spot in self.bill if not is_spot)
        run_s = (self.last_step_end - self.first_step_t) if self.first_step_t is not None and self.steps_done else 0.0
        return SimResult(
            policy=self.policy,
            steps=self.steps_done,
            run_s=run_s,
            job_s=self.end_t,
            trained_tokens=self.trained_tokens,
            dollars=spot + trainer,
            spot_dollars=spot,
            trainer_dollars=trainer,
            preemptions=self.preemptions,
            migrations=self.migrations,
            restarted_tokens=self.restarted_tokens,
            time_scale=self.scale,
            timeline=self.timeline,
            step_log=self.step_log,
        )


class _Step:
    """One step's responses as arrays (index i = prompt i // G, sample i % G)."""

    def __init__(self, k: int, t0: float, n: int, G: int, rnd, problems) -> None:
        self.k, self.t0, self.G, self.rnd, self.problems = k, t0, G, rnd, problems
        self.end = np.zeros(n, np.int64)
        self.end_l: list[int] = [0] * n  # the same, read per response where numpy's element read is slow
        self.eos = np.zeros(n, bool)
        self.prompt_len = np.zeros(n, np.int64)
        self.eng = np.full(n, -1, np.int64)
        self.pos0 = np.zeros(n, np.int64)
        self.held = np.zeros(n, np.int64)
        self.p0 = np.zeros(n, np.float64)
        # the engine progress at which each response ends, as a list: read once per heap entry, where
        # a numpy element read costs more than the comparison itself
        self.tgt: list[float] = [0.0] * n
        self.admit_t = np.zeros(n, np.float64)
        self.done = np.zeros(n, bool)
        self.dropped = np.zeros(n, bool)
        self.left_from: dict[int, str] = {}
        self.queue: deque[int] = deque()
        self.open = n
        self.group_left = [G] * (n // G)
        self.groups_done: deque[int] = deque()
        self.completed_groups = 0
        self.offload_at: float | None = None
        self.gen_end: float | None = None
        self.n_remote = 0
        self.tick = 0.1
        self.ticks = 0
        self.prev_step_s = 0.0
        self.changed = False  # a slot freed up or an engine joined since the last migration round
        self.next_offload_check = 0.0
        self.busy: list[tuple[float, float]] = []
        self.share: dict[int, int] | None = None  # `split` baseline: responses per engine this step
        self.given: dict[int, int] = {}
        self.pretrained = 0  # tokens trained during generation (whole groups, and the cut-short part)
        # (start, tokens, id, tokens/s) of the group in training
        self.group_training: tuple[float, int, int, float] | None = None
        self.groups_started = 0
        self.train_busy_until = 0.0


def simulate_job(
    spec: JobSpec,
    trace: AvailabilityTrace,
    policies: list[SimPolicy],
    trainer_offer: Offer,
    spot_offers: list[Offer],
    *,
    lengths: LengthModel | None = None,
    max_steps: int | None = None,
    horizon_s: float | None = None,
) -> list[SimResult]:
    """Replay the job once per policy (each from the same start: same prompts, same market)."""
    return [
        Simulation(spec, trace, p, trainer_offer, spot_offers, lengths, max_steps, horizon_s).run() for p in policies
    ]
