"""A local tiny-gpt job with a custom reward and validation, through the real CLI and processes: the
trainer imports the reward itself, a reward that raises does not stop the job, and evaluations show up
in the trainer's log, metrics.jsonl and `rlboost status --json`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from rlboost.trainer.lr_schedule import LrSchedule, lr_at
from tests.conftest import run_cli, run_json

# whole jobs: .ci/run's slow tier; one xdist group, so the heavy tiers'
# --dist loadgroup builds the module's whole-job fixture once
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("test_custom_task_job")]

STEPS, EVERY = 4, 2

# Reverse, scored by the user's function; it raises on prompts that start with "a" (a seeded job
# draws such prompts every step), which must cost those responses their reward and nothing else.
REWARD = """
def score(prompt, response, row):
    if prompt.startswith("a"):
        raise ValueError("no prompts starting with a")
    return 1.0 if response == row["answer"] else 0.0
"""


def launch_with_package(job: Path, home: Path, pkg: Path) -> subprocess.CompletedProcess:
    """`rlboost launch job` with `pkg` on PYTHONPATH: the module is importable where the CLI checks
    the job file and, inherited, on the trainer (os.environ by hand: module-scoped fixtures use it)."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(pkg), old) if p)
    try:
        proc = run_cli("launch", str(job), home=home, timeout=300)
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def custom_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("custom")
    (tmp / "pkg").mkdir()
    (tmp / "pkg" / "my_job_rewards.py").write_text(REWARD)
    job = {
        "name": "custom",
        "algorithm": {
            "prompts_per_step": 16,
            "group_size": 4,
            "max_new_tokens": 8,
            "steps": STEPS,
            "seed": 5,
            "warm_start_steps": 60,
            # the rate by step: 1.5e-3, 3e-3 (warm-up), then a linear decay: 3e-3, 1.5e-3
            "lr_schedule": "linear",
            "lr_warmup_steps": 2,
        },
        "task": {
            "name": "reverse",
            "min_len": 3,
            "max_len": 4,
            "reward": "my_job_rewards:score",
            "eval_every": EVERY,
            "eval_size": 24,
        },
        "rollout": {"max_workers": 0},
    }
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    home = tmp / "home"
    proc = launch_with_package(path, home, tmp / "pkg")
    return home, proc


def test_job_succeeds_and_reports_the_last_evaluation(custom_run):
    home, _ = custom_run
    [j] = run_json("status", "custom", home=home)["jobs"]
    assert j["status"] == "succeeded" and j["step"] == STEPS
    ev = j["eval"]
    assert ev["version"] == STEPS and ev["step"] == STEPS and ev["problems"] == 24 and ev["temperature"] == 0.0
    assert 0.0 <= ev["pass@1"] <= 1.0 and ev["mean_reward"] == pytest.approx(ev["pass@1"])
    assert j["reward_errors"]["ValueError"] > 0  # counted, scored 0, and the job went on
    out = run_cli("status", "custom", home=home, check=True).stdout
    assert "eval after step 4: pass@1" in out and "custom reward failed (scored 0): ValueError x" in out


def test_metrics_file_has_eval_lines_and_the_trainer_log_says_so(custom_run):
    home, _ = custom_run
    [j] = run_json("status", "custom", home=home)["jobs"]
    rows = [json.loads(line) for line in Path(j["metrics_file"]).read_text().splitlines()]
    steps = [r for r in rows if "reward" in r]
    evals = [r for r in rows if "eval/pass@1" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert [r["version"] for r in evals] == [0, 2, 4]  # before training, every 2 steps, the last
    assert evals[-1]["eval/pass@1"] == j["eval"]["pass@1"]
    assert all(r["eval/problems"] == 24 for r in evals)
    errors = [r["reward_errors"] for r in steps]
    assert errors == sorted(errors) and errors[-1] > 0
    # the optimizer's figures, per step: the scheduled rate, one update, the gradient's norm, the policy term
    schedule = LrSchedule(3e-3, "linear", 2, STEPS)
    assert [r["lr"] for r in steps] == pytest.approx([lr_at(k, schedule) for k in range(STEPS)])
    assert [r["updates"] for r in steps] == [1] * STEPS
    assert all(r["grad_norm"] > 0 for r in steps)
    assert all(r["pg_loss"] == pytest.approx(r["loss"], abs=1e-9) for r in steps)  # no KL or entropy term
    recent = j["recent_steps"]  # and the state store's copy, which `rlboost status` shows
    figures = ("step", "lr", "grad_norm", "pg_loss", "updates")
    assert [[s[k] for k in figures] for s in recent] == [[r[k] for k in figures] for r in steps]
    log = run_cli("logs", "custom", "-n", "400", home=home, check=True).stdout
    assert f"step   {STEPS}/{STEPS}  reward" in log and "grad_norm" in log and "lr 0.0015" in log
    assert "eval  version   4  pass@1" in log and "(24 held-out problems, greedy" in log
    assert "reward my_job_rewards:score raised ValueError: no prompts starting with a; scored 0.0" in log
    assert log.count("raised ValueError") == 1  # logged once per kind


HF_REWARD = """
def score(prompt, response, row):
    # row["want"] raises (and is counted) unless the trainer hands over the dataset row
    return 1.0 if row["want"] in response else min(len(response), 20) / 40
"""


def test_hf_job_with_a_custom_reward_on_rows_without_answers(tmp_path):
    from testkit.hf_fixtures import make_tiny_model

    make_tiny_model(tmp_path / "model")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "my_hf_rewards.py").write_text(HF_REWARD)
    rows = [{"prompt": f"Say the number {i}", "want": str(i)} for i in range(12)]  # no answer field
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = {
        "name": "hfcustom",
        "model": {"kind": "hf", "path": "./model", "dtype": "float32"},
        "algorithm": {"prompts_per_step": 4, "group_size": 2, "max_new_tokens": 8, "steps": 3, "warm_start_steps": 0},
        "task": {
            "name": "jsonl",
            "path": "d.jsonl",
            "reward": "my_hf_rewards:score",
            "instruction": None,
            "eval_every": 2,
            "eval_fraction": 0.25,
        },
        "rollout": {"max_workers": 0},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    home = tmp_path / "home"
    launch_with_package(tmp_path / "job.yaml", home, tmp_path / "pkg")
    [j] = run_json("status", "hfcustom", home=home)["jobs"]
    assert j["status"] == "succeeded" and j["reward_errors"] == {}  # every call got its row
    rows_out = [json.loads(line) for line in Path(j["metrics_file"]).read_text().splitlines()]
    evals = [r for r in rows_out if "eval/pass@1" in r]
    assert [r["version"] for r in evals] == [0, 2, 3] and {r["eval/problems"] for r in evals} == {3}
    step_rewards = [r["reward"] for r in rows_out if "reward" in r]
    assert len(step_rewards) == 3 and all(0.0 <= x <= 1.0 for x in step_rewards) and max(step_rewards) > 0
