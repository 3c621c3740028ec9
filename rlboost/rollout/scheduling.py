"""From a job spec to the scheduling policies and models, one way for the live runtime and the simulator.

Both build their coordinator options, offload policy, length model and engine/trainer performance
models here, so a live run and `rlboost simulate` of the same job file make the same decisions.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from rlboost.contracts.lengths import LengthModel
from rlboost.contracts.mounts import mounted_name
from rlboost.contracts.perf import AcceleratorPerf, EngineModel, engine_model, split_accelerator, train_rate
from rlboost.contracts.protocol import MOUNTED_PATH_KEY, Speculation
from rlboost.contracts.provider_kinds import provider_kind
from rlboost.contracts.spec import JobSpec
from rlboost.contracts.wording import spot_workers
from rlboost.rollout.policies.fleet import FleetDecision, FleetGoal, FleetPolicy, Objective, StepSample
from rlboost.rollout.policies.lengths import LengthStats
from rlboost.rollout.policies.migration import MigrationConfig
from rlboost.rollout.policies.offload import OffloadPolicy, make_offload
from rlboost.rollout.policies.placement import OfferLike, PlacementTracker
from rlboost.rollout.policies.staleness import swaps_in_flight
from rlboost.rollout.policies.tick import TickCadence

if TYPE_CHECKING:
    from rlboost.rollout.coordinator import CoordinatorRules
    from rlboost.rollout.live import CoordinatorConfig


def perf_table(spec: JobSpec) -> dict[str, AcceleratorPerf]:
    return spec.perf_table()


def reserved_accelerator(spec: JobSpec) -> str:
    """The whole trainer cluster as one accelerator string, e.g. 2 nodes of A100:8 -> 'A100:16'."""
    name, count = split_accelerator(spec.trainer.accelerators)
    return f"{name}:{count * spec.trainer.nodes}"


def trainer_tokens_per_s(spec: JobSpec) -> float:
    """Training throughput of the trainer cluster (tokens/s)."""
    if spec.model.kind == "synthetic" and spec.model.train_tokens_per_s is not None:
        return spec.model.train_tokens_per_s
    return train_rate(spec.trainer.accelerators, perf_table(spec), spec.trainer.nodes)


def trains_while_generating(spec: JobSpec) -> bool:
    """Whether the trainer can train finished groups while the tail still generates (what makes an
    offload pay). Every learner streams (DESIGN.md: "must hold for every real model kind"): the
    synthetic one, and the real ones (tiny-gpt, hf, ddp/fsdp) through the streamed update
    (rlboost/trainer/streaming.py, Learner.add_groups), so the model kind never changes a step's speed."""
    return True


def length_model(spec: JobSpec) -> LengthModel:
    lens = spec.rollout.synthetic.lengths
    if lens.recorded is not None:
        return LengthModel.from_recorded(lens.recorded)
    median = lens.median_tokens if lens.median_tokens is not None else max(1.0, spec.algorithm.max_new_tokens / 8)
    return LengthModel(median=median, sigma=lens.sigma, prompt_sigma=lens.prompt_sigma)


def engine_model_for(spec: JobSpec, accelerator: str | None, speed: float = 1.0) -> EngineModel:
    return engine_model(accelerator, perf_table(spec), spec.rollout.engine_batch, speed=speed)


def offload_policy(spec: JobSpec, name: str | None = None, *, overlap: bool = True) -> OffloadPolicy:
    """The job's offload policy (or the one `name`d); `overlap` False: a synchronous step, which
    trains only after its last response."""
    return make_offload(
        spec.rollout.offload_policy if name is None else name,
        train_tokens_per_s=trainer_tokens_per_s(spec),
        overlap=trains_while_generating(spec) and overlap,
        min_box_s=spec.rollout.offload_min_box_s,
    )


def migration_config(spec: JobSpec) -> MigrationConfig | None:
    if not spec.rollout.migration:
        return None
    return MigrationConfig(min_gain_s=spec.rollout.migration_min_gain_s)


def tick_cadence(spec: JobSpec) -> TickCadence:
    """When this job's coordinator reconsiders a step (the simulator replays the same ticks)."""
    return TickCadence()


def coordinator_rules(
    spec: JobSpec,
    *,
    offload: str | None = None,
    migrate: bool | None = None,
    dispatch: str | None = None,
    overlap: bool = True,
) -> CoordinatorRules:
    """The scheduling core this job's coordinator runs (rollout/coordinator.py). A replay of another
    policy (simulator/presets.py) names its own offload policy, migration and dispatch instead of the
    job's; `overlap` False: a synchronous step trains only after its last response."""
    from rlboost.rollout.coordinator import CoordinatorRules

    migrate = spec.rollout.migration if migrate is None else migrate
    migration = migration_config(spec) if migrate else None
    if migrate and migration is None:
        migration = MigrationConfig()
    stats = LengthStats(spec.algorithm.max_new_tokens)
    mode = spec.rollout.dispatch_policy if dispatch is None else dispatch
    return CoordinatorRules(
        offload_policy(spec, offload, overlap=overlap),
        tick_cadence(spec),
        migration,
        stats,
        mode,
        siblings=spec.rollout.sibling_scheduling,
    )


def coordinator_config(
    spec: JobSpec, eos_id: int, decode: Callable[[list[int]], str] | None = None, vocab_size: int | None = None
) -> CoordinatorConfig:
    """This job's CoordinatorConfig (rlboost/rollout/live.py); weights_url is set once the server is up.
    `decode`: the task's response text (Task.decode_response), for algorithm.stop; without one (a replay
    of synthetic tokens) stop strings are not checked. `vocab_size`: the learner's, which bounds every
    token id a worker may send."""
    from rlboost.contracts.stop import stop_rule
    from rlboost.rollout.live import CoordinatorConfig  # aiohttp and the rest: only where a coordinator runs

    return CoordinatorConfig(
        job_seed=spec.algorithm.seed,
        temperature=spec.algorithm.temperature,
        top_k=spec.algorithm.top_k,
        top_p=spec.algorithm.top_p,
        chunk_tokens=spec.rollout.stream_chunk_tokens,
        heartbeat_s=min(1.0, spec.rollout.heartbeat_timeout_s / 4),
        heartbeat_timeout_s=spec.rollout.heartbeat_timeout_s,
        weights_url="",
        model=welcome_model(spec),
        engine_dtype=spec.rollout.engine_dtype,
        engine_batch=spec.rollout.engine_batch,
        eos_id=eos_id,
        dispatch_mode=spec.rollout.dispatch_policy,
        migration=migration_config(spec),
        max_new_tokens=spec.algorithm.max_new_tokens,
        perf=perf_table(spec),
        flush_s=spec.rollout.flush_s,
        tick=tick_cadence(spec),
        sibling_scheduling=spec.rollout.sibling_scheduling,
        speculative=Speculation.model_validate(spec.rollout.speculative.model_dump()),
        stop=stop_rule(spec.algorithm.stop, decode),
        vocab_size=vocab_size,
        swap_in_flight=swaps_in_flight(
            spec.algorithm.weight_swap, spec.algorithm.max_staleness, spec.rollout.tail_batching
        ),
    )


def welcome_model(spec: JobSpec) -> dict:
    """The `model` dict workers get in `welcome`: the ModelSpec, plus, for synthetic engines, the
    performance table and the length model (the node picks its own accelerator's entry)."""
    out = spec.model.model_dump(mode="json")
    if spec.model.kind == "hf" and spec.model.path:
        # model.path in a file_mounts destination: a worker reads its own node's copy, not this node's
        named = mounted_name(spec.model.path, spec.file_mounts)
        if named is not None:
            out["path"], out[MOUNTED_PATH_KEY] = named, True
    if spec.rollout.engine == "synthetic":
        lm = length_model(spec)
        out["synthetic"] = {
            "perf": {k: asdict(v) for k, v in perf_table(spec).items()},
            "lengths": {
                "median": lm.median,
                "sigma": lm.sigma,
                "prompt_sigma": lm.prompt_sigma,
                "recorded": list(lm.recorded),
            },
            "default_accelerator": "cpu",
            "prompt_tokens": spec.rollout.synthetic.prompt_tokens,
        }
    return out


def placement_tracker(spec: JobSpec, offers) -> PlacementTracker:
    """The placement policy for these offers, with performance-model priors when every offer's
    accelerator has a model (a partial table would mix units with relative throughputs)."""
    priors: dict[str, float] = {}
    for o in offers:
        try:
            priors[o.key] = engine_model_for(spec, o.accelerator).full_rate() * o.throughput
        except (KeyError, ValueError):
            priors = {}
            break
    # the boot prior on the clock placement is fed: the provider's billing clock
    boot_s = provider_kind(spec.provider).boot_prior_s * billing_scale(spec)
    return PlacementTracker(prior_rate=priors, boot_s=boot_s)


def fleet_policy(spec: JobSpec, offers) -> FleetPolicy:
    """The fleet-size policy, with the trainer's own engine counted in units of the best-modelled spot
    worker's decode rate (1 when the performance table has no model for them)."""
    if not spec.rollout.trainer_engine:
        return FleetPolicy(reserved_workers=0.0)
    try:
        own = engine_model_for(spec, reserved_accelerator(spec)).full_rate()
        spot = max(engine_model_for(spec, o.accelerator).full_rate() * o.throughput for o in offers)
        return FleetPolicy(reserved_workers=own / spot if spot > 0 else 1.0)
    except (KeyError, ValueError):
        return FleetPolicy(reserved_workers=1.0)


@dataclass(frozen=True)
class FleetClock:
    """Where a job stands when the fleet is sized (either clock: the controller's or the simulator's)."""

    steps_done: int  # the step just finished included
    elapsed_s: float  # billing clock since the job started
    spent: float  # dollars so far


def billing_scale(spec: JobSpec) -> float:
    """Billing-clock seconds per second of the job's own (wall) clock: `local.time_scale` where the
    provider bills on its replayed trace, else 1."""
    return spec.local.time_scale if provider_kind(spec.provider).billing_clock == "trace" else 1.0


def machine_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def shared_cores(spec: JobSpec) -> float | None:
    """The cores a live job's processes share: this machine's, where its instances are processes here
    that run a real model (tiny-gpt, hf); None where each instance has its own machine (clouds) or the
    engines only follow the perf table (synthetic). The simulator's counterpart is `simulate.cpu_cores`,
    which calibration sets from the same count."""
    if not provider_kind(spec.provider).runs_here or spec.model.kind == "synthetic":
        return None
    return float(machine_cores())


def most_workers(spec: JobSpec, cores: float | None) -> int:
    """The most spot workers worth holding: `max_workers`, and where the job's processes share `cores`,
    no more than the cores the trainer's process leaves free. A worker beyond them generates on the
    trainer's core: the engines together generate no faster and training, the step's floor, slows (on
    this 2-core machine the default job held 1.3 workers on average for 1.13x on-demand's speed with
    `max_workers: 2`, 0.8 for 1.22x with 1; BENCHMARKS.md). Never below `min_workers`, asked outright."""
    most = spec.rollout.max_workers
    if cores is not None:
        most = min(most, max(1, math.floor(cores) - 1))
    return max(most, spec.rollout.min_workers)


def cores_note(spec: JobSpec, cores: float | None) -> str | None:
    """Says why the fleet holds fewer than max_workers at most (None when it does not)."""
    most = most_workers(spec, cores)
    if cores is None or most >= spec.rollout.max_workers:
        return None
    return (
        f"at most {spot_workers(most)} of max_workers {spec.rollout.max_workers}: the job's processes share "
        f"{cores:g} cores, one for the trainer and one for each worker (more would generate on the trainer's)"
    )


def fleet_goal(spec: JobSpec, objective: Objective, at: FleetClock, boot_s: float, max_workers: int) -> FleetGoal:
    """at.elapsed_s and boot_s (what a worker launched now costs before it generates,
    PlacementTracker.boot_estimate_s) are on the billing clock; the goal is in the job's own seconds,
    the clock its steps are measured on. max_workers: `most_workers`."""
    scale = billing_scale(spec)
    return FleetGoal(
        objective=objective,
        max_workers=max_workers,
        min_workers=spec.rollout.min_workers,
        steps_left=max(0, spec.algorithm.steps - at.steps_done),
        time_left_s=(spec.deadline_hours * 3600.0 - at.elapsed_s) / scale if spec.deadline_hours is not None else None,
        switch_s=boot_s / scale,
        budget_left=spec.budget_usd - at.spent if spec.budget_usd is not None else None,
    )


@dataclass
class FleetSizer:
    """After each step, how many spot workers to hold: the fleet policy on the best candidate's price and
    usefulness (as placement sees them) and the job's goal. The controller and the simulator size the
    fleet through this one object; each releases the surplus (`surplus`) its own way."""

    spec: JobSpec
    objective: Objective
    policy: FleetPolicy
    placement: PlacementTracker
    trainer_per_h: float
    offers: Sequence[OfferLike]
    max_workers: int  # most_workers: what the fleet starts at and never exceeds

    def decide(self, sample: StepSample, at: FleetClock, clock: float, current: int) -> FleetDecision:
        """clock: the placement's clock (the provider's billing clock) now."""
        best = self.placement.order(self.offers, clock)[0]
        return self.policy.decide(
            sample,
            fleet_goal(self.spec, self.objective, at, self.placement.boot_estimate_s(), self.max_workers),
            self.trainer_per_h,
            best.hourly_price,
            current=current,
            useful=self.placement.useful(best, clock),
        )


def fleet_sizer(
    spec: JobSpec,
    objective: Objective,
    trainer_per_h: float,
    offers: Sequence[OfferLike],
    placement: PlacementTracker,
    cores: float | None,
) -> FleetSizer:
    """cores: what the job's processes share (`shared_cores` live, `simulate.cpu_cores` replayed)."""
    policy = fleet_policy(spec, offers)
    return FleetSizer(spec, objective, policy, placement, trainer_per_h, offers, most_workers(spec, cores))
