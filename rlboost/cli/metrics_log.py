"""`metrics.jsonl`: one JSON object per training step in the job's run directory, for scripts,
notebooks and dashboards (`rlboost status JOB --json` gives its path as `metrics_file`).

Written by the controller as it records each step. A step the trainer runs again after a restart
from its checkpoint is written again (the last line of a step wins); a step re-reported unchanged
(a restarted trainer reports its whole history, so does a trainer a resumed controller reattaches
to) is not, by this controller or by a resumed one (what the file holds counts as written).

With `task.eval_every`, each evaluation adds its own line: `{"step": N, "version": N, "eval/pass@1",
"eval/mean_reward", "eval/problems", "eval/temperature", "eval/s"}` (N = steps trained into the
weights evaluated; 0 = before training). An eval line has no `reward` key, which tells the two apart.

Each line written also goes to the job's optional sinks (TensorBoard, W&B: rlboost/cli/metrics_sinks.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlboost.cli.metrics_sinks import JsonlSink, MetricsSink, SinkError
from rlboost.cli.step_metrics import busy_share
from rlboost.cli.step_numbers import shown
from rlboost.contracts.step_record import ROLLOUT_CORRECTION_COLUMNS, StepRecord

METRICS_FILE = "metrics.jsonl"


def _rate(tokens: float | None, seconds: float) -> float | None:
    return round(tokens / seconds, 1) if tokens is not None and seconds > 0 else None


def _ignore(name: str, err: Exception) -> None:
    pass


@dataclass
class MetricsLog:
    path: Path
    # the job's optional sinks; one that fails is reported to on_error and dropped (metrics.jsonl stays)
    sinks: list[MetricsSink] = field(default_factory=list)
    on_error: SinkError = _ignore
    _written: dict[int, str] = field(default_factory=dict)
    _evals_written: dict[int, str] = field(default_factory=dict)
    _loaded: bool = False

    def __post_init__(self) -> None:
        self._jsonl = JsonlSink(self.path)

    def _load(self) -> None:
        """Once: what the file already holds (a resumed controller's, a restarted one's) counts as
        written; for a step or an evaluation written more than once, its last line."""
        if self._loaded:
            return
        self._loaded = True
        if not self.path.exists():
            return
        for line in self.path.read_text().splitlines():
            try:
                prev = json.loads(line)
            except ValueError:  # a line cut short (a full disk, a crash mid-write): not a record
                continue
            if not isinstance(prev, dict):
                continue
            if "eval/pass@1" in prev:
                self._evals_written[prev["version"]] = _eval_key(prev)
            elif "reward" in prev and "step" in prev:
                self._written[prev["step"]] = _without_totals(prev)

    def _emit(self, row: dict[str, Any]) -> None:
        self._jsonl.write(row)
        for sink in list(self.sinks):
            try:
                sink.write(row)
            except Exception as e:  # a dashboard's failure must not stop the job's own record
                self.sinks.remove(sink)
                self.on_error(sink.name, e)

    def close(self) -> None:
        """Flush and close the sinks (W&B: finish the run) at the job's end."""
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as e:
                self.on_error(sink.name, e)
        self.sinks.clear()

    def write_eval(self, ev: dict[str, Any]) -> bool:
        """One evaluation (rlboost/trainer/evaluation.py); False if this version's was already written as is."""
        row = {
            "step": ev["step"],
            "version": ev["version"],
            "eval/pass@1": ev["pass@1"],
            "eval/mean_reward": ev["mean_reward"],
            "eval/problems": ev["problems"],
            "eval/temperature": ev["temperature"],
            "eval/s": ev["seconds"],
        }
        key = _eval_key(row)
        self._load()
        if self._evals_written.get(ev["version"]) == key:
            return False
        self._evals_written[ev["version"]] = key
        self._emit(row)
        return True

    def write(self, rec: StepRecord, *, clock: float, dollars: float, preemptions: int) -> bool:
        """One step from the trainer's record and the controller's ledger; False if this step was
        already written with the same figures (only the running totals differ)."""
        gen, spot = rec.gen_tokens, rec.spot_tokens
        row = {
            "step": shown(rec.step),  # from 1, as every message counts
            "version": rec.version,
            # versions between the weights that generated the step and those it trained (0: on-policy;
            # up to algorithm.max_staleness)
            "staleness": rec.step - rec.version,
            "reward": rec.reward,
            "loss": rec.loss,
            "kl": rec.kl,  # token mean of the KL estimate (algorithm.kl_coef > 0), else null
            "entropy": rec.entropy,  # token mean (algorithm.entropy_coeff > 0), else null
            "clip_frac": rec.clip_frac,  # share of tokens whose PPO ratio was clipped
            "pg_loss": rec.pg_loss,  # the policy-gradient term of loss (null: no optimizer, the synthetic model)
            "grad_norm": rec.grad_norm,  # before clipping; the mean over the step's updates
            "lr": rec.lr,  # the learning rate of the step's last update
            "updates": rec.updates,  # optimizer updates in the step
            "responses": rec.responses,
            "tokens": rec.tokens,
            "len_mean": round(rec.tokens / rec.responses, 2) if rec.responses else None,
            "len_max": rec.len_max,
            "step_s": rec.step_s,
            "gen_s": rec.gen_s,
            "train_s": rec.train_s,
            # the trainer's share of the step spent training (1.0: it never waited for rollouts)
            "trainer_busy_share": busy_share(rec.train_s, rec.step_s),
            "tokens_per_s": _rate(rec.tokens, rec.step_s),
            "spot_tokens_per_s": _rate(spot, rec.step_s),
            "reserved_tokens_per_s": _rate(gen - spot, rec.step_s) if gen is not None and spot is not None else None,
            "spot_workers": rec.spot_workers,
            "offload_s": rec.offload_s,  # seconds into the step when the reserved engine handed over
            "tail_train_s": rec.tail_train_s,
            "trainer_idle_s": rec.trainer_idle_s,
            "publish_s": rec.publish_s,  # weight sync, on the trainer: stage + publish the version
            # weights.transport: the last finished broadcast ({version, delivered, missed}), else null
            "broadcast": rec.broadcast,
            "migrated": rec.migrated,
            # rollout.speculative (null when off): drafted tokens verified, accepted, tokens per verifying pass
            "spec_drafted": rec.spec_drafted,
            "spec_accepted": rec.spec_accepted,
            "spec_tokens_per_pass": rec.spec_tokens_per_pass,
            "reward_errors": rec.reward_errors,  # a custom reward's failures so far (each scored 0)
            "preemptions": preemptions,  # so far in the job
            "dollars": round(dollars, 4),  # so far in the job
            "clock_s": round(clock, 3),  # the provider's billing clock
        }
        # DAPO's knobs (algorithm.overlong_buffer, dynamic_sampling) and algorithm.rollout_correction:
        # only when on, so a row without them is as before
        row.update({k: v for k in _DAPO_COLUMNS if (v := getattr(rec, k)) is not None})
        key = _without_totals(row)
        self._load()
        if self._written.get(row["step"]) == key:
            return False
        self._written[row["step"]] = key
        self._emit(row)
        return True


_DAPO_COLUMNS = ("overlong_penalty_mean", "groups_dropped", "update_skipped", *ROLLOUT_CORRECTION_COLUMNS)


def _eval_key(row: dict[str, Any]) -> str:
    """An evaluation's own figures: one run again (after a trainer restart) differs in its time only."""
    return json.dumps({k: v for k, v in row.items() if k != "eval/s"})


def _without_totals(row: dict[str, Any]) -> str:
    """A step's own figures: a re-report of the same step differs only in the job's running totals. Nulls
    are left out: a line an older rlboost wrote lacks the keys added since (pg_loss, grad_norm, ...),
    which the same step's record from that version's checkpoint, reported again, has as null."""
    totals = ("preemptions", "dollars", "clock_s")
    return json.dumps({k: v for k, v in row.items() if k not in totals and v is not None})
