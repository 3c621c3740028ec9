"""A training step as the state store keeps it (its `steps` table): the figures of the trainer's
StepRecord (rlboost/contracts/step_record.py) by the same names, taken in one place (`StepMetrics.of`).
Three columns keep the names an earlier schema gave them; `step_columns` / `step_fields` map them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from rlboost.cli.step_numbers import shown
from rlboost.contracts.step_record import StepRecord


@dataclass(frozen=True)
class StepMetrics:
    """What the controller records of one finished training step (counted from 1)."""

    step: int
    version: int
    reward: float
    tokens: int
    responses: int
    migrated: int
    step_s: float  # the step's wall time on the trainer
    clock: float  # the provider's (billing) clock at recording
    train_s: float | None = None  # of which the trainer trained (None: recorded before schema 8)
    offload_s: float | None = None  # seconds into the step at the offload (None: no offload)
    tail_train_s: float | None = None  # trained while the tail generated remotely
    trainer_idle_s: float | None = None  # trainer idle after the offload, waiting for rollouts
    spot_workers: int | None = None  # spot workers serving when the step started
    gen_tokens: int | None = None  # tokens generated during the step, by every engine
    spot_tokens: int | None = None  # of which spot workers generated
    # speculative decoding (None when off): drafted tokens verified, of which accepted, and the mean
    # tokens a response gained per forward pass that verified a draft for it
    spec_drafted: int | None = None
    spec_accepted: int | None = None
    spec_tokens_per_pass: float | None = None
    # the optimizer's side (None: model.kind synthetic, or recorded before): the whole loss, its
    # policy-gradient term, the gradient's norm before clipping, the last update's rate, the updates
    loss: float | None = None
    pg_loss: float | None = None
    grad_norm: float | None = None
    lr: float | None = None
    updates: int | None = None

    @property
    def staleness(self) -> int:
        """Versions between the weights that generated the step and those it trained (0: on-policy;
        up to algorithm.max_staleness)."""
        return self.step - 1 - self.version

    @classmethod
    def of(cls, rec: StepRecord, clock: float) -> StepMetrics:
        """The trainer's record of a step, taken at `clock`."""
        kept = {f.name for f in fields(cls)} - {"step", "clock"}
        # the trainer counts from 0; the store, like every message, from 1
        return cls(step=shown(rec.step), clock=clock, **rec.model_dump(include=kept))


@dataclass(frozen=True)
class StepRow(StepMetrics):
    """A recorded step: its metrics, the job, and when it was recorded (wall clock)."""

    job_id: int = field(kw_only=True)
    wall: float = field(kw_only=True)


# the steps table's columns that an earlier schema named otherwise (field -> column)
_COLUMNS = {"step_s": "seconds", "trainer_idle_s": "idle_s", "spot_workers": "n_remote"}
_FIELDS = {c: f for f, c in _COLUMNS.items()}


def step_columns(m: StepMetrics) -> dict[str, Any]:
    """A step's values by the steps table's column names."""
    return {_COLUMNS.get(f, f): v for f, v in asdict(m).items()}


def step_fields(row: dict[str, Any]) -> dict[str, Any]:
    """A steps table row's values by StepRow's field names."""
    return {_FIELDS.get(c, c): v for c, v in row.items()}


def busy_share(train_s: float | None, step_s: float | None) -> float | None:
    """The trainer's share of a step's (or steps') wall seconds spent training (None: not measured)."""
    return round(train_s / step_s, 4) if train_s is not None and step_s else None


def steps_busy_share(steps: list[StepRow]) -> float | None:
    """The trainer's busy share over the recorded steps that carry their training seconds."""
    timed = [s for s in steps if s.train_s is not None]
    return busy_share(sum(s.train_s or 0.0 for s in timed), sum(s.step_s for s in timed)) if timed else None


def stale_line(stale: int, steps: int, most: int, which: str = "") -> str:
    """`status` and `cost-report`'s line on algorithm.max_staleness: how many steps ran on older weights."""
    return (
        f"off-policy: {stale}{which} of {steps} step(s) trained responses from weights up to {most} version(s) "
        "older (algorithm.max_staleness)"
    )
