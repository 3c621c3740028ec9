"""The body of `rlboost simulate` (rlboost_cli/main.py only parses arguments and prints)."""

from __future__ import annotations

from pathlib import Path

from providers.spot_market import BUILTIN_TRACE, AvailabilityTrace, constant_trace, load_trace
from rlboost_cli.pricing import spot_offers, trainer_offer
from rlboost_cli.spec import JobSpec
from simulator.core import PRESETS, SimPolicy, SimResult, policy_from_spec, simulate_job
from trainer.policies.lengths import LengthModel

DEFAULT_POLICIES = ("on-demand", "spot-restart", "rlboost-rule", "rlboost")


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
    if catalog is not None:
        spec = spec.model_copy(update={"local": spec.local.model_copy(update={"catalog": catalog})})
    if hours is not None:
        spec = spec.model_copy(update={"simulate": spec.simulate.model_copy(update={"hours": hours})})
    if constant_workers is not None:
        if trace_path is not None:
            raise ValueError("--constant-workers and --trace both give the spot capacity: pick one")
        trace = constant_trace(constant_workers)
        # as many workers as the capacity allows, and no trace-time compression of a constant market
        ro = spec.rollout.model_copy(update={"max_workers": constant_workers})
        spec = spec.model_copy(update={"rollout": ro, "local": spec.local.model_copy(update={"capacity_scale": 1.0})})
    else:
        trace = (
            load_trace(trace_path)
            if trace_path
            else (load_trace(spec.local.trace) if spec.local.trace else BUILTIN_TRACE)
        )
    lm = LengthModel.from_recorded(lengths) if lengths else None
    results = simulate_job(
        spec,
        trace,
        pick_policies(policies, spec),
        trainer_offer(spec),
        spot_offers(spec),
        lengths=lm,
        max_steps=steps if steps is not None else (10**9 if hours is not None else None),
        horizon_s=None,
    )
    return trace, results
