"""A local job with `model.lora`: the trainer, a spot worker (a process of its own, pulling every version
over HTTP) and a tiny Qwen2. The worker merges each version's adapters into the base it loaded; the
responses it generated are re-scored under the learner's weights of their step: the log-probs agree, so
the engine's merged weights are the learner's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

pytest.importorskip("peft")

from rlboost.cli.state import StateStore
from rlboost.contracts.spec import JobSpec
from rlboost.models.lora import A_SUFFIX, B_SUFFIX
from rlboost.trainer.learner import Learner
from tests.conftest import run_cli, run_json
from tests.test_custom_task_job import HF_REWARD
from tests.test_local_job import load_rollouts, trainer_dir

STEPS = 3


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    from testkit.hf_fixtures import make_tiny_model

    tmp = tmp_path_factory.mktemp("lorajob")
    make_tiny_model(tmp / "model")
    (tmp / "pkg").mkdir()
    (tmp / "pkg" / "my_hf_rewards.py").write_text(HF_REWARD)  # varies with the response: advantages != 0
    rows = [{"prompt": f"Say the number {i}", "want": str(i)} for i in range(12)]
    (tmp / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "trace.json").write_text(json.dumps({"metadata": {"gap_seconds": 1}, "data": [3] * 900}))
    job = {
        "name": "lora",
        "model": {"kind": "hf", "path": "./model", "dtype": "float32", "lora": {"rank": 4, "alpha": 8.0}},
        "algorithm": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 8, "steps": STEPS,
                      "warm_start_steps": 0, "learning_rate": 0.02, "kl_coef": 0.05},
        "task": {"name": "jsonl", "path": "d.jsonl", "reward": "my_hf_rewards:score", "instruction": None,
                 "eval_every": 0},
        "rollout": {
            "max_workers": 1,
            "min_workers": 1,
            "trainer_engine": False,  # the spot worker generates everything
            "candidates": [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.5, "on_demand_price": 3.5}],
        },
        "local": {"trace": "trace.json"},
    }
    (tmp / "job.yaml").write_text(yaml.safe_dump(job))
    home = tmp / "home"
    env = {"PYTHONPATH": f"{tmp / 'pkg'}:{Path(__file__).resolve().parents[1]}", "RLBOOST_WAIT_ENGINES": "1"}
    proc = run_cli("launch", str(tmp / "job.yaml"), "--record-rollouts", home=home, timeout=400, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return home


def test_the_job_runs_to_the_end_with_finite_rewards_and_losses(lora_run):
    [j] = run_json("status", "lora", home=lora_run)["jobs"]
    assert j["status"] == "succeeded" and j["step"] == STEPS
    rows = [json.loads(line) for line in Path(j["metrics_file"]).read_text().splitlines()]
    steps = [r for r in rows if "reward" in r]
    assert len(steps) == STEPS
    assert all(math.isfinite(r["reward"]) and math.isfinite(r["loss"]) for r in steps)
    log = (Path(j["metrics_file"]).parent / "instances" / "lora-1-trainer" / "log").read_text()
    assert "tensors: LoRA adapters only, model.lora)" in log, log


def test_final_weights_are_the_adapters_only(lora_run):
    job = StateStore(lora_run / "state.db").get_job("lora")
    final = load_file(str(trainer_dir(lora_run, "lora", job.id) / "final.safetensors"))
    assert final and all(k.endswith((A_SUFFIX, B_SUFFIX)) for k in final)
    assert any(float(v.abs().max()) > 0 for k, v in final.items() if k.endswith(B_SUFFIX))  # trained


def test_the_workers_tokens_match_the_learners_merged_weights(lora_run, monkeypatch):
    """Every response of the last step, generated on the worker from version STEPS-1's adapters merged
    into its base, re-scored by a learner holding those adapters."""
    store = StateStore(lora_run / "state.db")
    job = store.get_job("lora")
    tdir = trainer_dir(lora_run, "lora", job.id)
    monkeypatch.syspath_prepend(str(lora_run / ".." / "pkg"))  # the job's reward module, as the trainer has it
    spec = JobSpec.model_validate(yaml.safe_load(job.spec_yaml))
    assert Path(spec.model.path).is_absolute()  # the saved job file has its paths resolved
    learner = Learner(spec.model, spec.algorithm, spec.task, seed=0, device="cpu")
    rows = [r for r in load_rollouts(tdir) if r["step"] == STEPS - 1]
    assert rows and all(r["version"] == STEPS - 1 for r in rows)
    # the check can tell: under the base weights (a fresh learner: B = 0) the log-probs are off
    off = max(abs(a - b) for r in rows for a, b in zip(learner.logprobs(r["prompt"], r["tokens"]), r["logprobs"]))
    assert off > 1e-3
    learner.load_state_dict(load_file(str(tdir / "last-step-weights.safetensors")))
    assert all(e.startswith("lora-1-w") for r in rows for e in r["engines"]), rows[0]["engines"]
    for r in rows:
        want = learner.logprobs(r["prompt"], r["tokens"])
        assert max(abs(a - b) for a, b in zip(want, r["logprobs"], strict=True)) < 1e-4, r["rid"]
