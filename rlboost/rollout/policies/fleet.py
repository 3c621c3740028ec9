"""Fleet size: how many spot workers to hold, by the job's objective.

Adding spot workers shortens generation, and only generation: once the trainer's own training is the
longer part of a step, another worker adds cost and no tokens. After each step (the live coordinator's
and the simulator's `StepOutcome`, as a `StepSample`) the policy decides how many to hold:

- `cost`, by a model fitted to measurements: seconds per trained token against the rollout pool,
  `y = max(base + par / pool, floor)`, least squares over the last `window` measured steps of every
  size the fleet held (the market's churn gives it spread). It holds the size with the most predicted
  tokens per dollar (trainer and workers together), moving at most a probe's step (x0.6 or /0.6) at a
  time and only for `move_gain`; when the window holds one size only, it probes a neighbour. Fitted,
  because how much a worker shortens a step depends on the tail, the offload and migration, which the
  closed-form roofline below gets wrong by tens of percent (on the p3 trace it predicts 264 s a step
  without workers; on-demand measures 183 s); pooled, because 4-step means of tokens per dollar vary
  more from step to step than neighbouring sizes differ (BENCHMARKS.md, "Fleet size by objective").
- `throughput`: the fewest workers whose predicted step is within `flat` of the fastest: it releases
  workers only once the step sits on the trainer's floor, so it never trades speed for money.
- a deadline ("Can't Be Late", NSDI '24): the objective decides while its size's predicted pace
  finishes the remaining steps in the time left (less one worker boot, `switch_s`); then the cheapest
  size that does; when none can, the fastest, and `deadline_at_risk` says so. Predicted by the fit
  plus its own RMS error (a pace the slower steps keep too, not the mean's) where there is one, else
  the roofline.
- a budget: the fastest n whose predicted cost to finish fits what is left (else the cheapest).

`throughput` and the budget use a roofline on the last step (workers counted in units of one worker's
decode rate):

    gen(n)  = gen0 * (a + u*n0) / (a + u*n)        a: the trainer's own engine, in workers
    step(n) = max(gen(n) + after0, train0)         after0: step0 - gen0 (training left + publish)
    step(n) = max(gen(n), step0)                   when step0 sat on the training floor (step0 ~ train0)

u is the share of a spot worker's paid time that generates (placement's `useful`, < 1 under
preemptions). Pure: no clock, no I/O; the controller and the simulator feed it the same records.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, TypeVar

Objective = Literal["throughput", "cost"]
T = TypeVar("T")


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
    switch_s: float = 0.0  # a worker launched now helps only this much later: kept in reserve before a deadline
    budget_left: float | None = None  # dollars


def surplus(workers: Sequence[T], started: Callable[[T], float], keep: int) -> list[T]:
    """The workers to release when the fleet shrinks to `keep`: the newest first (idle between steps
    anyway, and the oldest have shown the market lets them stay)."""
    return sorted(workers, key=lambda w: -started(w))[: max(0, len(workers) - keep)]


@dataclass(frozen=True)
class FleetDecision:
    workers: int
    step_s: float  # predicted step length with that many workers
    deadline_at_risk: bool = False
    why: str = ""


@dataclass(frozen=True)
class StepFit:
    """Seconds per trained token against the rollout pool, fitted to the measured steps:

        y(pool) = max(base + par / pool, floor)

    `par` is the generation work more workers spread out, `base` what they do not shorten (the tail's
    longest responses, training left after the last response, the publish), `floor` the trainer's own
    training time per token, which no worker shortens."""

    base: float
    par: float
    floor: float
    rel_err: float = 0.0  # RMS of the measured steps' relative misses: the fit's own error

    def seconds_per_token(self, pool: float) -> float:
        return max(self.base + self.par / pool, self.floor) if pool > 0 else float("inf")


def fit_steps(points: list[tuple[float, float]], floor: float) -> StepFit | None:
    """Least squares of seconds per token on 1/pool over (pool, y) points; None without two pools."""
    xs = [1.0 / p for p, _ in points]
    if len(points) < 2 or max(xs) - min(xs) < 1e-9 * max(xs):
        return None
    mx, my = sum(xs) / len(xs), sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x in xs)
    par = max(0.0, sum((x - mx) * (y - my) for x, (_, y) in zip(xs, points)) / sxx)
    fit = StepFit(base=my - par * mx, par=par, floor=floor)
    misses = [(y - fit.seconds_per_token(p)) / y for p, y in points if y > 0]
    return replace(fit, rel_err=math.sqrt(sum(m * m for m in misses) / len(misses)) if misses else 0.0)


@dataclass
class FleetPolicy:
    reserved_workers: float  # a: the trainer's own engine's decode rate in units of one worker's (0: none)
    min_gain: float = 0.03  # `throughput`: add workers only for 3% of speed
    move_gain: float = 0.01  # `cost`: move only for a predicted gain of 1% in tokens per dollar
    flat: float = 0.02  # `throughput`: steps within 2% count as equally fast
    window: int = 48  # `cost`: the measured steps the fit uses
    probe_steps: int = 4  # steps measured at a new size before fitting again
    probe_every: int = 8  # steps held at one size before a probe, when the window shows no other size
    shrink: float = 0.6  # a probe tries this fraction of the workers (or 1/shrink of them)
    warmup_steps: int = 2  # the first steps (workers still booting, cold caches) are not measured
    # measured steps: (workers, seconds per token, training seconds per token, on the trainer's floor)
    _window: list[tuple[int, float, float, bool]] = field(default_factory=list)
    _trial: int | None = None  # the size being probed
    _trial_steps: int = 0
    _held: int = 0  # steps at the current size since the last move
    _probes: int = 0
    _steps: int = 0
    _last_held: int = -1

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
        self._measure(s, cur)
        step = {n: self.predict_step_s(s, n, useful) for n in sizes}
        per_h = {n: trainer_per_h + n * worker_per_h for n in sizes}
        tok_per_dollar = {n: s.tokens / step[n] * 3600.0 / per_h[n] if per_h[n] > 0 else float("inf") for n in sizes}
        fastest = min(step.values())
        cheapest = max(sizes, key=lambda n: (tok_per_dollar[n], -n))

        if goal.objective == "throughput":
            # the roofline only removes workers once the step sits on the trainer's floor: it never
            # trades measured speed for money, which noisy step-to-step measurements would
            best = min(n for n in sizes if step[n] <= fastest * (1 + self.flat))
            if best > cur and step[best] * (1 + self.min_gain) > step[cur]:
                best = cur  # more workers for less than min_gain of speed: not worth a change
        else:
            boot_steps = goal.switch_s / self._typical_step_s(s)
            best = self._by_fit(cur, sizes, trainer_per_h, worker_per_h, useful, boot_steps)
        why = f"{goal.objective}: {best} worker(s)" + (" (trying)" if self._trial is not None else "")

        if goal.steps_left is not None and goal.time_left_s is not None:
            # the objective decides while its pace makes the deadline; then the cheapest size that does
            pace = (goal.time_left_s - goal.switch_s) / max(goal.steps_left, 1)
            pred = self.predict_steps(s, sizes, useful, margin=True)
            if pred[best] <= pace:
                return FleetDecision(best, pred[best], why=f"{why}; deadline: {pace:.0f} s a step is enough")
            ok = [n for n in sizes if pred[n] <= pace]
            if ok:
                pick = max(ok, key=lambda n: (1.0 / (pred[n] * per_h[n]) if per_h[n] > 0 else float("inf"), -n))
                return FleetDecision(pick, pred[pick], why=f"deadline: needs {pace:.0f} s a step")
            quickest = min(pred.values())
            pick = min(n for n in sizes if pred[n] <= quickest * (1 + self.flat))
            return FleetDecision(pick, pred[pick], True, f"deadline needs {pace:.0f} s a step; best {quickest:.0f} s")

        if goal.budget_left is not None and goal.steps_left is not None:
            fits = [n for n in sizes if goal.steps_left * step[n] * per_h[n] / 3600.0 <= goal.budget_left]
            if not fits:
                best, why = cheapest, "budget: the cheapest way per token"
            elif best not in fits:
                best, why = min(fits, key=lambda n: (step[n], n)), "budget: the fastest size that fits"
        return FleetDecision(best, step[best], False, why)

    def predict_steps(
        self, s: StepSample, sizes: range, useful: float = 1.0, *, margin: bool = False
    ) -> dict[int, float]:
        """Step length by fleet size: the fit to the measured steps where there is one (it knows the
        tail that more workers do not shorten), else the roofline on the last step. `margin`: plus the
        fit's own RMS error, so a deadline is planned on a pace the steps keep, not their mean."""
        fit = self.fit()
        if fit is None:
            return {n: self.predict_step_s(s, n, useful) for n in sizes}
        a, u = self.reserved_workers, max(useful, 1e-3)
        k = 1.0 + (fit.rel_err if margin else 0.0)
        return {n: fit.seconds_per_token(a + u * n) * s.tokens * k for n in sizes}

    # ---- `cost`: measure, fit, move ----------------------------------------------------
    def _typical_step_s(self, s: StepSample) -> float:
        """The window's median seconds per token at this step's tokens: one slow step (a loaded
        machine, a long response) must not make a boot look short in steps."""
        ys = sorted(y for _, y, _, _ in self._window)
        step = ys[len(ys) // 2] * s.tokens if ys else s.step_s
        return step if step > 0 else float("inf")

    def _measure(self, s: StepSample, held: int) -> None:
        self._steps += 1
        changed, self._last_held = held != self._last_held, held
        # the first step at a new size mostly waits for booting workers (or still pays released ones)
        if self._steps <= self.warmup_steps or changed or s.step_s <= 0 or s.tokens <= 0:
            return
        on_floor = s.step_s <= s.train_s * (1 + self.flat)
        # by the workers the step really had: the market may give fewer than the size held
        self._window.append((s.n_remote, s.step_s / s.tokens, s.train_s / s.tokens, on_floor))
        del self._window[: -self.window]

    def fit(self) -> StepFit | None:
        """The step model from the window's steps that generation bounded (None: no spread to fit)."""
        a = self.reserved_workers
        pts = [(a + n, y) for n, y, _, on_floor in self._window if not on_floor and a + n > 0]
        trains = sorted(t for _, _, t, _ in self._window)
        return fit_steps(pts, trains[len(trains) // 2] if trains else 0.0)

    def _by_fit(
        self, cur: int, sizes: range, trainer_per_h: float, worker_per_h: float, useful: float, boot_steps: float
    ) -> int:
        """`cost`: hold the size the fitted step model says makes the most tokens per dollar; probe a
        neighbouring size when the window has nothing to fit (all its steps at one size), unless a
        worker's boot spans more steps than a probe measures (`boot_steps`): probing down then costs
        the boot's steps again at the smaller size on the way back, probing up pays workers through
        the boot before one step is measured, for a probe's few steps of knowledge. So too a probe down
        from steps on the trainer's floor: on a loaded machine a small fleet's step sits there while
        the trainer alone is slower still (live, examples/local.yaml), and a move to a size with fewer
        measured steps than a probe's: one step without the worker (the market took it) among many
        noisy ones with it fitted "no worker" as good, and released it for good (BENCHMARKS.md)."""
        self._held += 1
        may_probe = boot_steps <= self.probe_steps
        if self._trial is not None:
            self._trial_steps += 1
            measured = sum(1 for n, *_ in self._window[-self._trial_steps :] if n == self._trial)
            if measured < self.probe_steps and self._trial_steps < 3 * self.probe_steps:
                return cur
            self._trial = None
        fit = self.fit()
        if fit is None:
            # a step on the trainer's floor says fewer workers would do: try fewer at once
            floored = any(f for n, _, _, f in self._window[-2:] if n == cur)
            if may_probe and (floored or self._held >= self.probe_every):
                return self._probe(cur, sizes, down_only=floored)
            return cur
        a, u = self.reserved_workers, max(useful, 1e-3)
        seen = [n for n, *_ in self._window]
        # trust the fit a probe's step beyond the sizes it has seen, and move a probe's step at a time
        lo = max(int(min(seen) * self.shrink), int(cur * self.shrink))
        hi = min(self._step_up(max(seen)), self._step_up(cur))
        known = Counter(seen)
        value = {
            n: 1.0 / (fit.seconds_per_token(a + u * n) * (trainer_per_h + n * worker_per_h))
            for n in sizes
            # where probes are off, a move to a size measured less than a probe measures is a probe
            # in disguise (and one step there weighs in the fit like a probe's four)
            if (lo <= n <= hi and (may_probe or known[n] >= self.probe_steps)) or n == cur
        }
        best = max(value, key=lambda n: (value[n], -n))
        if best == cur or value[best] < value[cur] * (1 + self.move_gain):
            if may_probe and self._held >= self.probe_every and sum(1 for n in seen if n != cur) < self.probe_steps:
                return self._probe(cur, sizes)  # the window is ageing out every other size: measure one again
            return cur
        self._held = 0
        return best

    def _step_up(self, n: int) -> int:
        return max(n + 1, round(n / self.shrink))

    def _probe(self, cur: int, sizes: range, down_only: bool = False) -> int:
        down = max(sizes[0], min(cur - 1, int(cur * self.shrink)))
        up = min(sizes[-1], self._step_up(cur))
        go_up = not down_only and (self._probes % 2 == 1 or down == cur)
        tried = up if go_up and up != cur else down
        if tried == cur:
            return cur
        self._probes += 1
        self._trial, self._trial_steps, self._held = tried, 0, 0
        return tried
