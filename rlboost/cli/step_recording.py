"""The controller's record of the trainer's steps: each StepRecord the trainer reports (rlboost/contracts/
step_record.py) goes to the state store, metrics.jsonl (and its sinks) and the progress line once, and
each evaluation to metrics.jsonl once.

A step the trainer reports again unchanged (a restarted trainer's or a resumed controller's first
status carries the whole history) is not recorded, written or logged again; one it ran again after a
restart from its checkpoint is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

from rlboost.cli.metrics_log import MetricsLog
from rlboost.cli.progress import JobProgress
from rlboost.cli.state import StateStore
from rlboost.cli.step_metrics import StepMetrics
from rlboost.contracts.status import TrainerStatus
from rlboost.contracts.step_record import StepRecord


class StepRecorder:
    def __init__(self, store: StateStore, job_id: int, metrics_log: MetricsLog) -> None:
        self.store, self.job_id, self.metrics_log = store, job_id, metrics_log
        self.steps_taken = 0  # how many of the trainer's step records this controller has taken
        self.evals_taken = 0  # and its evaluations
        # the figures of every step the store holds (a resumed job's too)
        self.recorded = {m.step: _own_figures(m) for m in store.steps(job_id)}

    def query(self) -> dict[str, int]:
        """GET /v1/status's parameters: only what is not taken yet (a long job's whole history is MiBs)."""
        return {"since": self.steps_taken, "evals_since": self.evals_taken}

    def new_trainer(self) -> None:
        """A relaunched trainer reports its whole history: the steps it runs again are recorded again,
        the ones from its checkpoint are known already."""
        self.steps_taken = self.evals_taken = 0

    def take(
        self,
        status: TrainerStatus,
        clock: float,
        progress: JobProgress,
        totals: Callable[[], tuple[float, int]],
        on_step: Callable[[StepRecord], None],
    ) -> None:
        """The records in `status` not taken yet. totals(): the job's dollars and preemptions so far,
        for metrics.jsonl; on_step: after each step newly recorded (the fleet is sized by it)."""
        first = status.history_from  # history[0]'s index in the trainer's records
        for rec in status.history[max(0, self.steps_taken - first) :]:
            metrics = StepMetrics.of(rec, clock)
            figures = _own_figures(metrics)
            if self.recorded.get(metrics.step) == figures:  # recorded already, by this controller or one before
                progress.caught_up(rec)
                continue
            # metrics.jsonl first: a controller killed between the two takes the step again on resume,
            # and metrics.jsonl (which knows its own lines) does not repeat it
            dollars, preemptions = totals()
            self.metrics_log.write(rec, clock=clock, dollars=dollars, preemptions=preemptions)
            self.store.record_step(self.job_id, metrics)
            self.recorded[metrics.step] = figures
            progress.step(rec)
            on_step(rec)
        self.steps_taken = max(self.steps_taken, first + len(status.history))
        self.evals_taken = max(self.evals_taken, status.evals_from + len(status.evals))
        for ev in status.evals:  # the evaluations not seen yet; metrics.jsonl keeps each version once
            if self.metrics_log.write_eval(ev):
                progress.note(
                    f"eval after step {ev['step']}: pass@1 {ev['pass@1']:.3f}, mean reward {ev['mean_reward']:.3f}"
                )


def _own_figures(m: StepMetrics) -> tuple:
    """A step's own figures: the same record reported again differs only in the clock it is taken at."""
    return tuple(getattr(m, f.name) for f in fields(StepMetrics) if f.name != "clock")
