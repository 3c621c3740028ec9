"""The trainer's side of a replay: it comes up, samples each step's prompts, trains complete groups while
the tail generates (rlboost/rollout/policies/overlap.py, the accounting the live learner uses), finishes the
step and publishes the next version.

Modelled: training time (tokens / the trainer's rate, shared with the other processes on a local
job's cores), the warm start and the step's fixed overhead (`simulate:` in the job file). Run for
real: the task's prompt sampler, tail batching (TailBatcher), the step's outcome (StepOutcome, which
the offload policy learns from).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlboost.contracts.lengths import LengthModel
from rlboost.contracts.perf import SYNC_COSTS
from rlboost.contracts.spec import JobSpec
from rlboost.rollout import scheduling
from rlboost.rollout.coordinator import Coordinator
from rlboost.rollout.policies.offload import StepOutcome
from rlboost.rollout.policies.overlap import busy_between, busy_total, left_to_train, may_train_group, trained_part
from rlboost.rollout.policies.staleness import added_s, engines_free, may_begin, staleness, swaps_in_flight
from rlboost.rollout.policies.tail_batching import TailBatcher, step_prompts
from rlboost.simulator.cores import CoreShare
from rlboost.simulator.engines import Fleet
from rlboost.simulator.events import INF, EventQueue
from rlboost.simulator.modelled_pool import ModelledPool, StepHooks
from rlboost.simulator.presets import SimPolicy
from rlboost.simulator.step_state import StepState, full_lengths
from rlboost.simulator.workload import replay_task


@dataclass
class TrainerHooks:
    """What the trainer tells the controller's side of the replay."""

    # a step is over (tokens trained, the seconds it added to the run: staleness.added_s): size the fleet
    step_trained: Callable[[StepState, StepOutcome, int, float], None]
    sample: Callable[[], None]  # the timeline may have changed


class TrainerReplay:
    def __init__(
        self,
        spec: JobSpec,
        policy: SimPolicy,
        q: EventQueue,
        cores: CoreShare,
        coordinator: Coordinator,
        lengths: LengthModel,
        max_steps: int,
    ) -> None:
        self.spec, self.policy, self.q, self.cores, self.coordinator = spec, policy, q, cores, coordinator
        self.pool: ModelledPool = coordinator.pool  # type: ignore[assignment]
        self.fleet: Fleet = self.pool.fleet
        self.sim = spec.simulate
        self.lengths = lengths
        self.max_steps = max_steps
        self.task = replay_task(spec)  # never loads a model or a tokenizer
        self.prompt_rng = np.random.default_rng(spec.algorithm.seed)
        self.train_rate = scheduling.trainer_tokens_per_s(spec)
        # a synchronous step trains only after its last response
        self.overlap = scheduling.trains_while_generating(spec) and not policy.sync
        self.batcher = (
            TailBatcher(spec.algorithm.prompts_per_step, spec.rollout.tail_over_launch)
            if policy.tail_batching
            else None
        )
        self.hooks: TrainerHooks  # set by the replay once the controller's side exists
        self.up_at = INF  # when it serves (sim seconds)
        self.max_staleness = spec.algorithm.max_staleness
        self.pool.swap_in_flight = swaps_in_flight(
            spec.algorithm.weight_swap, self.max_staleness, policy.split or policy.tail_batching
        )
        # steps begun and not yet trained, oldest first: the trainer trains the first; with
        # max_staleness >= 1 the next ones generate meanwhile
        self.steps: deque[StepState] = deque()
        self.next_step = 0  # the number of the next step to generate
        self.steps_done = 0
        self.trained_tokens = 0
        self.train_s = 0.0  # sim seconds spent training, over the finished steps
        self.first_step_t: float | None = None
        self.last_step_end = 0.0
        self.step_log: list[dict] = []
        self._spec_seen = {"passes": 0.0, "drafted": 0.0, "accepted": 0.0}  # speculation totals at the last step end
        self._swaps_seen = 0
        self.pool.hooks = StepHooks(self.generation_done, self._abandoned)
        self.pool.trainer_may_train = lambda _s: self.train_more()
        coordinator.on_group_done = self.train_more
        coordinator.on_offload = self.pool.after_offload
        q.on("trainer_up", self.on_up)
        q.on("trained", self.on_trained)
        q.on("step_end", self.on_step_end)

    def on_up(self, _) -> None:
        self.up_at = self.q.now
        self.pool.version = self.pool.published = 0
        if self.spec.rollout.trainer_engine:
            acc = scheduling.reserved_accelerator(self.spec)
            model = scheduling.engine_model_for(self.spec, acc)
            e = self.fleet.add("reserved", "reserved", model, None, self.q.now)
            rb = self.sim.reserved_boot_s
            self.cores.start_work(
                ("boot", e.idx), self.sim.boot_s if rb is None else rb, lambda: self.pool.connect(e)
            )
        if self.sim.warm_start_s > 0:  # billed and taking workers, but no step before the warm start
            self.cores.start_work(("warm",), self.sim.warm_start_s, self.start_step)
        else:
            self.start_step()

    # ---- steps --------------------------------------------------------------------------------
    def start_step(self) -> None:
        spec, algo = self.spec, self.spec.algorithm
        number = self.next_step
        self.next_step += 1
        problems, rnd = step_prompts(
            self.batcher, lambda n: self.task.sample(self.prompt_rng, n), algo.prompts_per_step
        )
        group = algo.group_size
        n = len(problems) * group
        s = StepState(number, self.q.now, n, group, rnd, problems)
        prompt_len = []  # response j = prompt j // group, sample j % group
        for prob in problems:
            prompt_len.extend([spec.rollout.synthetic.prompt_tokens or len(prob.prompt_ids)] * group)
        if n:
            full = full_lengths(self.lengths, algo.seed, number, problems, group)
            s.length[:] = np.minimum(full, algo.max_new_tokens)
            s.length_of = s.length.tolist()
            s.eos[:] = full <= algo.max_new_tokens
            s.prompt_len[:] = prompt_len
        s.queue.extend(range(n))
        share = None
        if self.policy.split:
            pool = [e for e in self.fleet.alive if e.state in ("ready", "pulling") and not e.victim]
            rates = [e.model.full_rate() for e in pool]
            total_rate = sum(rates)
            share = {e.id: math.ceil(n * r / total_rate) for e, r in zip(pool, rates)}
        if self.first_step_t is None:
            self.first_step_t = self.q.now
        self.steps.append(s)
        self.pool.begin_step(s, need_groups=rnd.need_groups if rnd is not None else None, share=share)
        s.version = self.pool.version
        if len(self.steps) > 1 and self.pool.reserved():  # the trainer's GPUs train an older step
            self.coordinator.offload_now(self.q.now, self.pool.reserved())

    def _begin_next(self) -> None:
        """Generation of the next step, once the staleness bound and the GPUs allow it: under
        max_staleness k it may run ahead of training by k versions, while another step trains only
        where remote engines generate it (the trainer's own engine shares the trainer's GPUs)."""
        m = self.coordinator.marks
        if self.next_step >= self.max_steps or (m is not None and m.gen_end is None and not self.pool.swap_in_flight):
            return  # one step generates at a time, unless weights swap in flight
        if not may_begin(self.next_step, self.pool.published, self.max_staleness):
            return
        if not engines_free(len(self.steps), self.pool.n_remote()):
            return
        self.start_step()

    def _abandoned(self, s: StepState, groups: list[int]) -> None:
        assert self.batcher is not None and s.tail_round is not None
        self.batcher.close_round(s.tail_round, [s.problems[g] for g in groups])

    # ---- training -------------------------------------------------------------------------------
    def train_more(self) -> None:
        """Overlapped training: once offloaded, the trainer trains the oldest step's finished groups one
        by one."""
        if not self.steps:
            return
        now = self.q.now
        s = self.steps[0]
        m = self.coordinator.marks_of(s.number)
        assert m is not None
        if not may_train_group(self.overlap, m.offload_at, m.gen_end) or s.train_busy_until > now:
            return
        self._group_trained(s)  # one that ended at this very instant, before its event was handled
        groups_done = m.groups_done
        if not groups_done:
            return
        g = groups_done.popleft()
        g -= s.gbase
        tokens = int(s.length[g * s.group_size : (g + 1) * s.group_size].sum())
        rate = self.train_rate * self.cores.trainer_speed()
        dt = tokens / rate
        s.busy.append((now, now + dt))
        s.groups_started += 1
        s.group_training = (now, tokens, s.groups_started, rate)
        s.train_busy_until = self.cores.trainer_busy_until = now + dt
        self.q.push(s.train_busy_until, "trained", (s.number, s.groups_started))

    def _group_trained(self, s: StepState) -> None:
        if s.group_training is not None and s.train_busy_until <= self.q.now:
            s.pretrained += s.group_training[1]
            s.group_training = None

    def on_trained(self, payload: tuple[int, int]) -> None:
        number, gid = payload
        s = self.steps[0] if self.steps else None
        m = self.coordinator.marks_of(number)
        if s is None or s.number != number or m is None or m.gen_end is not None:
            return
        if s.group_training is not None and s.group_training[2] == gid:
            self._group_trained(s)
        self.train_more()

    def generation_done(self, s: StepState) -> None:
        """The last response is in: the step trains what is left (now, if it is the oldest), and the
        next step's generation may begin."""
        self.coordinator.generation_done(self.q.now, s.number)
        if s is self.steps[0]:
            self._train_rest(s)
        self._begin_next()

    def _train_rest(self, s: StepState) -> None:
        """Train what is left of a step whose last response is in, then the step's overhead."""
        now = self.q.now
        kept = ~s.dropped
        total = int(s.length[kept].sum())
        if s.group_training is not None:  # a group was mid-training (or just done): keep the part done
            started, tokens, _, rate = s.group_training
            s.pretrained += trained_part(tokens, started, now, rate)
            s.group_training = None
            a, b = s.busy[-1]
            s.busy[-1] = (a, min(b, now))
        left = left_to_train(total, s.pretrained, self.overlap)
        t_train_end = now + left / (self.train_rate * self.cores.trainer_speed())
        if self.policy.sync:  # old-logprob + ref forward passes before training (the KV-cache free is
            # in simulate.step_overhead_s, as for rlboost's trainer, whose engine shares its GPUs too)
            t_train_end += SYNC_COSTS.forward_s(total, self.train_rate)
        s.busy.append((now, t_train_end))
        self.cores.trainer_busy_until = t_train_end
        self.q.push(t_train_end + self.sim.step_overhead_s, "step_end", (s.number, total))

    def on_step_end(self, payload: tuple[int, int]) -> None:
        number, total = payload
        now = self.q.now
        s, m = self.steps[0], self.coordinator.marks_of(number)
        assert s.number == number and m is not None and m.gen_end is not None
        t0 = m.t0
        train_s = busy_total(s.busy)
        o = self.coordinator.end_step(
            now,
            train_busy_s=train_s,
            train_tokens=total,
            busy_during_tail_s=busy_between(s.busy, m.offload_at, m.gen_end),
            step=number,
        )
        step_s = added_s(t0, now, self.last_step_end)  # as the live trainer's StepRecord
        self.hooks.step_trained(s, o, total, step_s)
        self.step_log.append(
            {
                "step": number,
                "t0": round(t0, 3),
                "step_s": round(step_s, 3),
                "gen_s": round(o.gen_s, 3),
                "train_s": round(train_s, 3),
                "box_s": None if o.box_s is None else round(o.box_s, 3),
                "trainer_idle_s": round(o.trainer_idle_s, 3),
                "remote_idle_s": round(o.remote_idle_s, 3),
                "n_remote": o.n_remote,
                "tokens": total,
                "long": bool(s.tail_round.long) if s.tail_round is not None else False,
            }
        )
        if self.max_staleness:  # only then: an on-policy replay records what it always did
            self.step_log[-1]["staleness"] = staleness(number, s.version)
        if self.pool.swap_in_flight:  # responses a new version interrupted in flight since the last step end
            self.step_log[-1]["swapped"], self._swaps_seen = self.pool.swaps - self._swaps_seen, self.pool.swaps
        if self.pool.speculation is not None:  # only then: a replay without it records what it always did
            now_totals = self.pool.speculation.totals.as_dict()
            self.step_log[-1]["speculation"] = {k: round(v - self._spec_seen[k], 3) for k, v in now_totals.items()}
            self._spec_seen = now_totals
        self.trained_tokens += total
        self.train_s += train_s
        self.steps_done += 1
        self.last_step_end = now
        self.steps.popleft()
        self.pool.publish()
        self.hooks.sample()
        if self.steps_done >= self.max_steps:
            # the controller sees `done` at its next poll and tears everything down
            self.q.push(now + self.sim.poll_s / 2, "end")
            return
        self._begin_next()
        if self.steps:  # the next step, generated meanwhile (in part or whole): the trainer takes it up
            nxt = self.steps[0]
            m_next = self.coordinator.marks_of(nxt.number)
            if m_next is not None and m_next.gen_end is not None:
                self._train_rest(nxt)
            elif m_next is not None and m_next.offload_at is not None and self.pool.reserved() and len(self.steps) == 1:
                # the trainer waits for this step: its engine, offloaded to train the last one, generates
                self.coordinator.take_back_reserved(now)
            else:
                self.train_more()
