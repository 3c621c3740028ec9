"""The cost ledger, derived from the durable instance records (never from controller memory).

An instance is billed from `started_clock` (its first 'running') to `ended_clock` (its terminal
state), or, while it is still live, to the job's latest provider `clock`. Instances that never ran
cost nothing (clouds do not bill unfulfilled spot requests). Prices are per instance-hour.

The savings baseline prices the same hours at on-demand rates. A spot instance recorded without an
on-demand price is counted at its own price in that baseline (no savings claimed) and noted.
Totals are computed as sums of the lines, so they always add up.

The on-demand counterfactual answers "what did spot save me": what the trainer alone would have
cost to train the same tokens, at the rate this job's own steps with no spot worker up measured.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

from rlboost.cli.state import InstanceRow, JobRow, StateStore, StepRow
from rlboost.cli.step_metrics import steps_busy_share


@dataclass(frozen=True)
class InstanceCost:
    instance_id: str
    job_id: int
    kind: str
    cloud: str
    accelerator: str
    hours: float
    dollars: float
    on_demand_equivalent_dollars: float
    live: bool


@dataclass(frozen=True)
class CostLine:
    kind: str  # 'spot' | 'on-demand'
    cloud: str
    accelerator: str  # 'cpu' when the instance has none
    instances: int
    instance_hours: float
    dollars: float
    on_demand_equivalent_dollars: float


@dataclass(frozen=True)
class GeneratedTokens:
    """Tokens generated on spot workers and on the reserved (trainer-side) engine, and what each cost.

    Counted from steps whose record carries the split (rlboost >= schema 3); the reserved side's
    dollars are the trainer's whole bill, which also pays for training."""

    spot: int
    reserved: int
    spot_dollars: float
    reserved_dollars: float

    @property
    def spot_dollars_per_million(self) -> float | None:
        return self.spot_dollars / self.spot * 1e6 if self.spot else None

    @property
    def reserved_dollars_per_million(self) -> float | None:
        return self.reserved_dollars / self.reserved * 1e6 if self.reserved else None


@dataclass(frozen=True)
class Counterfactual:
    """The trainer alone, training the same tokens at the rate this job measured without spot."""

    dollars: float
    alone_tokens_per_s: float | None  # trained tokens/s of step on the steps with no spot worker (one job)
    alone_steps: int  # how many steps that rate is measured on
    saved_dollars: float  # counterfactual - what the job cost
    saved_fraction: float | None


@dataclass(frozen=True)
class CostSummary:
    lines: tuple[CostLine, ...]
    instances: tuple[InstanceCost, ...]
    instance_hours: float
    dollars: float
    on_demand_equivalent_dollars: float
    savings_dollars: float  # vs running the same hours all on-demand
    savings_fraction: float | None  # savings / on-demand equivalent; None when that is 0
    steps: int
    tokens: int  # generated tokens of recorded (finished) steps
    dollars_per_step: float | None
    dollars_per_million_tokens: float | None
    generated: GeneratedTokens = field(default_factory=lambda: GeneratedTokens(0, 0, 0.0, 0.0))
    refused_launches: int = 0  # launches that never ran (refused, or cancelled first): not billed, not instances
    preemptions: int = 0
    migrations: int = 0  # partial responses continued on another engine
    counterfactual: Counterfactual | None = None
    notes: tuple[str, ...] = ()
    # the trainer's training seconds over its steps' wall seconds (None: no step carries them)
    trainer_busy_share: float | None = None
    # algorithm.max_staleness: the steps trained on weights older than the step's own, and by how many
    # versions at most (0, 0: every step on-policy)
    stale_steps: int = 0
    max_staleness: int = 0

    @property
    def total_dollars(self) -> float:
        """Alias of dollars (the total spend)."""
        return self.dollars


def billed_hours(inst: InstanceRow, job_clock: float | None) -> float:
    if inst.started_clock is None:
        return 0.0
    end = inst.ended_clock if inst.terminal else job_clock
    if end is None:
        end = inst.last_clock  # live, and the job has reported no clock yet
    if end is None:
        return 0.0
    return max(0.0, end - inst.started_clock) / 3600.0


def instance_cost(inst: InstanceRow, job_clock: float | None) -> InstanceCost:
    hours = billed_hours(inst, job_clock)
    od_price = inst.on_demand_price
    if od_price is None:
        od_price = inst.hourly_price  # on-demand: its own price; spot without one: no savings claimed
    return InstanceCost(
        instance_id=inst.instance_id,
        job_id=inst.job_id,
        kind=inst.kind,
        cloud=inst.cloud,
        accelerator=inst.accelerator or "cpu",
        hours=hours,
        dollars=hours * inst.hourly_price,
        on_demand_equivalent_dollars=hours * od_price,
        live=not inst.terminal,
    )


def alone_steps(steps: list[StepRow], instances: list[InstanceRow]) -> list[StepRow]:
    """The steps that measure the trainer alone: no spot worker up at any time during the step, and
    not the first step after a trainer (re)started.

    "Up" is from its start to its end on the billing clock, booting and leaving included: on a machine
    the trainer shares (the local provider) a booting worker slows the trainer's step 1.5-2.5x, and a
    worker that joined mid-step generated part of it (`spot_workers`, counted at the step's start, misses
    both). A step spans the billing clock from the previous recording to its own; steps recorded at
    one poll share that span. The first step after a trainer starts (the job's first, after a resume
    or a restart) carries warm-up: 5x a later step in the local demo."""
    up = [
        (i.started_clock, math.inf if i.ended_clock is None else i.ended_clock)
        for i in instances
        if i.kind == "spot" and i.started_clock is not None
    ]
    starts = [i.started_clock for i in instances if i.role == "trainer" and i.started_clock is not None]
    warm = {0} | {next((k for k, s in enumerate(steps) if s.clock >= t), -1) for t in starts}
    clocks = sorted({s.clock for s in steps})
    out = []
    for k, s in enumerate(steps):
        if k in warm or s.spot_workers or s.spot_tokens or s.step_s <= 0:
            continue
        j = bisect.bisect_left(clocks, s.clock)
        begin = clocks[j - 1] if j > 0 else -math.inf
        if not any(a <= s.clock and b > begin for a, b in up):
            out.append(s)
    return out


def trainer_alone(
    job: JobRow, steps: list[StepRow], instances: list[InstanceRow], trainer_dollars: float
) -> Counterfactual | None:
    """What the trainer alone would have cost for this job's trained tokens (None: nothing measured).

    The rate comes from the job's own steps that ran with no spot worker up (`alone_steps`). The time
    outside steps (boot, teardown) is the same either way, so only the steps' share of the trainer's
    bill scales with the slower rate."""
    alone = alone_steps(steps, instances)
    step_s = sum(s.step_s for s in steps)
    if not alone or step_s <= 0 or trainer_dollars <= 0 or job.started_at is None:
        return None
    rate = sum(s.tokens for s in alone) / sum(s.step_s for s in alone)
    alone_s = sum(s.tokens for s in steps) / rate
    wall = max((job.ended_at or time.time()) - job.started_at, step_s)
    dollars = trainer_dollars * (1.0 + (alone_s - step_s) / wall)
    return Counterfactual(dollars, rate, len(alone), 0.0, None)


def billed(inst: InstanceRow) -> bool:
    """False for a launch that never ran (capacity refused, or gone before it started)."""
    return not (inst.started_clock is None and inst.terminal)


def spent_dollars(store: StateStore, job_id: int) -> float:
    """A job's spend so far, as `summarize` counts it, without reading its steps: the controller asks
    after every step, and reading every step row each time made a long job's controller O(steps²) (at
    3,000 steps it fell a minute behind the trainer's status and relaunched a healthy trainer)."""
    clock = store.job_by_id(job_id).clock
    return sum((instance_cost(i, clock).dollars for i in store.instances(job_id) if billed(i)), 0.0)


def _summary(store: StateStore, jobs: list[JobRow]) -> CostSummary:
    costs: list[InstanceCost] = []
    unpriced = refused = preemptions = migrations = 0
    steps = 0
    tokens = 0
    spot_tok = reserved_tok = 0
    split_dollars = [0.0, 0.0]  # spot, reserved: of the jobs whose steps carry the split
    counterfactual = 0.0
    measured = stepped = 0  # jobs with a counterfactual, jobs with steps
    alone_rates: list[Counterfactual] = []
    all_rows: list[StepRow] = []
    for job in jobs:
        job_costs = []
        instances = store.instances(job.id)
        for inst in instances:
            if not billed(inst):
                refused += 1
                continue
            job_costs.append(instance_cost(inst, job.clock))
            if inst.kind == "spot" and inst.on_demand_price is None and inst.started_clock is not None:
                unpriced += 1
            preemptions += inst.state == "preempted"
        costs += job_costs
        rows = store.steps(job.id)
        all_rows += rows
        steps += len(rows)
        tokens += sum(r.tokens for r in rows)
        migrations += sum(r.migrated for r in rows)
        stepped += bool(rows)
        trainer_dollars = sum(c.dollars for c in job_costs if c.kind == "on-demand")
        spot_dollars = sum(c.dollars for c in job_costs if c.kind == "spot")
        split = [r for r in rows if r.gen_tokens is not None and r.spot_tokens is not None]
        if split and len(split) == len(rows):
            spot_tok += sum(r.spot_tokens or 0 for r in split)
            reserved_tok += sum((r.gen_tokens or 0) - (r.spot_tokens or 0) for r in split)
            split_dollars[0] += spot_dollars
            split_dollars[1] += trainer_dollars
        cf = trainer_alone(job, rows, instances, trainer_dollars)
        if cf is not None:
            measured += 1
            alone_rates.append(cf)
            counterfactual += cf.dollars
    groups: dict[tuple[str, str, str], list[InstanceCost]] = defaultdict(list)
    for c in costs:
        groups[(c.kind, c.cloud, c.accelerator)].append(c)
    # on-demand first, then spot; within a kind by cloud and accelerator
    lines = tuple(
        CostLine(
            kind=kind,
            cloud=cloud,
            accelerator=acc,
            instances=len(group),
            instance_hours=sum((c.hours for c in group), 0.0),
            dollars=sum((c.dollars for c in group), 0.0),
            on_demand_equivalent_dollars=sum((c.on_demand_equivalent_dollars for c in group), 0.0),
        )
        for (kind, cloud, acc), group in sorted(groups.items(), key=lambda kv: (kv[0][0] != "on-demand", kv[0]))
    )
    # sums start at 0.0: with no instance they are still floats, as `--json` readers expect of money
    dollars = sum((line.dollars for line in lines), 0.0)
    od_equiv = sum((line.on_demand_equivalent_dollars for line in lines), 0.0)
    savings = od_equiv - dollars
    notes = []
    cf = None
    if measured and measured == stepped:
        cf = Counterfactual(
            dollars=counterfactual,
            alone_tokens_per_s=alone_rates[0].alone_tokens_per_s if len(alone_rates) == 1 else None,
            alone_steps=sum(c.alone_steps for c in alone_rates),
            saved_dollars=counterfactual - dollars,
            saved_fraction=(counterfactual - dollars) / counterfactual if counterfactual > 0 else None,
        )
    elif steps:
        notes.append(
            "no on-demand counterfactual: no step ran with no spot worker up (booting or serving) after "
            "the trainer's first, so its rate alone is not measured (`rlboost simulate` estimates it)"
        )
    if unpriced:
        notes.append(
            f"{unpriced} spot instance(s) have no on-demand price on record; the savings baseline "
            "counts them at their spot price"
        )
    return CostSummary(
        lines=lines,
        instances=tuple(costs),
        instance_hours=sum((line.instance_hours for line in lines), 0.0),
        dollars=dollars,
        on_demand_equivalent_dollars=od_equiv,
        savings_dollars=savings,
        savings_fraction=savings / od_equiv if od_equiv > 0 else None,
        steps=steps,
        tokens=tokens,
        dollars_per_step=dollars / steps if steps else None,
        dollars_per_million_tokens=dollars / tokens * 1e6 if tokens else None,
        generated=GeneratedTokens(spot_tok, reserved_tok, split_dollars[0], split_dollars[1]),
        refused_launches=refused,
        preemptions=preemptions,
        migrations=migrations,
        counterfactual=cf,
        notes=tuple(notes),
        trainer_busy_share=steps_busy_share(all_rows),
        stale_steps=sum(1 for r in all_rows if r.staleness),
        max_staleness=max((r.staleness for r in all_rows), default=0),
    )


def summarize(store: StateStore, job_id: int) -> CostSummary:
    return _summary(store, [store.job_by_id(job_id)])


def summarize_all(store: StateStore) -> CostSummary:
    return _summary(store, store.list_jobs())
