"""Fleet size: how many spot workers to hold, by the job's objective.

Adding spot workers shortens generation, and only generation: once the trainer's own training is the
longer part of a step, another worker adds cost and no tokens. After each step (the live coordinator's
and the simulator's `StepOutcome`, as a `StepSample`) the policy decides how many to hold:

- `cost`, by measurement: it holds a size for `probe_every` steps, then tries a smaller one (every
  other time a larger one) for `probe_steps` steps, and keeps whichever measured more trained tokens
  per dollar (trainer and workers together). Measured, because how much a worker shortens a step
  depends on the tail, the offload and migration, which the closed-form model below gets wrong by tens
  of percent (on the p3 trace it predicts 264 s a step without workers; on-demand measures 183 s).
- `throughput`: the fewest workers whose predicted step is within `flat` of the fastest: it releases
  workers only once the step sits on the trainer's floor, so it never trades speed for money.
- a deadline ("Can't Be Late", NSDI '24): the cheapest n whose predicted pace still finishes the
  remaining steps in the time left; when no n can, the fastest, and `deadline_at_risk` says so;
- a budget: the fastest n whose predicted cost to finish fits what is left (else the cheapest).

The predictions for deadline and budget use a roofline on the last step (workers counted in units of one
worker's decode rate):

    gen(n)  = gen0 * (a + u*n0) / (a + u*n)        a: the trainer's own engine, in workers
    step(n) = max(gen(n) + after0, train0)         after0: step0 - gen0 (training left + publish)
    step(n) = max(gen(n), step0)                   when step0 sat on the training floor (step0 ~ train0)

u is the share of a spot worker's paid time that generates (placement's `useful`, < 1 under
preemptions). Pure: no clock, no I/O; the controller and the simulator feed it the same records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    min_workers: int = 0  # never fewer (min = max: a fixed fleet)
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
    flat: float = 0.02  # `throughput`: steps within 2% count as equally fast
    probe_steps: int = 4  # steps measured at a size before comparing
    probe_every: int = 8  # steps held between probes
    shrink: float = 0.6  # a probe tries this fraction of the workers (or 1/shrink of them)
    warmup_steps: int = 2  # the first steps (workers still booting, cold caches) are not measured
    _seen: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # size -> (tok/s, tok/$)
    _trial: tuple[int, int] | None = None  # (held size, tried size)
    _trial_steps: int = 0
    _held: int = 0  # steps since the last probe ended
    _probes: int = 0
    _steps: int = 0
    _last_held: int = -1
    _got: int = 0  # workers the last step had

    def predict_step_s(self, s: StepSample, n: int, useful: float = 1.0) -> float:
        a, u = self.reserved_workers, max(useful, 1e-3)
        pool0, pool = a + u * s.n_remote, a + u * n
        if pool <= 0:
            return float("inf")
        gen = s.gen_s * pool0 / pool if pool0 > 0 else s.gen_s
        if s.step_s <= s.train_s * (1 + self.flat):
            return max(gen, s.step_s)  # on the trainer's floor: its length is the floor
        return max(gen + s.step_s - s.gen_s, s.train_s)

    def decide(
        self, s: StepSample, goal: FleetGoal, trainer_per_h: float, worker_per_h: float, current: int,
        useful: float = 1.0,
    ) -> FleetDecision:
        floor = max(goal.min_workers, 0 if self.reserved_workers > 0 else 1)
        sizes = range(floor, max(goal.max_workers, 0) + 1)
        if not sizes:
            return FleetDecision(0, float("inf"), why="no worker allowed")
        cur = min(max(current, sizes[0]), sizes[-1])
        self._measure(s, cur, trainer_per_h, worker_per_h)
        step = {n: self.predict_step_s(s, n, useful) for n in sizes}
        per_h = {n: trainer_per_h + n * worker_per_h for n in sizes}
        tok_per_dollar = {n: s.tokens / step[n] * 3600.0 / per_h[n] if per_h[n] > 0 else float("inf") for n in sizes}
        fastest = min(step.values())
        cheapest = max(sizes, key=lambda n: (tok_per_dollar[n], -n))

        if goal.steps_left is not None and goal.time_left_s is not None:
            pace = goal.time_left_s / max(goal.steps_left, 1)
            ok = [n for n in sizes if step[n] <= pace]
            if ok:
                pick = max(ok, key=lambda n: (tok_per_dollar[n], -n))
                return FleetDecision(pick, step[pick], why=f"deadline: {pace:.0f} s a step is enough")
            pick = min(n for n in sizes if step[n] <= fastest * (1 + self.flat))
            return FleetDecision(pick, step[pick], True, f"deadline needs {pace:.0f} s a step; best {fastest:.0f} s")

        if goal.objective == "throughput":
            # the roofline only removes workers once the step sits on the trainer's floor: it never
            # trades measured speed for money, which noisy step-to-step measurements would
            best = min(n for n in sizes if step[n] <= fastest * (1 + self.flat))
            if best > cur and step[best] * (1 + self.min_gain) > step[cur]:
                best = cur  # more workers for less than min_gain of speed: not worth a change
        else:
            best = self._by_measurement(cur, sizes)
        why = f"{goal.objective}: {best} worker(s)" + (" (trying)" if self._trial else "")
        if goal.budget_left is not None and goal.steps_left is not None:
            fits = [n for n in sizes if goal.steps_left * step[n] * per_h[n] / 3600.0 <= goal.budget_left]
            if not fits:
                best, why = cheapest, "budget: the cheapest way per token"
            elif best not in fits:
                best, why = min(fits, key=lambda n: (step[n], n)), "budget: the fastest size that fits"
        return FleetDecision(best, step[best], False, why)

    # ---- measurement -------------------------------------------------------------------
    def _measure(self, s: StepSample, held: int, trainer_per_h: float, worker_per_h: float) -> None:
        self._steps += 1
        self._got = s.n_remote
        changed, self._last_held = held != self._last_held, held
        # the first step at a new size mostly waits for booting workers (or still pays released ones)
        if self._steps <= self.warmup_steps or changed or s.step_s <= 0:
            return
        tps = s.tokens / s.step_s
        per_h = trainer_per_h + s.n_remote * worker_per_h
        # by the workers the step really had: the market may give fewer than the size held
        seen = self._seen.setdefault(s.n_remote, [])
        seen.append((tps, tps * 3600.0 / per_h if per_h > 0 else float("inf")))
        del seen[: -self.probe_steps]

    def _mean(self, n: int) -> float:
        xs = [v[1] for v in self._seen.get(n, [])]
        return sum(xs) / len(xs) if xs else 0.0

    def _by_measurement(self, cur: int, sizes: range) -> int:
        """`cost`: hold, probe a neighbour, keep whichever measured more tokens per dollar."""
        if self._trial is not None:
            held, tried = self._trial
            self._trial_steps += 1
            if len(self._seen.get(tried, [])) < self.probe_steps and self._trial_steps < 3 * self.probe_steps:
                return tried
            self._trial, self._held = None, 0
            return self._better(held, tried)
        self._held += 1
        got = min(cur, self._got)  # what the market gave at this size
        if self._held < self.probe_every or len(self._seen.get(got, [])) < self.probe_steps:
            return cur
        down = max(sizes[0], min(got - 1, int(got * self.shrink)))
        up = min(sizes[-1], max(cur + 1, round(cur / self.shrink)))
        tried = up if (self._probes % 2 == 1 or down == got) and got == cur else down
        if tried in (cur, got):
            return cur
        self._probes += 1
        self._trial, self._trial_steps = (got, tried), 0
        self._seen[tried] = []  # fresh measurements: the market may have changed since the last visit
        return tried

    def _better(self, held: int, tried: int) -> int:
        if len(self._seen.get(tried, [])) < 2:
            return held  # could not measure it (workers kept booting or dying): keep what worked
        a, b = self._mean(held), self._mean(tried)
        # fewer workers need only be as good; more must be clearly better
        return tried if (b > a if tried < held else b > a * (1 + self.min_gain)) else held
