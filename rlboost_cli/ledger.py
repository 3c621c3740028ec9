"""The cost ledger, derived from the durable instance records (never from controller memory).

An instance is billed from `started_clock` (its first 'running') to `ended_clock` (its terminal
state), or, while it is still live, to the job's latest provider `clock`. Instances that never ran
cost nothing (clouds do not bill unfulfilled spot requests). Prices are per instance-hour.

The savings baseline prices the same hours at on-demand rates. A spot instance recorded without an
on-demand price is counted at its own price in that baseline (no savings claimed) and noted.
Totals are computed as sums of the lines, so they always add up.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from rlboost_cli.state import InstanceRow, JobRow, StateStore


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
    notes: tuple[str, ...] = ()

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


def _summary(store: StateStore, jobs: list[JobRow]) -> CostSummary:
    costs: list[InstanceCost] = []
    unpriced = 0
    steps = 0
    tokens = 0
    for job in jobs:
        for inst in store.instances(job.id):
            costs.append(instance_cost(inst, job.clock))
            if inst.kind == "spot" and inst.on_demand_price is None and inst.started_clock is not None:
                unpriced += 1
        rows = store.steps(job.id)
        steps += len(rows)
        tokens += sum(r.tokens for r in rows)

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
            instance_hours=sum(c.hours for c in group),
            dollars=sum(c.dollars for c in group),
            on_demand_equivalent_dollars=sum(c.on_demand_equivalent_dollars for c in group),
        )
        for (kind, cloud, acc), group in sorted(groups.items(), key=lambda kv: (kv[0][0] != "on-demand", kv[0]))
    )
    dollars = sum(line.dollars for line in lines)
    od_equiv = sum(line.on_demand_equivalent_dollars for line in lines)
    savings = od_equiv - dollars
    notes = []
    if unpriced:
        notes.append(
            f"{unpriced} spot instance(s) have no on-demand price on record; the savings baseline "
            "counts them at their spot price"
        )
    return CostSummary(
        lines=lines,
        instances=tuple(costs),
        instance_hours=sum(line.instance_hours for line in lines),
        dollars=dollars,
        on_demand_equivalent_dollars=od_equiv,
        savings_dollars=savings,
        savings_fraction=savings / od_equiv if od_equiv > 0 else None,
        steps=steps,
        tokens=tokens,
        dollars_per_step=dollars / steps if steps else None,
        dollars_per_million_tokens=dollars / tokens * 1e6 if tokens else None,
        notes=tuple(notes),
    )


def summarize(store: StateStore, job_id: int) -> CostSummary:
    return _summary(store, [store.job_by_id(job_id)])


def summarize_all(store: StateStore) -> CostSummary:
    return _summary(store, store.list_jobs())
