"""From a job spec to the scheduling policies and models, one way for the live runtime and the simulator.

Both build their coordinator options, offload policy, length model and engine/trainer performance
models here, so a live run and `rlboost simulate` of the same job file make the same decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from contracts.lengths import LengthModel
from contracts.mounts import mounted_name
from contracts.perf import AcceleratorPerf, EngineModel, engine_model, split_accelerator, train_rate
from contracts.protocol import MOUNTED_PATH_KEY
from contracts.spec import JobSpec
from rollout.policies.fleet import FleetDecision, FleetGoal, FleetPolicy, Objective, StepSample
from rollout.policies.migration import MigrationConfig
from rollout.policies.offload import OffloadPolicy, make_offload
from rollout.policies.placement import OfferLike, PlacementTracker
from rollout.policies.tick import TickCadence

if TYPE_CHECKING:
    from rollout.coordinator import CoordinatorConfig


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
    (trainer/streaming.py, Learner.add_groups), so the model kind never changes a step's speed."""
    return True


def length_model(spec: JobSpec) -> LengthModel:
    lens = spec.rollout.synthetic.lengths
    if lens.recorded is not None:
        return LengthModel.from_recorded(lens.recorded)
    median = lens.median_tokens if lens.median_tokens is not None else max(1.0, spec.algorithm.max_new_tokens / 8)
    return LengthModel(median=median, sigma=lens.sigma, prompt_sigma=lens.prompt_sigma)


def engine_model_for(spec: JobSpec, accelerator: str | None, speed: float = 1.0) -> EngineModel:
    return engine_model(accelerator, perf_table(spec), spec.rollout.engine_batch, speed=speed)


def offload_policy(spec: JobSpec) -> OffloadPolicy:
    return make_offload(
        spec.rollout.offload_policy,
        train_tokens_per_s=trainer_tokens_per_s(spec),
        overlap=trains_while_generating(spec),
        min_box_s=spec.rollout.offload_min_box_s,
    )


def migration_config(spec: JobSpec) -> MigrationConfig | None:
    if not spec.rollout.migration:
        return None
    return MigrationConfig(min_gain_s=spec.rollout.migration_min_gain_s)


def tick_cadence(spec: JobSpec) -> TickCadence:
    """When this job's coordinator reconsiders a step (the simulator replays the same ticks)."""
    return TickCadence()


def coordinator_config(spec: JobSpec, eos_id: int) -> CoordinatorConfig:
    """This job's CoordinatorConfig (rollout/coordinator.py); weights_url is set once the server is up."""
    from rollout.coordinator import CoordinatorConfig  # aiohttp and the rest: only where a coordinator runs

    return CoordinatorConfig(
        job_seed=spec.algorithm.seed,
        temperature=spec.algorithm.temperature,
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
    return PlacementTracker(prior_rate=priors)


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


def fleet_goal(spec: JobSpec, objective: Objective, at: FleetClock, boot_s: float) -> FleetGoal:
    """boot_s: what a worker launched now costs before it generates (PlacementTracker.boot_estimate_s)."""
    bounded = spec.deadline_hours is not None or spec.budget_usd is not None
    return FleetGoal(
        objective=objective,
        max_workers=spec.rollout.max_workers,
        min_workers=spec.rollout.min_workers,
        steps_left=max(0, spec.algorithm.steps - at.steps_done) if bounded else None,
        time_left_s=spec.deadline_hours * 3600.0 - at.elapsed_s if spec.deadline_hours is not None else None,
        switch_s=boot_s,
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

    def decide(self, sample: StepSample, at: FleetClock, clock: float, current: int) -> FleetDecision:
        """clock: the placement's clock (the provider's billing clock) now."""
        best = self.placement.order(self.offers, clock)[0]
        return self.policy.decide(
            sample,
            fleet_goal(self.spec, self.objective, at, self.placement.boot_estimate_s()),
            self.trainer_per_h,
            best.hourly_price,
            current=current,
            useful=self.placement.useful(best, clock),
        )


def fleet_sizer(
    spec: JobSpec, objective: Objective, trainer_per_h: float, offers: Sequence[OfferLike], placement: PlacementTracker
) -> FleetSizer:
    return FleetSizer(spec, objective, fleet_policy(spec, offers), placement, trainer_per_h, offers)
