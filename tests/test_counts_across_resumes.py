"""`status`, `cost-report` and metrics.jsonl count a job's tokens and migrations alike after `down` +
`launch --resume` (issue 40): the resumed trainer's own counters start again from zero, so `status`
reads the recorded steps, as the others do, once there are any."""

from __future__ import annotations

import json
import time

from rlboost.cli.state import StateStore, job_run_dir
from rlboost.cli.step_metrics import StepMetrics
from tests.conftest import run_json


def _step(step: int, tokens: int, migrated: int) -> StepMetrics:
    return StepMetrics(step=step, version=step, reward=0.5, tokens=tokens, responses=16, migrated=migrated,
                       step_s=10.0, clock=10.0 * step)


def test_status_cost_report_and_metrics_agree_after_a_resume(home):
    store = StateStore(home / "state.db")
    job = store.create_job("counts", "name: counts\n", "local")
    store.update_job(job, status="running", started_at=time.time() - 60)
    first = [_step(1, 20_000, 100), _step(2, 21_000, 111)]  # before `down`
    second = [_step(3, 33_096, 1)]  # after `launch --resume`: the new trainer's counters
    for m in first + second:
        store.record_step(job, m)
    # what the resumed trainer's last status says: its counters since it started
    store.update_job(job, status="succeeded", ended_at=time.time(), tokens_total=50_096,
                     snapshot={"phase": "done", "migrated": 1, "tokens_total": 50_096})
    run_dir = job_run_dir(store.job_by_id(job))
    store.close()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": m.step, "tokens": m.tokens, "migrated": m.migrated}) + "\n" for m in first + second)
    )

    status = run_json("status", "counts", home=home)["jobs"][0]
    report = run_json("cost-report", "counts", home=home)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    tokens, migrated = sum(r["tokens"] for r in rows), sum(r["migrated"] for r in rows)
    assert (tokens, migrated) == (74_096, 212)
    assert (status["tokens_total"], status["migrated"]) == (tokens, migrated)
    assert (report["tokens"], report["migrations"]) == (tokens, migrated), report
