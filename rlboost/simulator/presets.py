"""The replay's policies: what `rlboost simulate --policy NAME` runs, and the job file's own settings."""

from __future__ import annotations

from dataclasses import dataclass

from rlboost.contracts.spec import JobSpec


@dataclass(frozen=True)
class SimPolicy:
    name: str
    offload: str = "predictive"  # none | rlboost | predictive
    dispatch: str = "rate"  # rate | spread
    migration: bool = True  # tail migration
    restart: bool = False  # responses of a lost worker restart from scratch (no token-level resume)
    tail_batching: bool = False
    spot: bool = True  # False: the reserved cluster alone
    # responses are split between the engines up front, in proportion to their rates (a baseline
    # without token-level dispatch: each engine keeps its share of the step)
    split: bool = False
    # a synchronous colocated step (veRL/TRL): generate, then old-logprob (+ ref) forward passes, then
    # train, then sync weights into the engine and rebuild its KV cache (perf.SYNC_COSTS)
    sync: bool = False
    # how many of max_workers to hold: None = all of them (a fixed fleet), "job" = the job file's
    # rollout.objective, or "cost" / "throughput" (rlboost/rollout/policies/fleet.py, as the controller)
    objective: str | None = None
    # decode with the job file's rollout.speculative (False: never, as veRL's default for `sync`)
    speculate: bool = True
    label: str = ""


PRESETS: dict[str, SimPolicy] = {
    p.name: p
    for p in (
        SimPolicy("on-demand", "none", "spread", False, spot=False, label="rlboost's trainer alone"),
        SimPolicy(
            "sync",
            "none",
            "spread",
            False,
            spot=False,
            sync=True,
            speculate=False,
            label="synchronous colocated step (veRL/TRL): generate, logprobs, train, sync weights",
        ),
        SimPolicy(
            "spot-restart",
            "none",
            "rate",
            False,
            restart=True,
            split=True,
            label="spot workers take their share of each step; lost responses restart",
        ),
        SimPolicy("rlboost-rule", "rlboost", "spread", True, label="RLBoost's published offload rule"),
        SimPolicy(
            "rlboost",
            "predictive",
            "rate",
            True,
            objective="job",
            label="predictive offload, rate dispatch, migration, fleet sized by the job's objective",
        ),
        SimPolicy("rlboost-fixed", "predictive", "rate", True, label="rlboost holding max_workers always"),
        SimPolicy("rlboost-cost", "predictive", "rate", True, objective="cost", label="rlboost, objective cost"),
        SimPolicy(
            "rlboost-throughput",
            "predictive",
            "rate",
            True,
            objective="throughput",
            label="rlboost, objective throughput",
        ),
        SimPolicy("rlboost-tail", "predictive", "rate", True, tail_batching=True, label="... + tail batching"),
    )
}


def policy_from_spec(spec: JobSpec) -> SimPolicy:
    ro = spec.rollout
    return SimPolicy(
        "job",
        ro.offload_policy,
        ro.dispatch_policy,
        ro.migration,
        tail_batching=ro.tail_batching,
        spot=ro.max_workers > 0,
        objective="job",
        label="the job file's own settings",
    )
