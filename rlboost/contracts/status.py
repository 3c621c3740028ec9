"""The trainer's status document (`GET /v1/status`): what the trainer serves and what the controller,
`rlboost status` and the Prometheus exporter read. The trainer builds it through this model and the
controller validates what it fetches, so a field renamed on one side fails at once, by name."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from rlboost.contracts.step_record import StepRecord


class WorkerStatus(BaseModel):
    """One engine the coordinator knows (connected, or gone lately)."""

    model_config = ConfigDict(extra="forbid")

    worker_id: str
    kind: str  # reserved | spot | on-demand
    engine: str
    state: str  # pulling | ready | draining | gone
    version: int | None  # the weights it holds (None: none yet, as it connects)
    tokens_per_s: float
    tokens: int
    active: int  # responses it holds
    partial: int  # of those, with tokens already: what a kill now would migrate


class TrainerStatus(BaseModel):
    model_config = ConfigDict(extra="forbid")

    phase: str  # starting | warm-start | rollout | train | done | failed (the trainer ended the job: see error)
    error: str | None = None  # why, for phase failed (a custom reward over task.reward_error_budget)
    step: int  # the next step to run (counted from 0)
    steps: int
    version: int  # the latest published weights (-1: none yet)
    reward: float | None
    reward_errors: dict[str, int]  # a custom reward's failures so far, by kind (each scored 0.0)
    tokens_total: int
    responses_total: int
    migrated: int
    redispatched: int
    rejected_frames: int
    offloads: int
    tail_migrations: int
    workers: list[WorkerStatus]
    weights: dict[str, Any]  # the weight publisher's and the broadcaster's counters
    history: list[StepRecord]  # one record per finished step (step_record.py), from history_from on
    history_from: int = 0  # the index of history[0] in the job's records (GET /v1/status?since=N)
    evals: list[dict[str, Any]]  # the evaluations so far, from evals_from on
    evals_from: int = 0  # the index of evals[0] (GET /v1/status?evals_since=N)
    eval: dict[str, Any] | None  # the last one
