"""The adaptive offload fires live with tiny-gpt: the reserved engine hands its unfinished responses to
the spot workers, and the trainer trains finished groups (the streamed update) while they generate
the tail. Real local processes; the per-step record shows when it happened and how the trainer spent
the tail, in `rlboost status JOB`.

Forced, not timed: RLBOOST_WAIT_ENGINES holds each step until both spot workers and the reserved
engine hold its weights, and the job's perf override makes the offload policy's prior for the
trainer's training rate tiny (1 token/s), so on the first step the policy predicts the trainer would
take far longer to train than the remotes to generate and switches at its first check, with every
response still unfinished. Engines hold 8 sequences each and a step has 64 responses, so generation
takes several rounds: the first groups are complete while later ones have not even started, and the
trainer trains them during the tail whatever the machine's load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli, run_json

pytestmark = pytest.mark.integration


def write_offload_job(tmp: Path, name: str, steps: int = 2, max_new_tokens: int = 24) -> Path:
    (tmp / "trace.json").write_text(json.dumps({"metadata": {"gap_seconds": 1}, "data": [2] * 3600}))
    job = {
        "name": name,
        "algorithm": {"prompts_per_step": 16, "group_size": 4, "max_new_tokens": max_new_tokens, "steps": steps,
                      "seed": 5, "warm_start_steps": 10},
        "task": {"name": "reverse", "min_len": 3, "max_len": 6},
        "trainer": {"hourly_price": 10.0},
        "perf": {"cpu": {"train_tokens_per_s": 1.0}},  # the policy's prior for the trainer: see above
        "rollout": {
            "max_workers": 2,
            "min_workers": 2,  # both, whatever this machine's cores (RLBOOST_WAIT_ENGINES waits for them)
            "engine_batch": 8,
            "heartbeat_timeout_s": 5,
            "offload_policy": "predictive",
            "candidates": [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.5, "on_demand_price": 3.5}],
        },
        "local": {"trace": "trace.json", "time_scale": 1.0, "notice_seconds": 0.5, "notice_fraction": 0.5},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_offload_fires_and_the_trainer_trains_during_the_tail(tmp_path, monkeypatch):
    monkeypatch.setenv("RLBOOST_WAIT_ENGINES", "2")  # inherited by the local trainer process
    home = tmp_path / "home"
    proc = run_cli("launch", str(write_offload_job(tmp_path, "offl")), home=home, timeout=540)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [job] = run_json("status", "offl", home=home)["jobs"]
    assert job["status"] == "succeeded" and job["step"] == 2
    steps = job["recent_steps"]
    assert len(steps) == 2
    first = steps[0]
    # offloaded at its first check (seconds into the step), and trained finished groups afterwards
    assert first["offload_s"] is not None and first["offload_s"] >= 0
    assert first["tail_train_s"] > 0
    assert first["idle_s"] is not None and first["idle_s"] >= 0
    for s in steps:  # every step reports the three numbers (no offload: offload_s is None)
        assert s["tail_train_s"] is not None and s["idle_s"] is not None
    out = run_cli("status", "offl", home=home, check=True).stdout
    assert "offload" in out and "tail train" in out and "idle" in out
    # the trainer's busy share: per step in metrics.jsonl (train_s / step_s, both rounded to ms), and the
    # job's so far in status (the steps' sums)
    rows = [json.loads(line) for line in Path(job["metrics_file"]).read_text().splitlines()]
    for row in rows:
        assert row["trainer_busy_share"] == pytest.approx(row["train_s"] / row["step_s"], abs=1e-4)
        assert 0 < row["trainer_busy_share"] <= 1
    assert [s["train_s"] for s in steps] == [row["train_s"] for row in rows]
    share = sum(row["train_s"] for row in rows) / sum(row["step_s"] for row in rows)
    assert job["trainer_busy_share"] == pytest.approx(share, abs=1e-4)
    assert "trainer busy:" in out
