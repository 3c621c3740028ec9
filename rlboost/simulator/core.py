"""Discrete-event replay of one job under one policy, on a virtual clock.

A replay runs the live Coordinator (rlboost/rollout/coordinator.py: dispatch, ticks, offload, tail
migration, tail batching) on a virtual clock, and around it four parts on one event queue
(rlboost/simulator/events.py), each the stand-in for what the coordinator talks to and each calling
the same scheduling core (rlboost/rollout/) as the live process:

    ModelledPool      (modelled_pool.py)       the engines the coordinator schedules, and their losses
    TrainerReplay     (trainer_replay.py)      steps, training while the tail generates, publishing
    ControllerReplay  (controller_replay.py)   polls, the spot market, reconcile, fleet size, the bill
    CoreShare         (cores.py)               a local job's processes sharing this machine's cores

and the models of what it does not run: engines (engines.py: continuous batching at step_time(n),
prefill stalls; a torch engine batches statically, each batch after a dispatch round trip; speculative
decoding where the job asks, speculation.py), training
(tokens / train rate), boots, weight pulls and the step's fixed overhead (`simulate:` in the job file).
`README.md` ("One decision path") names the functions the live system and the replay both call.

Timing follows the live job: the trainer is billed from when it serves, spot workers from launch to
the controller poll that sees them gone; the market is replayed at `local.time_scale` trace seconds
per second for `provider: local` jobs (1 otherwise).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from rlboost.contracts.engine import STATIC_BATCH_ENGINES
from rlboost.contracts.lengths import LengthModel
from rlboost.contracts.spec import JobSpec
from rlboost.providers.pricing import Offer
from rlboost.providers.spot_market import AvailabilityTrace, SpotMarket
from rlboost.rollout import scheduling
from rlboost.rollout.coordinator import Coordinator, CoordinatorRules
from rlboost.simulator.controller_replay import ControllerReplay, Offers
from rlboost.simulator.cores import CoreShare
from rlboost.simulator.engines import Fleet
from rlboost.simulator.events import INF, EventQueue
from rlboost.simulator.modelled_pool import ModelledPool
from rlboost.simulator.presets import SimPolicy
from rlboost.simulator.result import SimResult
from rlboost.simulator.trainer_replay import TrainerReplay


def coordinator_rules(spec: JobSpec, policy: SimPolicy) -> CoordinatorRules:
    """The job's scheduling core (rlboost/rollout/scheduling.py), with the policy's choices in place of the
    job's (a synchronous step trains only after its last response)."""
    return scheduling.coordinator_rules(
        spec, offload=policy.offload, migrate=policy.migration, dispatch=policy.dispatch, overlap=not policy.sync
    )


PROGRESS_REPORTS = 200  # progress reports over the horizon (or, replaying to the job's last step, the trace)


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
        self.scale = scheduling.billing_scale(spec)
        if spec.local.capacity_scale != 1.0:
            trace = trace.scaled(spec.local.capacity_scale)
        # replay until: --hours, else the job's steps (the trace's last capacity holds on, as live),
        # else (no step limit) the end of the trace
        if horizon_s is None:
            horizon_s = self.sim.hours * 3600 if self.sim.hours else (INF if max_steps is None else trace.duration)
        self.horizon = horizon_s / self.scale  # sim seconds
        self.report_every = (self.horizon if self.horizon < INF else trace.duration / self.scale) / PROGRESS_REPORTS
        self.q = EventQueue()
        self.fleet = Fleet(spec.rollout.engine in STATIC_BATCH_ENGINES)
        self.cores = CoreShare(self.sim.cpu_cores, self.q, self.fleet)
        self.pool = ModelledPool(spec, policy, self.q, self.fleet, self.cores)
        self.coordinator = Coordinator(self.pool, coordinator_rules(spec, policy))
        self.pool.coord = self.coordinator
        self.trainer = TrainerReplay(
            spec,
            policy,
            self.q,
            self.cores,
            self.coordinator,
            lengths or scheduling.length_model(spec),
            max_steps if max_steps is not None else spec.algorithm.steps,
        )
        market = SpotMarket(trace, notice_fraction=spec.local.notice_fraction, seed=spec.algorithm.seed)
        self.controller = ControllerReplay(
            spec, policy, market, Offers(trainer_offer, spot_offers), self.trainer, self.scale
        )
        self.q.on("end", lambda _: self._finish(self.q.now))
        self.done = False
        self.end_t = INF

    def run(self, on_progress: Callable[[float], None] | None = None) -> SimResult:
        """Replay to the end; `on_progress(fraction done)` every `report_every` sim seconds (a sweep's bars).
        The report shares the loop's one time test with the horizon: nothing more runs per event."""
        q = self.q
        tb = self.sim.trainer_boot_s
        q.push(self.sim.boot_s if tb is None else tb, "trainer_up")
        self.controller.schedule_poll(0.0)
        handlers, heap, horizon, pop = q.handlers, q.heap, self.horizon, heapq.heappop
        cores = self.cores if self.sim.cpu_cores else None
        every = self.report_every
        stop = min(horizon, every) if on_progress is not None else horizon
        while heap and not self.done:
            t, _, kind, payload = pop(heap)
            if t > stop and kind != "end":
                if t > horizon:
                    self._finish(horizon)
                    break
                assert on_progress is not None
                on_progress(self.fraction_done())
                stop = min(horizon, t + every)
            q.now = t
            handlers[kind](payload)
            if cores is not None:
                cores.reshare()
        if not self.done:
            self._finish(q.now)
        if on_progress is not None:
            on_progress(1.0)
        return self._result()

    def fraction_done(self) -> float:
        """How far the replay is, by whichever ends it first: the horizon or the step count."""
        by_time = self.q.now / self.horizon if self.horizon < INF else 0.0
        tr = self.trainer
        return min(1.0, max(by_time, tr.steps_done / tr.max_steps if tr.max_steps else 0.0))

    def _finish(self, t: float) -> None:
        if self.done:
            return
        self.done = True
        self.q.now = self.end_t = t
        self.controller.close_bill()

    def _result(self) -> SimResult:
        spot, trainer = self.controller.dollars(spot=True), self.controller.dollars(spot=False)
        tr = self.trainer
        run_s = (tr.last_step_end - tr.first_step_t) if tr.first_step_t is not None and tr.steps_done else 0.0
        return SimResult(
            policy=self.policy,
            steps=tr.steps_done,
            run_s=run_s,
            job_s=self.end_t,
            trained_tokens=tr.trained_tokens,
            dollars=spot + trainer,
            spot_dollars=spot,
            trainer_dollars=trainer,
            preemptions=self.controller.preemptions,
            migrations=self.pool.migrations,
            restarted_tokens=self.pool.restarted_tokens,
            time_scale=self.scale,
            timeline=self.controller.timeline,
            step_log=tr.step_log,
            trainer_train_s=tr.train_s,
            # the span trainer_dollars is billed for, back on the replay's clock
            trainer_billed_s=sum(b - a for a, b, _, spot in self.controller.bill if not spot) / self.scale,
        )


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
