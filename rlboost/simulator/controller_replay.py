"""The controller's side of a replay (rlboost/cli/controller.py on the replayed market): polls, the spot
market's preemptions and notices, reconcile, the fleet's size, and the bill.

Run for real: SpotMarket.choose_victims (which instances a trace's capacity drop takes, and which get
a notice), reconcile_fleet with CandidateBackoff, PlacementTracker (order, learned boot time),
FleetPolicy.decide through fleet_goal. Modelled: a launch runs as soon as the market has room, boots
in `simulate.boot_s`, and is billed from launch to the poll that sees it gone.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from rlboost.contracts.spec import JobSpec
from rlboost.providers.pricing import Offer
from rlboost.providers.spot_market import AvailabilityTrace, SpotMarket
from rlboost.rollout import scheduling
from rlboost.rollout.policies.fleet import StepSample, surplus
from rlboost.rollout.policies.offload import StepOutcome
from rlboost.rollout.policies.reconcile import CandidateBackoff, reconcile_fleet
from rlboost.rollout.scheduling import FleetClock
from rlboost.simulator.engines import ModelledEngine
from rlboost.simulator.events import INF
from rlboost.simulator.presets import SimPolicy
from rlboost.simulator.step_state import StepState
from rlboost.simulator.trainer_replay import TrainerHooks, TrainerReplay

_NEVER_S = 3600.0 * 24 * 365  # the next poll when nothing can change


@dataclass(frozen=True)
class Offers:
    """What the replay pays: the trainer's on-demand offer and the spot candidates."""

    trainer: Offer
    spot: list[Offer]


class ControllerReplay:
    """Watches the trainer (and through it the coordinator and the fleet), as the live controller
    watches the trainer's status."""

    def __init__(
        self, spec: JobSpec, policy: SimPolicy, market: SpotMarket, offers: Offers, trainer: TrainerReplay, scale: float
    ) -> None:
        self.spec, self.policy, self.market, self.scale = spec, policy, market, scale
        self.trace: AvailabilityTrace = market.trace
        self.trainer = trainer
        self.q, self.cores, self.pool = trainer.q, trainer.cores, trainer.pool
        self.fleet = trainer.fleet
        self.sim = spec.simulate
        self.trainer_offer = offers.trainer
        self.spot_offers = offers.spot if policy.spot else []
        self.rng = random.Random(spec.algorithm.seed)  # backoff jitter
        self.placement = scheduling.placement_tracker(spec, self.spot_offers)
        objective = spec.rollout.objective if policy.objective == "job" else policy.objective
        # None: a fixed fleet (max_workers always)
        self.sizer = (
            scheduling.fleet_sizer(
                spec, objective, self.trainer_offer.hourly_price, self.spot_offers, self.placement, self.sim.cpu_cores
            )
            if objective is not None and self.spot_offers
            else None
        )
        self.fleet_target = self.sizer.max_workers if self.sizer else spec.rollout.max_workers
        self.backoff = {o.key: CandidateBackoff() for o in self.spot_offers}
        self.worker_seq = 0
        self.bill: list[tuple[float, float, float, bool]] = []  # (start clock, end clock, $/h, spot)
        self.preemptions = 0
        self.timeline: list[tuple[float, int, int]] = []  # (t, spot workers held, tokens trained)
        self.trainer.hooks = TrainerHooks(self.step_trained, self.sample)
        self._poll_at = INF  # the one poll scheduled; an earlier one supersedes it
        q = self.q
        q.on("poll", self.on_poll)
        q.on("drain", self.on_drain)

    def clock(self, t: float | None = None) -> float:
        """The billing clock (seconds): the trace's, which runs `scale` times the replay's for a local job."""
        return (self.q.now if t is None else t) * self.scale

    # ---- polls: the market, then reconcile ----------------------------------------------------
    def schedule_poll(self, at: float) -> None:
        """Poll at `at` unless a poll is due sooner; a later one already scheduled is superseded."""
        if at < self._poll_at:
            self._poll_at = at
            self.q.push(at, "poll", at)

    def on_poll(self, at: float) -> None:
        if at != self._poll_at:
            return  # superseded by an earlier poll, which scheduled its own next one
        self._poll_at = INF
        t = self.q.now
        T = self.clock()
        alive = self.fleet.alive
        # as LocalProvider.poll: reap what died since the last poll (billing ends now), then kill the
        # noticed victims whose lead time is over, then replay the market
        for e in list(alive):  # gone() takes reaped engines out of the fleet
            if e.kind == "spot" and e.state != "gone" and e.killed_at < t:
                self.gone(e, preempted=True)
        for e in alive:
            if e.kind == "spot" and e.state != "gone" and e.killed_at == INF and e.kill_at <= t:
                e.killed_at = t
                if e.state != "draining":
                    self.pool.lose(e, drained=False)
        running = [e for e in alive if e.kind == "spot" and not e.victim]
        for iid, notice in self.market.choose_victims(T, [e.id for e in running]):
            e = next(x for x in running if x.id == iid)
            e.victim = True
            self.preemptions += 1
            lead = self.spec.local.notice_seconds
            if notice and lead > 0:
                e.noticed = True
                e.kill_at = t + lead
                self.q.push(t + 0.05, "drain", e.idx)  # the worker sees the notice file and drains
            else:
                e.kill_at = e.killed_at = t
                self.pool.lose(e, drained=False)
        if self.trainer.up_at <= t and self.policy.spot:
            self._reconcile(t, T)
        self.sample()
        self.schedule_poll(self._next_poll(t))

    def _next_poll(self, t: float) -> float:
        """The next poll that can change anything (the live controller polls every poll_s; polls in
        between are no-ops here, so they are skipped)."""
        p = self.sim.poll_s
        cand = []
        if self.trainer.up_at > t:
            cand.append(t + p)
        elif self.want() > 0 and self.spot_offers:
            cand.append(max(t + p, min(b.until for b in self.backoff.values())))
        for e in self.fleet.alive:
            if e.kind == "spot" and e.kill_at < INF:
                cand.append(t + p if e.killed_at < INF else max(t + p, e.kill_at))
        nxt = self.trace.next_change(self.clock(t))
        if nxt is not None:
            cand.append(nxt / self.scale)
        if not cand:
            return t + _NEVER_S
        target = min(cand)
        steps = max(1, math.ceil((target - t) / p - 1e-9))
        return t + steps * p

    def want(self) -> int:
        """Spot workers to launch now (the fleet's target less those held and not leaving)."""
        live = [e for e in self.fleet.alive if e.kind == "spot" and not e.noticed]
        return self.fleet_target - len(live) if self.policy.spot else 0

    def _reconcile(self, t: float, T: float) -> None:
        """The controller's reconcile (rlboost/rollout/policies/reconcile.py), launching into the replayed market."""

        def launch(offer: Offer) -> bool:
            self.worker_seq += 1
            iid = f"w{self.worker_seq:05d}"
            alive = sum(1 for e in self.fleet.alive if e.kind == "spot" and not e.victim)
            if alive >= self.market.capacity(T):
                self.placement.capacity_failure(offer.key)
                return False
            # a replayed instance runs as soon as the market grants it: the provider's RUNNING, for
            # which the controller resets the candidate's backoff
            self.backoff[offer.key].ok()
            model = scheduling.engine_model_for(self.spec, offer.accelerator)
            e = self.fleet.add(iid, "spot", model, offer, self.q.now)
            e.started = T
            self.placement.launched(iid, offer.key, T)
            self.cores.start_work(("boot", e.idx), self.sim.boot_s, lambda: self._dialled_in(e))
            return True

        order = self.placement.order(self.spot_offers, T)
        reconcile_fleet(self.want(), order, self.backoff, t, launch, rng=self.rng)

    def _dialled_in(self, e: ModelledEngine) -> None:
        if e.state != "gone":
            self.placement.joined(e.id, self.clock())
        self.pool.connect(e)

    def on_drain(self, idx: int) -> None:
        e = self.fleet.engines[idx]
        if e.state != "gone":
            self.pool.lose(e, drained=True)

    def gone(self, e: ModelledEngine, preempted: bool) -> None:
        """Terminated (released, or reaped after a preemption): billing ends now."""
        if e.state not in ("draining", "gone"):
            self.pool.lose(e, drained=False)
        e.state = "gone"
        self.fleet.alive.remove(e)
        self.bill.append((e.started, self.clock(), e.offer.hourly_price if e.offer else 0.0, True))
        self.placement.ended(e.id, self.clock(), preempted)

    # ---- after a step: the fleet's size ----------------------------------------------------------
    def step_trained(self, s: StepState, outcome: StepOutcome, tokens: int, step_s: float) -> None:
        """After a step, as the controller: the fleet policy picks the size from the step's record (its
        `step_s` the seconds it added to the run, as the live StepRecord's); surplus workers (idle
        between steps) are released, newest first."""
        if self.sizer is None:
            return
        clock = self.clock()
        sample = StepSample(outcome.n_remote, step_s, outcome.gen_s, outcome.train_busy_s, tokens)
        at = FleetClock(self.trainer.steps_done + 1, clock, self.spent())
        d = self.sizer.decide(sample, at, clock, self.fleet_target)
        self.fleet_target = d.workers
        live = [e for e in self.fleet.alive if e.kind == "spot" and not e.noticed]
        for e in surplus(live, lambda e: e.started, d.workers):
            self.gone(e, preempted=False)
        if self.want() > 0:
            # the live controller sizes the fleet at the poll that sees the step and reconciles in
            # that same poll: launch at the next poll, not at whatever change the queue waits for
            p = self.sim.poll_s
            self.schedule_poll(math.ceil(self.q.now / p - 1e-9) * p)

    # ---- the bill and the timeline ------------------------------------------------------------------
    def spent(self) -> float:
        """Dollars so far, on the billing clock."""
        now = self.clock()
        closed = sum((b - a) / 3600 * p for a, b, p, _ in self.bill)
        open_ = sum(
            (now - e.started) / 3600 * (e.offer.hourly_price if e.offer else 0.0)
            for e in self.fleet.alive
            if e.kind == "spot"
        )
        return closed + open_ + (now - self.clock(self.trainer.up_at)) / 3600 * self.trainer_offer.hourly_price

    def sample(self) -> None:
        # held = booting or serving; a draining worker is on its way out (its replacement may already boot)
        live = sum(1 for e in self.fleet.alive if e.kind == "spot" and e.state != "draining")
        tokens = self.trainer.trained_tokens
        if not self.timeline or self.timeline[-1][1] != live or self.timeline[-1][2] != tokens:
            self.timeline.append((self.q.now, live, tokens))

    def close_bill(self) -> None:
        """The job ends now: every instance still held is terminated."""
        fleet = self.fleet
        for e in fleet.engines:
            if e.kind == "spot" and e.state != "gone":
                e.state = "gone"
                self.bill.append((e.started, self.clock(), e.offer.hourly_price if e.offer else 0.0, True))
        fleet.alive = [e for e in fleet.alive if e.state != "gone"]
        if self.trainer.up_at < INF:
            self.bill.append((self.clock(self.trainer.up_at), self.clock(), self.trainer_offer.hourly_price, False))
        self.sample()

    def dollars(self, spot: bool) -> float:
        return sum((b - a) / 3600 * p for a, b, p, is_spot in self.bill if is_spot == spot)
