"""The body of `rlboost simulate` (rlboost/cli/main.py only parses arguments and prints)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from rlboost.contracts.lengths import LengthModel, read_recorded
from rlboost.contracts.spec import JobSpec
from rlboost.providers.pricing import Offer, spot_offers, trainer_offer
from rlboost.providers.spot_market import BUILTIN_TRACE, AvailabilityTrace, constant_trace, load_trace
from rlboost.simulator.core import Simulation
from rlboost.simulator.local_calibration import Calibration, calibrate, needs_calibration, one_process
from rlboost.simulator.parallel import Report, run_all
from rlboost.simulator.presets import PRESETS, SimPolicy, policy_from_spec
from rlboost.simulator.result import SimResult

DEFAULT_POLICIES = ("on-demand", "spot-restart", "rlboost-rule", "rlboost")
SWEEP_OBJECTIVES = ("cost", "throughput")


class NoStepError(ValueError):
    """The replay ended before a policy finished its first step."""


def option_error(
    *,
    hours: float | None = None,
    steps: int | None = None,
    jobs: int | None = None,
    constant_workers: int | None = None,
    sweep: bool = False,
    sweep_workers: str | None = None,
    sweep_trainer: str | None = None,
) -> str | None:
    """What is wrong with `rlboost simulate`'s numeric options, checked before anything replays (None: nothing)."""
    if hours is not None and not 0 < hours < math.inf:  # nan fails both comparisons
        what = "a finite number" if hours == math.inf else "> 0"
        return f"--hours {hours:g}: must be {what} (the hours of trace to replay; leave it out for the job's steps)"
    if steps is not None and steps < 0:
        return f"--steps {steps}: must be >= 0 (the steps to stop after; 0: no limit)"
    if jobs is not None and jobs < 1:
        return f"--jobs {jobs}: must be >= 1 (replays run in parallel processes; 1: one after another)"
    if constant_workers is not None and constant_workers < 0:
        return f"--constant-workers {constant_workers}: must be >= 0 (the spot workers available all along)"
    if sweep_workers is not None and not sweep:
        return "--sweep-workers needs --sweep: add --sweep, or leave --sweep-workers out"
    if sweep_trainer is not None and not sweep:
        return "--sweep-trainer needs --sweep: add --sweep, or leave --sweep-trainer out"
    return None


def pick_policies(names: list[str] | None, spec: JobSpec) -> list[SimPolicy]:
    names = list(names or DEFAULT_POLICIES)
    out = []
    for n in names:
        if n == "job":
            out.append(policy_from_spec(spec))
        elif n in PRESETS:
            out.append(PRESETS[n])
        else:
            raise ValueError(f"unknown policy {n!r} (choose from: {', '.join([*PRESETS, 'job'])})")
    if "on-demand" not in names:  # the ratios are against it
        out.insert(0, PRESETS["on-demand"])
    return out


@dataclass(frozen=True)
class Replay:
    """One job, trace and prices, ready to replay under any policy (picklable: sweeps fan it out)."""

    spec: JobSpec
    trace: AvailabilityTrace
    trainer: Offer
    spots: list[Offer]
    lengths: LengthModel | None
    max_steps: int | None
    hours: float | None  # trace hours asked for (None: the whole trace, or until the job's steps)
    calibration: Calibration | None = None  # a local job's rates and timings, measured on this machine
    # the trainer alone's hours for the job's steps, where they outlast the trace by far (the replay then
    # ends with the trace, not holding its last count for weeks): see bound_to_trace
    outlasts_h: float | None = None

    def simulate(self, policies: list[SimPolicy]) -> list[SimResult]:
        """One replay per policy, one after another, here."""
        return [self.replay(p) for p in policies]

    def replay(self, policy: SimPolicy, on_progress: Report | None = None) -> SimResult:
        sim = Simulation(self.spec, self.trace, policy, self.trainer, self.spots, self.lengths, self.max_steps)
        return sim.run(on_progress)

    def on_policy(self) -> Replay:
        """The same replay strictly on-policy (max_staleness 0): what the job's staleness is measured against."""
        algo = self.spec.algorithm.model_copy(update={"max_staleness": 0})
        return replace(self, spec=self.spec.model_copy(update={"algorithm": algo}))

    def with_max_workers(self, n: int) -> Replay:
        ro = self.spec.rollout.model_copy(update={"max_workers": n})
        return replace(self, spec=self.spec.model_copy(update={"rollout": ro}))


def prepare(
    spec: JobSpec,
    trace_path: Path | None,
    *,
    catalog: Path | None = None,
    hours: float | None = None,
    lengths: Path | None = None,
    steps: int | None = None,
    constant_workers: int | None = None,
    calibrated: Calibration | bool = True,
) -> Replay:
    """calibrated: for a local tiny-gpt job, True measures this machine (local_calibration), a
    Calibration reuses one, False keeps the spec's perf table and simulate timings as they are."""
    if catalog is not None:
        spec = spec.model_copy(update={"local": spec.local.model_copy(update={"catalog": catalog})})
    if hours is not None:
        spec = spec.model_copy(update={"simulate": spec.simulate.model_copy(update={"hours": hours})})
    if constant_workers is not None:
        if trace_path is not None:
            raise ValueError("--constant-workers and --trace both give the spot capacity: pick one")
        # as long as the job's own market: a job whose steps are a bound (`steps: 100000`) then ends
        # with it, as on the trace (bound_to_trace), not after weeks of constant market
        trace = constant_trace(constant_workers, hours=_market(spec).duration / 3600)
        # as many workers as the capacity allows, and no trace-time compression of a constant market
        ro = spec.rollout.model_copy(update={"max_workers": constant_workers})
        spec = spec.model_copy(update={"rollout": ro, "local": spec.local.model_copy(update={"capacity_scale": 1.0})})
    else:
        trace = load_trace(trace_path) if trace_path else _market(spec)
    trainer, spots = trainer_offer(spec), spot_offers(spec)  # priced as the job file says
    recorded = read_recorded(lengths) if lengths else None  # the file read once, for both
    length_model = LengthModel(recorded=recorded.lengths) if recorded else None
    seen = recorded.acceptance if recorded else None
    if seen is not None and spec.simulate.acceptance is None:  # what the recorded run's drafts measured
        spec = spec.model_copy(update={"simulate": spec.simulate.model_copy(update={"acceptance": seen})})
    cal = None
    if calibrated is not False and needs_calibration(spec):
        if isinstance(calibrated, Calibration):
            cal = calibrated
        else:
            cal = calibrate(spec, replay_lengths=length_model.recorded if length_model else None)
        spec = cal.apply(spec)
        # each local node is one process: its engine model is the accelerator's name alone
        spots = [replace(o, accelerator=one_process(o.accelerator)) for o in spots]
        if length_model is None and spec.rollout.synthetic.lengths.recorded is None:
            length_model = LengthModel(recorded=tuple(sorted(cal.lengths)))
    rp = Replay(
        spec=spec,
        trace=trace,
        trainer=trainer,
        spots=spots,
        lengths=length_model,
        max_steps=steps if steps is not None else (10**9 if hours is not None else None),
        hours=hours,
        calibration=cal,
    )
    return bound_to_trace(rp) if rp.max_steps is None and spec.simulate.hours is None else rp


def _market(spec: JobSpec) -> AvailabilityTrace:
    """The job's own spot market: its `local.trace`, else the built-in one."""
    return load_trace(spec.local.trace) if spec.local.trace else BUILTIN_TRACE


OUTLAST = 2.0  # a job the trainer alone would take more than this many trace lengths for replays the trace
PROBE_STEPS = 4  # steps replayed to extrapolate a job's length


def pace_hours(r: SimResult, steps: int) -> float:
    """Trace hours a replay would take to `steps`, at the pace of its steps after the first (start-up)."""
    later = [x["step_s"] for x in r.step_log[1:]] or [x["step_s"] for x in r.step_log]
    per_step = sum(later) / len(later) if later else float("inf")
    return (r.job_s + (steps - r.steps) * per_step) * r.time_scale / 3600


def _unbounded(rp: Replay, steps: int) -> Replay:
    """`rp` to the job's first `steps` steps, however many hours it asks for."""
    sim = rp.spec.simulate.model_copy(update={"hours": None})
    return replace(rp, spec=rp.spec.model_copy(update={"simulate": sim}), hours=None, max_steps=steps)


def _probe(rp: Replay) -> SimResult:
    """The trainer alone's first steps of the job (PROBE_STEPS), to extrapolate its pace."""
    return _unbounded(rp, min(PROBE_STEPS, rp.spec.algorithm.steps)).replay(PRESETS["on-demand"])


def bound_to_trace(rp: Replay) -> Replay:
    """By default a replay runs the job's steps, as a live job does, holding the trace's last count once
    the trace is over. A job whose steps are a bound, not a plan (`steps: 100000`), would hold it for
    weeks of constant market: where the trainer alone needs more than OUTLAST trace lengths for them
    (a short replay of it, extrapolated), the replay ends with the trace instead."""
    need_h, trace_h = pace_hours(_probe(rp), rp.spec.algorithm.steps), rp.trace.duration / 3600
    if need_h <= OUTLAST * trace_h:
        return rp
    sim = rp.spec.simulate.model_copy(update={"hours": trace_h})
    return replace(rp, spec=rp.spec.model_copy(update={"simulate": sim}), outlasts_h=need_h)


def run(
    spec: JobSpec,
    trace_path: Path | None,
    policies: list[str] | None = None,
    *,
    catalog: Path | None = None,
    hours: float | None = None,
    lengths: Path | None = None,
    steps: int | None = None,
    constant_workers: int | None = None,
) -> tuple[AvailabilityTrace, list[SimResult]]:
    rp = prepare(
        spec, trace_path, catalog=catalog, hours=hours, lengths=lengths, steps=steps, constant_workers=constant_workers
    )
    return rp.trace, rp.simulate(pick_policies(policies, rp.spec))


def check_steps(rp: Replay, results: list[SimResult]) -> None:
    """A replay that trains nothing has no ratios to give: say why and what to change."""
    # by name: a sweep replays each objective at several max_workers
    idle = list({r.policy.name: r.policy for r in results if r.steps == 0}.values())
    if not idle:
        return
    scale = results[0].time_scale
    replayed = max(r.job_s for r in results) * scale / 3600
    sim = rp.spec.simulate
    first = sim.trainer_boot_s if sim.trainer_boot_s is not None else sim.boot_s
    how = _more_hours(rp, idle) if rp.hours is not None else "check simulate.* timings and the perf table"
    raise NoStepError(
        f"no step finished in {replayed:.3g} h of trace ({replayed * 3600 / scale:,.0f} s of job time"
        f"{f' at local.time_scale {scale:g}' if scale != 1 else ''}; the trainer alone needs "
        f"{first:g} s to boot) for: {', '.join(p.name for p in idle)}. {how[:1].upper()}{how[1:]}"
    )


def _more_hours(rp: Replay, idle: list[SimPolicy]) -> str:
    """The --hours that give each idle policy its first step (each replayed to that step), and what
    leaving --hours out does for this job (its steps, or the whole trace where they outlast it by far)."""
    firsts = {p.name: _unbounded(rp, 1).replay(p) for p in idle}
    ends = {
        name: (r.step_log[0]["t0"] + r.step_log[0]["step_s"]) * r.time_scale / 3600
        for name, r in firsts.items()
        if r.step_log
    }
    if not ends:  # none steps however long it runs: the hours are not what is wrong
        return "no --hours will do: without a bound none of them finished a step either; check simulate.* timings"
    name, h = max(ends.items(), key=lambda x: x[1])
    who = "the trainer alone" if name == "on-demand" else name
    at_least = f"--hours {_round_up(h)} or more ({who} ends its first step {h:.3g} h in)"
    steps, trace_h = rp.spec.algorithm.steps, rp.trace.duration / 3600
    if pace_hours(_probe(rp), steps) > OUTLAST * trace_h:
        return f"replay more of it: {at_least}, or leave --hours out to replay the whole trace ({trace_h:.1f} h)"
    return f"replay more of it: {at_least}, or leave --hours out to run the job's {steps} steps"


def _round_up(h: float) -> str:
    """h rounded up to two significant digits, as a user would type it (0.0213 -> 0.022, 0.395 -> 0.4)."""
    digits = max(0, 1 - math.floor(math.log10(h))) if h > 0 else 0
    text = f"{math.ceil(h * 10**digits) / 10**digits:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


# ---- sweep over max_workers x objectives ---------------------------------------------------


@dataclass(frozen=True)
class SweepPoint:
    max_workers: int
    objective: str
    result: SimResult
    mean_workers: float  # spot workers held, averaged over the job
    trainer: str | None = None  # the trainer's accelerators (--sweep-trainer); None: the job's own

    @property
    def label(self) -> str:
        if self.objective == "on-demand":  # a swept trainer shape alone (simulator/trainer_sweep.py)
            return f"trainer {self.trainer} alone"
        fleet = f"objective {self.objective}, max_workers {self.max_workers}"
        return fleet if self.trainer is None else f"trainer {self.trainer}, {fleet}"


def sweep_points(max_workers: int, most: int | None = None) -> list[int]:
    """1, 2, 4, ... up to twice the job's max_workers, and max_workers itself; none above `most`
    (scheduling.most_workers on shared cores: a larger max_workers replays as `most`)."""
    top = max(2 * max_workers, 2)
    pts = {max_workers} if max_workers > 0 else set()
    n = 1
    while n <= top:
        pts.add(n)
        n *= 2
    return sorted({min(p, most) for p in pts} if most is not None else pts)


def replay_point(rp: Replay, max_workers: int, objective: str, on_progress: Report) -> SweepPoint:
    """One sweep point: the job replayed under rlboost with this objective and fleet cap."""
    r = rp.with_max_workers(max_workers).replay(PRESETS[f"rlboost-{objective}"], on_progress)
    held = r.mean_spot_workers
    r.timeline = []  # not plotted in a sweep; keeps what crosses the process boundary small
    r.step_log = []
    return SweepPoint(max_workers, objective, r, held)


def replay_policy(rp: Replay, policy: SimPolicy, on_progress: Report) -> SimResult:
    """The job replayed under one policy (a sweep's baseline, or a row of the policy table)."""
    return rp.replay(policy, on_progress)


OnProgress = Callable[[int, float], None]  # (replay's index, fraction done)


def simulate_policies(
    rp: Replay, policies: list[SimPolicy], *, jobs: int | None = None, on_progress: OnProgress | None = None
) -> list[SimResult]:
    """Every policy's replay, in parallel processes (`jobs`; 1: here, one after another), in their order."""
    return run_all([partial(replay_policy, rp, p) for p in policies], jobs=jobs, on_progress=on_progress)


def sweep_order(points: list[int]) -> list[tuple[int, str]]:
    """The sweep's replays as they start: the largest fleets replay longest, so they go first and no
    process is left with one at the end."""
    return sorted(((n, o) for n in points for o in SWEEP_OBJECTIVES), key=lambda p: -p[0])


def sweep(
    rp: Replay,
    points: list[int],
    *,
    jobs: int | None = None,
    on_progress: OnProgress | None = None,
) -> tuple[SimResult, list[SweepPoint]]:
    """Every max_workers x objective point (`sweep_order`) and, last, the on-demand baseline (cheap: no
    spot worker; it fills a gap at the end), in parallel processes. on_progress's index is the replay's
    place in that order."""
    todo = sweep_order(points)
    tasks: list[Callable[[Report], SweepPoint | SimResult]] = [partial(replay_point, rp, n, o) for n, o in todo]
    tasks.append(partial(replay_policy, rp, PRESETS["on-demand"]))
    *out, base = run_all(tasks, jobs=jobs, on_progress=on_progress)
    assert isinstance(base, SimResult)
    swept = [p for p in out if isinstance(p, SweepPoint)]
    swept.sort(key=lambda p: (p.max_workers, SWEEP_OBJECTIVES.index(p.objective)))
    return base, swept


# ---- a deadline, up front --------------------------------------------------------------------


@dataclass(frozen=True)
class DeadlineEstimate:
    """Hours to finish the job's steps: the trainer alone, and with max_workers always available (the
    fastest any spot market can make it), extrapolated from a short replay of each."""

    deadline_h: float
    alone_h: float
    fleet_h: float | None  # None: the job has no spot worker to add

    def lines(self) -> list[str]:
        head = f"deadline {self.deadline_h:g} h:"
        fleet = "" if self.fleet_h is None else f"; with every spot worker always there ~{self.fleet_h:.1f} h"
        est = f"the trainer alone needs ~{self.alone_h:.1f} h{fleet}"
        if self.alone_h <= self.deadline_h:
            return [f"{head} {est}: met without spot (the fleet is sized by rollout.objective)"]
        if self.fleet_h is not None and self.fleet_h <= self.deadline_h:
            return [f"{head} {est}: needs spot workers; `rlboost simulate` with a trace tells how likely"]
        return [f"{head} {est}: cannot be met; raise deadline_hours or max_workers, or cut algorithm.steps"]


def estimate_deadline(spec: JobSpec, probe_steps: int = PROBE_STEPS) -> DeadlineEstimate | None:
    """None when the job has no deadline."""
    if spec.deadline_hours is None:
        return None
    steps, mw = spec.algorithm.steps, spec.rollout.max_workers
    k = min(steps, probe_steps)
    with_fleet = mw > 0 and bool(spot_offers(spec))
    # one replay set-up (a local job calibrates once); on-demand ignores the spot capacity
    rp = prepare(spec, None, constant_workers=mw if with_fleet else 0, steps=k)
    alone, *fleet = rp.simulate([PRESETS["on-demand"], *([PRESETS["rlboost-fixed"]] if with_fleet else [])])

    return DeadlineEstimate(
        spec.deadline_hours, pace_hours(alone, steps), pace_hours(fleet[0], steps) if fleet else None
    )
