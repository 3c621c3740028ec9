"""The optimizer and DAPO knobs through a real local job (CLI, controller, trainer process), not only
the learner's unit tests (tests/test_optimizer_knobs.py, tests/test_dapo.py): a job file with a cosine
schedule after a warm-up, grad_clip, betas, weight_decay, overlong_buffer and dynamic_sampling runs to
its end, and its metrics.jsonl has each step's scheduled rate, its update and gradient norm, the
DAPO figures (groups dropped, the overlong penalty) and rollout correction's importance weights (against
the engine's behaviour log-probs, which rode from the rollout book to the learner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from rlboost.trainer.lr_schedule import LrSchedule, lr_at
from tests.conftest import run_cli, run_json

pytestmark = pytest.mark.integration

STEPS, PROMPTS, LR = 5, 16, 3e-3


def test_a_job_with_every_optimizer_and_dapo_knob_records_them_per_step(tmp_path):
    job = {
        "name": "knobs",
        "algorithm": {
            "prompts_per_step": PROMPTS,
            "group_size": 4,
            "max_new_tokens": 8,
            "steps": STEPS,
            "seed": 5,
            "learning_rate": LR,
            "warm_start_steps": 60,  # some correct responses: groups both with and without reward variance
            "lr_schedule": "cosine",
            "lr_warmup_steps": 2,
            "grad_clip": 0.5,
            "betas": [0.8, 0.95],
            "weight_decay": 0.01,
            "overlong_buffer": {"length": 4, "penalty": 0.5},
            "dynamic_sampling": True,
            "rollout_correction": {"level": "token", "threshold": 2.0},
        },
        "task": {"name": "reverse", "min_len": 3, "max_len": 4},
        "rollout": {"max_workers": 0},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    home = tmp_path / "home"
    proc = run_cli("launch", str(path), home=home, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [j] = run_json("status", "knobs", home=home)["jobs"]
    assert j["status"] == "succeeded" and j["step"] == STEPS
    rows = [json.loads(line) for line in Path(j["metrics_file"]).read_text().splitlines()]
    steps = [r for r in rows if "reward" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    # the rate of each step is lr_schedule's: a warm-up to LR over 2 steps, then the cosine decay
    schedule = LrSchedule(LR, "cosine", 2, STEPS)
    assert [r["lr"] for r in steps] == pytest.approx([lr_at(k, schedule) for k in range(STEPS)], rel=1e-12)
    # cosine, not linear (which would give 2/3 and 1/3 of LR at steps 4 and 5)
    assert [r["lr"] for r in steps] == pytest.approx([LR / 2, LR, LR, 0.75 * LR, 0.25 * LR])
    assert [r["updates"] for r in steps] == [1] * STEPS and all(r["grad_norm"] > 0 for r in steps)
    assert any(r["grad_norm"] > 0.5 for r in steps)  # grad_norm is before clipping: grad_clip 0.5 was reached
    # dynamic sampling's count of dropped groups, and the overlong penalty, in every step's row
    dropped = [r["groups_dropped"] for r in steps]
    assert all(isinstance(d, int) and 0 <= d < PROMPTS for d in dropped), dropped
    assert sum(dropped) > 0, dropped  # groups whose rewards were all equal were dropped
    assert [r["update_skipped"] for r in steps] == [False] * STEPS
    assert all(r["overlong_penalty_mean"] <= 0 for r in steps)
    assert any(r["overlong_penalty_mean"] < 0 for r in steps)  # responses reached the buffer
    # the importance weights of the engine's tokens: the same tiny model in float32 on both sides, so 1
    # up to float noise (the engine's batches and float64 sampling math differ from the trainer's); a
    # log-prob off by a token or a temperature would put them far from it
    for r in steps:
        assert abs(r["is_weight_mean"] - 1.0) < 1e-3 and 1.0 <= r["is_weight_max"] < 1.01, r
        assert r["is_clipped_share"] == 0.0, r
    # betas and weight_decay show in no metric: the trainer's last checkpoint has its AdamW's settings
    [ckpt] = (home / "jobs" / f"knobs-{j['id']}" / "checkpoints").glob(f"ckpt-{STEPS:08d}.pt")
    [group] = torch.load(ckpt, weights_only=False)["payload"]["learner"]["optimizer"]["param_groups"]
    assert (tuple(group["betas"]), group["weight_decay"], group["lr"]) == ((0.8, 0.95), 0.01, steps[-1]["lr"])
