"""Speculative decoding end to end (the issue's "Done when"): the same local job with
rollout.speculative on and off (same seed, offload `none`, --record-rollouts, float64 engines) records
identical responses; with it on, rollouts.jsonl has per response the drafted and accepted counts,
metrics.jsonl and `rlboost status` per step spec_drafted / spec_accepted / spec_tokens_per_pass."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlboost.cli.state import StateStore
from tests.conftest import run_cli, run_json
from tests.test_local_job import load_rollouts, trainer_dir

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # whole jobs: .ci/run's slow tier

STEPS = 2


def write_job(tmp: Path, name: str, method: str) -> Path:
    job = {
        "name": name,
        "algorithm": {"prompts_per_step": 12, "group_size": 4, "max_new_tokens": 24, "steps": STEPS,
                      "seed": 11, "warm_start_steps": 30},
        "task": {"name": "reverse", "min_len": 3, "max_len": 6},
        "rollout": {
            "max_workers": 0,  # the trainer's own engine: the same engine path as a spot worker's
            "engine_dtype": "float64",
            # an engine sized for more than a step's 48 responses: its (static) batches leave room to draft
            # in the same forward pass (contracts/speculation.py's cost: one pass per 128 tokens)
            "engine_batch": 128,
            "offload_policy": "none",
            "speculative": {"method": method, "max_tokens": 4},
        },
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def launch(tmp: Path, name: str, method: str) -> tuple[list[dict], list[dict], dict]:
    home = tmp / name
    proc = run_cli("launch", str(write_job(tmp, name, method)), "--record-rollouts", home=home, timeout=540)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [status] = run_json("status", name, home=home)["jobs"]
    job = StateStore(home / "state.db").get_job(name)
    metrics = [json.loads(line) for line in Path(status["metrics_file"]).read_text().splitlines()]
    return load_rollouts(trainer_dir(home, name, job.id)), metrics, status


def test_same_responses_with_and_without_speculation(tmp_path):
    plain, plain_metrics, _ = launch(tmp_path, "spec-off", "none")
    spec, spec_metrics, spec_status = launch(tmp_path, "spec-on", "group")
    assert len(plain) == STEPS * 12 * 4
    by_rid = {r["rid"]: r for r in plain}
    assert {r["rid"] for r in spec} == set(by_rid)
    for r in spec:
        p = by_rid[r["rid"]]
        assert r["tokens"] == p["tokens"] and r["finish"] == p["finish"]
        np.testing.assert_allclose(r["logprobs"], p["logprobs"], rtol=0, atol=1e-9)
    # what it drafted is recorded per response, and per step in metrics.jsonl and status
    assert all(0 <= r["accepted"] <= r["drafted"] for r in spec) and sum(r["drafted"] for r in spec) > 0
    assert all(r["drafted"] == 0 for r in plain)
    for step, m in enumerate(spec_metrics):
        rows = [r for r in spec if r["step"] == step]
        assert m["spec_drafted"] == sum(r["drafted"] for r in rows)
        assert m["spec_accepted"] == sum(r["accepted"] for r in rows)
        # the engine drafts only where its measured passes say it pays: a step may verify no draft at all
        if m["spec_drafted"]:
            assert m["spec_tokens_per_pass"] >= 1
        else:
            assert m["spec_tokens_per_pass"] is None
    assert all(m["spec_drafted"] is None for m in plain_metrics)
    assert [s["spec_drafted"] for s in spec_status["recent_steps"]] == [m["spec_drafted"] for m in spec_metrics]
    shown = run_cli("status", "spec-on", home=tmp_path / "spec-on", check=True).stdout
    assert "tok/pass" in shown
    assert "tok/pass" not in run_cli("status", "spec-off", home=tmp_path / "spec-off", check=True).stdout
