"""`simulate --sweep --sweep-trainer H100:4,H100:8`: the sweep (max_workers x objectives) once per trainer shape.

Each shape is the job file with `trainer.accelerators` replaced, so the code that prices and rates the
job's own trainer prices and rates it: `providers.pricing.trainer_offer` (job file, then `local.catalog`,
then the built-in table) and `scheduling.trainer_tokens_per_s` (the perf table, per GPU x GPUs x nodes).
The reserved engine (`rollout.trainer_engine`) is the whole trainer cluster (`reserved_accelerator`), so
it generates on the new shape's GPUs too: a bigger trainer also generates more while it waits.
Figures the job file gives for its own trainer are per its accelerators: `trainer.hourly_price` scales
with the GPU count for the same accelerator (another accelerator is priced as the job would price it
with no hourly_price), and `model.train_tokens_per_s` (synthetic) by the perf table's ratio of the two.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from rlboost.contracts.perf import lookup_perf, split_accelerator, train_rate
from rlboost.contracts.spec import JobSpec
from rlboost.providers.pricing import PricingError, catalog_sells_trainer, trainer_offer
from rlboost.rollout.scheduling import perf_table
from rlboost.simulator.cli import (
    OnProgress,
    Replay,
    SweepPoint,
    replay_point,
    replay_policy,
    sweep_order,
)
from rlboost.simulator.local_calibration import needs_calibration
from rlboost.simulator.parallel import Report, run_all
from rlboost.simulator.presets import PRESETS
from rlboost.simulator.result import SimResult

FLAG = "--sweep-trainer"
ALONE = "on-demand"  # a trainer shape's own row with no spot worker (max_workers 0)


def same_shape(a: str | None, b: str | None) -> bool:
    """'h100:8' is 'H100:8'; 'A100' is 'A100:1'."""
    (na, ca), (nb, cb) = split_accelerator(a), split_accelerator(b)
    return na.lower() == nb.lower() and ca == cb


def same_kind(a: str | None, b: str | None) -> bool:
    return split_accelerator(a)[0].lower() == split_accelerator(b)[0].lower()


def parse_trainers(text: str, spec: JobSpec) -> list[str]:
    """The shapes `--sweep-trainer` names, in its order (duplicates once), each NAME:COUNT with a
    performance model; ValueError naming the flag and the fix."""
    eg = "e.g. H100:4,H100:8"
    out: list[str] = []
    for raw in (x.strip() for x in text.split(",")):
        if not raw:
            continue
        name, colon, count = raw.partition(":")
        if not colon or not name or not count.isdigit():
            raise ValueError(f"{FLAG} {text!r}: {raw!r} is not ACCELERATOR:GPUS; give the GPUs of each shape, {eg}")
        if int(count) < 1:
            raise ValueError(f"{FLAG} {text!r}: {raw!r} has no GPUs; give 1 or more per shape, {eg}")
        if lookup_perf(name, perf_table(spec)) is None:
            known = ", ".join(sorted(perf_table(spec)))
            raise ValueError(
                f"{FLAG} {text!r}: no performance model for {name!r}; pick one of {known}, "
                "or give its rates under perf: in the job file"
            )
        if not any(same_shape(raw, o) for o in out):
            out.append(f"{name}:{int(count)}")
    if not out:
        raise ValueError(f"{FLAG} {text!r}: give at least one trainer shape, {eg}")
    return out


def sweep_trainer_error(spec: JobSpec) -> str | None:
    """Why this job's trainer cannot be swept (None: it can)."""
    if needs_calibration(spec):
        return (
            f"{FLAG}: a local tiny-gpt job's trainer is one process on this machine, whatever its accelerators, "
            "so its size changes no rate here; leave --sweep-trainer out (sweep a cloud job file's trainer)"
        )
    return None


def per_gpu_price(price: float, acc: str, old: str | None) -> float:
    """A node-hour of `old` (the job's trainer) re-priced for `acc`, the same kind: per GPU."""
    return price * split_accelerator(acc)[1] / split_accelerator(old)[1]


def trainer_spec(spec: JobSpec, acc: str) -> JobSpec:
    """The job file with its trainer's accelerators (per node) replaced by `acc`."""
    old = spec.trainer.accelerators
    (_, count), (old_name, old_count) = split_accelerator(acc), split_accelerator(old)
    price = spec.trainer.hourly_price
    if price is not None:  # a node-hour of the job's accelerators: per GPU for the same kind
        price = per_gpu_price(price, acc, old) if same_kind(acc, old) else None
    trainer = spec.trainer.model_copy(update={"accelerators": acc, "hourly_price": price})
    out = spec.model_copy(update={"trainer": trainer})
    given = spec.model.train_tokens_per_s if spec.model.kind == "synthetic" else None
    if given is not None:  # the job's measured rate, scaled as the perf table scales the trainer
        if same_kind(acc, old):
            ratio = count / old_count
        else:
            try:
                ratio = train_rate(acc, perf_table(spec)) / train_rate(old, perf_table(spec))
            except KeyError:
                raise ValueError(
                    f"{FLAG} {acc}: model.train_tokens_per_s is {old or 'cpu'}'s and the perf table has no "
                    f"{old_name!r} to scale it by; sweep {old_name} shapes, or give {old_name} under perf:"
                ) from None
        out = out.model_copy(update={"model": spec.model.model_copy(update={"train_tokens_per_s": given * ratio})})
    return out


def with_trainer(rp: Replay, acc: str) -> Replay:
    """`rp` with its trainer's accelerators replaced by `acc`, priced and rated as the job file would be;
    see price_source for the one exception."""
    spec = trainer_spec(rp.spec, acc)
    if per_gpu_of_job(rp.spec, acc):
        price = per_gpu_price(rp.trainer.hourly_price, acc, rp.spec.trainer.accelerators)
        offer = replace(rp.trainer, accelerator=acc, hourly_price=price, on_demand_price=price)
        return replace(rp, spec=spec, trainer=offer)
    try:
        offer = trainer_offer(spec)
    except PricingError as e:
        raise PricingError(f"{FLAG} {acc}: {e}") from None
    return replace(rp, spec=spec, trainer=offer)


def per_gpu_of_job(spec: JobSpec, acc: str) -> bool:
    """Whether `acc` is priced per GPU at the job's own trainer's price: the same accelerator, which
    local.catalog prices for the job's count but not for this one (AWS sells A100 in eights only). The
    built-in table would price it from another source than the job's own, and a trainer-size comparison
    across two price sources says more about them than about the size."""
    if spec.trainer.hourly_price is not None or not same_kind(acc, spec.trainer.accelerators):
        return False
    return catalog_sells_trainer(spec) and not catalog_sells_trainer(trainer_spec(spec, acc))


def price_source(spec: JobSpec, acc: str) -> str:
    """Where `acc`'s $/h comes from, for the table's caption."""
    if spec.trainer.hourly_price is not None and trainer_spec(spec, acc).trainer.hourly_price is not None:
        return "trainer.hourly_price" + ("" if same_shape(acc, spec.trainer.accelerators) else " per GPU")
    if per_gpu_of_job(spec, acc):
        return f"the catalog's {job_shape(spec)} per GPU: it sells no {acc} there"
    return "the catalog" if catalog_sells_trainer(trainer_spec(spec, acc)) else "the built-in table"


def price_note(rp: Replay, trainers: list[str]) -> str:
    """Each shape's trainer $/h and where it came from (job file, catalog, built-in table)."""
    own = job_shape(rp.spec)
    each = [f"{own} ${rp.trainer.hourly_price:,.2f} ({price_source(rp.spec, own)})"]
    shown = [t for t in trainers if not same_shape(t, own)]
    each += [f"{t} ${with_trainer(rp, t).trainer.hourly_price:,.2f} ({price_source(rp.spec, t)})" for t in shown]
    return "trainer $/h: " + ", ".join(each)


def job_shape(spec: JobSpec) -> str:
    """The job's trainer as --sweep-trainer writes a shape (its accelerators per node): 'A100' -> 'A100:1'."""
    name, count = split_accelerator(spec.trainer.accelerators)
    return f"{name}:{count}"


def trainer_sweep_order(trainers: list[str], points: list[int], job_trainer: str | None) -> list[tuple[str, int, str]]:
    """(trainer, max_workers, objective) as the replays start: each shape's fleets (largest first, as
    sweep_order), then each shape's trainer alone (max_workers 0, `ALONE`; not the job's own: that is
    the baseline, replayed last)."""
    fleets = [(t, n, o) for n, o in sweep_order(points) for t in trainers]
    alone = [(t, 0, ALONE) for t in trainers if not same_shape(t, job_trainer)]
    return [*fleets, *alone]


def _shape_point(rp: Replay, trainer: str, n: int, objective: str, on_progress: Report) -> SweepPoint:
    if objective == ALONE:
        r = rp.replay(PRESETS["on-demand"], on_progress)
        r.timeline, r.step_log = [], []  # as replay_point: not plotted, kept small across processes
        return SweepPoint(0, ALONE, r, 0.0, trainer)
    return replace(replay_point(rp, n, objective, on_progress), trainer=trainer)


def sweep_trainers(
    rp: Replay,
    trainers: list[str],
    points: list[int],
    *,
    jobs: int | None = None,
    on_progress: OnProgress | None = None,
) -> tuple[SimResult, list[SweepPoint]]:
    """`simulator.cli.sweep` for each trainer shape, and each shape alone; the baseline (the ratios'
    on-demand) stays the job's own trainer alone, replayed last. Points sorted by shape (as given),
    max_workers, objective."""
    shapes = {t: with_trainer(rp, t) for t in trainers}  # priced up front: a shape without a price fails first
    order = trainer_sweep_order(trainers, points, rp.spec.trainer.accelerators)
    tasks = [partial(_shape_point, shapes[t], t, n, o) for t, n, o in order]
    tasks.append(partial(replay_policy, rp, PRESETS["on-demand"]))
    *out, base = run_all(tasks, jobs=jobs, on_progress=on_progress)
    assert isinstance(base, SimResult)
    swept = [p for p in out if isinstance(p, SweepPoint)]
    objectives = [ALONE, "cost", "throughput"]
    swept.sort(key=lambda p: (trainers.index(p.trainer or ""), p.max_workers, objectives.index(p.objective)))
    return base, swept
