"""metrics.jsonl (rlboost/cli/metrics_log.py): one line per step; a re-reported step is not repeated."""

from __future__ import annotations

import json

from rlboost.cli.metrics_log import MetricsLog
from rlboost.contracts.step_record import StepRecord

REC = StepRecord(
    step=0,
    version=0,
    reward=0.5,
    loss=0.1,
    responses=4,
    tokens=40,
    len_max=12,
    engines=2,
    migrated=3,
    reward_errors=0,
    step_s=2.0,
    gen_s=1.5,
    train_s=0.5,
    tail_train_s=0.3,
    publish_s=0.05,
    spot_workers=2,
    offload_s=1.0,
    trainer_idle_s=0.1,
    gen_tokens=50,
    spot_tokens=30,
    pg_loss=0.08,
    grad_norm=1.5,
    lr=3e-3,
    updates=2,
)


def rec(step: int, **changes) -> StepRecord:
    """REC as step `step` (counted from 1, as metrics.jsonl counts; the trainer's record from 0)."""
    return REC.model_copy(update={"step": step - 1, **changes})


def test_rates_by_source_and_running_totals(tmp_path):
    log = MetricsLog(tmp_path / "m.jsonl")
    log.write(rec(1), clock=60.0, dollars=1.23456, preemptions=1)
    (row,) = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    rates = (row["tokens_per_s"], row["spot_tokens_per_s"], row["reserved_tokens_per_s"])
    assert (row["step"], rates) == (1, (20.0, 15.0, 10.0))
    assert (row["len_mean"], row["len_max"], row["offload_s"], row["dollars"]) == (10.0, 12, 1.0, 1.2346)
    assert row["trainer_busy_share"] == 0.25  # train_s 0.5 of step_s 2.0


def test_a_row_carries_the_optimizer_figures_and_a_learner_without_them_writes_nulls(tmp_path):
    log = MetricsLog(tmp_path / "m.jsonl")
    log.write(rec(1), clock=60.0, dollars=0.0, preemptions=0)
    bare = {"pg_loss": None, "grad_norm": None, "lr": None, "updates": None}
    log.write(rec(2, **bare), clock=90.0, dollars=0.0, preemptions=0)  # the synthetic learner's record
    rows = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    figures = [(r["loss"], r["pg_loss"], r["grad_norm"], r["lr"], r["updates"]) for r in rows]
    assert figures == [(0.1, 0.08, 1.5, 3e-3, 2), (0.1, None, None, None, None)]


def test_a_record_written_before_the_optimizer_figures_still_reads_and_is_not_written_again(tmp_path):
    old = REC.model_dump(exclude={"pg_loss", "grad_norm", "lr", "updates"})
    older = StepRecord.model_validate(old)
    assert older.grad_norm is None
    # metrics.jsonl as an older rlboost wrote the step: no optimizer keys at all
    path = tmp_path / "m.jsonl"
    MetricsLog(path).write(older, clock=60.0, dollars=1.0, preemptions=0)
    keys = ("pg_loss", "grad_norm", "lr", "updates")
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k not in keys}) + "\n")
    # resumed by this version: the step's record from the old checkpoint, reported again, is the same step
    assert not MetricsLog(path).write(older, clock=90.0, dollars=2.0, preemptions=0)
    assert MetricsLog(path).write(rec(1), clock=90.0, dollars=2.0, preemptions=0)  # run again: new figures


def test_a_step_reported_again_unchanged_is_not_repeated_but_a_rerun_is(tmp_path):
    log = MetricsLog(tmp_path / "m.jsonl")
    log.write(rec(1), clock=60.0, dollars=1.0, preemptions=0)
    log.write(rec(1), clock=90.0, dollars=2.0, preemptions=1)  # a restarted trainer's history: same step
    log.write(rec(1, reward=0.7), clock=99.0, dollars=2.5, preemptions=1)  # run again after a restart
    rows = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [(r["step"], r["reward"]) for r in rows] == [(1, 0.5), (1, 0.7)]  # the last line of a step wins


EVAL = {"step": 2, "version": 2, "pass@1": 0.5, "mean_reward": 0.625, "problems": 8, "temperature": 0.0, "seconds": 0.4}


def test_an_evaluation_is_written_once_per_version_even_by_a_resumed_controller(tmp_path):
    path = tmp_path / "m.jsonl"
    log = MetricsLog(path)
    assert log.write_eval(EVAL) and not log.write_eval({**EVAL, "seconds": 0.9})  # re-reported (or re-run)
    assert log.write_eval({**EVAL, "step": 4, "version": 4})
    resumed = MetricsLog(path)  # a new controller process: what the file holds counts as written
    assert not resumed.write_eval(EVAL) and resumed.write_eval({**EVAL, "pass@1": 0.75})  # a changed result
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(r["version"], r["eval/pass@1"]) for r in rows] == [(2, 0.5), (4, 0.5), (2, 0.75)]
    assert rows[0] == {
        "step": 2,
        "version": 2,
        "eval/pass@1": 0.5,
        "eval/mean_reward": 0.625,
        "eval/problems": 8,
        "eval/temperature": 0.0,
        "eval/s": 0.4,
    }
    assert all("reward" not in r for r in rows)  # what tells an eval line from a step line


class _Sink:
    name = "fake"

    def __init__(self) -> None:
        self.steps: list[int] = []

    def write(self, row) -> None:
        self.steps.append(row["step"])

    def close(self) -> None:
        pass


def test_a_resumed_controller_does_not_write_a_step_the_file_already_has(tmp_path):
    path = tmp_path / "m.jsonl"
    log = MetricsLog(path)
    for step in (1, 2):
        assert log.write(rec(step, version=step - 1), clock=60.0 * step, dollars=step, preemptions=0)
    path.write_text(path.read_text() + '{"step": 3, "rew')  # a line cut short: no record
    sink = _Sink()
    resumed = MetricsLog(path, sinks=[sink])  # a new controller process; its trainer reports its history
    assert not resumed.write(rec(1, version=0), clock=900.0, dollars=9.0, preemptions=2)
    assert not resumed.write(rec(2, version=1), clock=900.0, dollars=9.0, preemptions=2)
    assert resumed.write(rec(2, version=1, reward=0.9), clock=950.0, dollars=9.5, preemptions=2)  # run again
    assert resumed.write(rec(3, version=2), clock=990.0, dollars=9.9, preemptions=2)  # never written
    assert sink.steps == [2, 3]  # the dashboards' steps do not go back to 1
    rows = [json.loads(x) for x in path.read_text().splitlines()[:2] + path.read_text().splitlines()[3:]]
    assert [(r["step"], r["dollars"]) for r in rows] == [(1, 1.0), (2, 2.0), (2, 9.5), (3, 9.9)]
