"""Fleet size: how many spot workers to hold, by the job's objective.

Adding spot workers shortens generation, and only generation: once the trainer's own training is the
longer part of a step, another worker adds cost and no tokens. The policy predicts a step's length with
n workers from the last measured step (the live coordinator's and the simulator's `StepOutcome`) and
picks n by the objective:

- `throughput`: the fewest workers within `flat` of the fastest predicted step (stops at the trainer
  bottleneck instead of paying for workers that only wait), and never fewer than `cost` would hold;
- `cost`: the most tokens per dollar, trainer and workers together;
- a deadline ("Can't Be Late", NSDI '24): the cheapest n whose pace still finishes the remaining steps in
  the time left; when no n can, the fastest, and `deadline_at_risk` says so;
- a budget: the fastest n whose cost to finish fits what is left (else the cheapest).

Step model (a roofline on the measured step, workers counted in units of one worker's decode rate):

    gen(n)  = gen0 * (a + u*n0) / (a + u*n)        a: the trainer's own engine, in workers
    step(n) = max(gen(n) + after0, train0)         after0: step0 - gen0 (training left + publish)

u is the share of a spot worker's paid time that generates (placement's `useful`, < 1 under
preemptions). Keeping `after0` as measured under-states what more workers gain when the trainer
trains during the tail, so the policy leans to fewer workers: it never buys speed it cannot see.
A move needs a `min_gain` improvement of the objective over the current size (no flapping on noise).
Pure: no clock, no I/O; the controller and the simulator feed it the same records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Objective = Literal["throughput", "cost"]


@dataclass(frozen=True)
class StepSample:
    """One finished step, as both clocks measure it."""

    n_remote: int  # spot workers generating at the step's start
    step_s: float
    gen_s: float  # start -> last response
    train_s: float  # the trainer's busy training time
    tokens: int


@dataclass(frozen=True)
class FleetGoal:
    """What the job asks for; remaining steps/time/budget are filled in by the caller at each decision."""

    objective: Objective
    max_workers: int
    steps_left: int | None = None
    time_left_s: float | None = None  # to the deadline
    budget_left: float | None = None  # dollars


@dataclass(frozen=True)
class FleetDecision:
    workers: int
    step_s: float  # predicted step length with that many workers
    deadline_at_risk: bool = False
    why: str = ""


@dataclass
class FleetPolicy:
    reserved_workers: float  # a: the trainer's own engine's decode rate in units of one worker's (0: none)
    min_gain: float = 0.03
    flat: float = 0.02  # `throughput`: steps within 2% of the fastest count as equally fast

    def predict_step_s(self, s: StepSample, n: int, useful: float = 1.0) -> float:
        a, u = self.reserved_workers, max(useful, 1e-3)
        pool0, pool = a + u * s.n_remote, a + u * n
        if pool <= 0:
            return float("inf")
        gen = s.gen_s * pool0 / pool if pool0 > 0 else s.gen_s
        after = max(0.0, s.step_s - s.gen_s)
        return max(gen + after, s.train_s)

    def decide(
        self, s: StepSample, goal: FleetGoal, trainer_per_h: float, worker_per_h: float, current: int,
        useful: float = 1.0,
    ) -> FleetDecision:
        sizes = range(0 if self.reserved_workers > 0 else 1, max(goal.max_workers, 0) + 1)
        if not sizes:
            return FleetDecision(0, float("inf"), why="no worker allowed")
        step = {n: self.predict_step_s(s, n, useful) for n in sizes}
        per_h = {n: trainer_per_h + n * worker_per_h for n in sizes}
        tok_per_dollar = {n: s.tokens / step[n] * 3600.0 / per_h[n] if per_h[n] > 0 else float("inf") for n in sizes}
        speed = {n: 1.0 / step[n] for n in sizes}
        fastest = min(step.values())
        at_risk = False

        if goal.steps_left is not None and goal.time_left_s is not None:
            pace = goal.time_left_s / max(goal.steps_left, 1)
            ok = [n for n in sizes if step[n] <= pace]
            if ok:
                pick = max(ok, key=lambda n: (tok_per_dollar[n], -n))
                return FleetDecision(pick, step[pick], why=f"deadline: {pace:.0f} s a step is enough")
            at_risk = True
            pick = min(n for n in sizes if step[n] <= fastest * (1 + self.flat))
            return FleetDecision(pick, step[pick], True, f"deadline needs {pace:.0f} s a step; best {fastest:.0f} s")

        cheapest = max(sizes, key=lambda n: (tok_per_dollar[n], -n))
        if goal.objective == "throughput":
            # a worker that pays for itself is worth holding for speed too
            best = max(cheapest, min(n for n in sizes if step[n] <= fastest * (1 + self.flat)))
            score = speed
        else:
            best, score = cheapest, tok_per_dollar
        cur = min(max(current, sizes[0]), sizes[-1])
        if best != cur and score[best] < score[cur] * (1 + self.min_gain):
            best = cur  # not worth a change
        if goal.budget_left is not None and goal.steps_left is not None:
            fits = [n for n in sizes if goal.steps_left * step[n] * per_h[n] / 3600.0 <= goal.budget_left]
            if not fits:
                best = cheapest
            elif best not in fits:
                best = min(fits, key=lambda n: (step[n], n))
        return FleetDecision(best, step[best], at_risk, f"{goal.objective}: {best} worker(s)")
