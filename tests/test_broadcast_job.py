"""`weights.transport: torch` in a local job, through the real CLI and processes: the trainer
broadcasts each new version over gloo to the spot workers, which load it and generate with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli, run_json

pytestmark = pytest.mark.integration

STEPS = 3


def write_job(tmp: Path, transport: str) -> Path:
    (tmp / "trace.json").write_text(json.dumps({"metadata": {"gap_seconds": 1}, "data": [3] * 900}))
    job = {
        "name": "bcast",
        "algorithm": {"prompts_per_step": 16, "group_size": 4, "max_new_tokens": 8, "steps": STEPS,
                      "seed": 5, "warm_start_steps": 10},
        "task": {"name": "reverse", "min_len": 3, "max_len": 5},
        "trainer": {"hourly_price": 10.0},
        "rollout": {
            "max_workers": 2,
            "min_workers": 2,
            "engine_batch": 16,
            "offload_policy": "none",
            "candidates": [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.5, "on_demand_price": 3.5}],
        },
        "weights": {"transport": transport},
        "local": {"trace": "trace.json", "time_scale": 1.0},
    }  # fmt: skip
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_spot_workers_get_every_new_version_by_broadcast(tmp_path, monkeypatch):
    # every step starts once both spot workers hold its weights, so each new version has 2 members
    monkeypatch.setenv("RLBOOST_WAIT_ENGINES", "2")  # inherited by the local trainer process
    home = tmp_path / "home"
    proc = run_cli("launch", str(write_job(tmp_path, "torch")), home=home, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [j] = run_json("status", "bcast", home=home)["jobs"]
    assert j["status"] == "succeeded" and j["step"] == STEPS
    rows = [json.loads(line) for line in Path(j["metrics_file"]).read_text().splitlines()]
    done = [r["broadcast"] for r in rows if r["broadcast"] is not None]
    # versions 1 and 2 were broadcast (and finished) before steps 2 and 3 were recorded
    assert {b["version"] for b in done} >= {1, 2}, rows
    for b in done:
        assert b["delivered"] == 2 and b["missed"] == 0, b
