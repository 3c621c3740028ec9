"""Local tiny-gpt jobs through the real CLI with custom rewards in other styles: a veRL-signature reward
trains (its scores are the steps' rewards), a reward that always raises fails the job (non-zero exit,
the error names task.reward and the exception, never the secret in it), and `launch --dryrun` tries the
reward on a few rows first."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli, run_json

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # whole jobs: .ci/run's slow tier

SECRET = "sk-live-0123456789abcdef"

REWARDS = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # raises (every response fails, and the job with it) unless veRL's arguments arrive as they should
    assert data_source == "reverse", data_source
    assert ground_truth == extra_info["answer"] == extra_info["prompt"][::-1], (ground_truth, extra_info)
    assert isinstance(solution_str, str)
    return {"score": 1.0, "acc": 0.0}

def trl_batched(prompts, completions, answer, **kwargs):
    # one line per call: how many completions it scored (the trainer batches one group per call)
    import os
    with open(os.environ["REWARD_CALLS"], "a") as f:
        f.write(f"{len(completions)}\\n")
    assert answer == [p[::-1] for p in prompts], (prompts, answer)
    return [0.5] * len(completions)

def broken(prompt, response, row):
    import os
    raise RuntimeError("cannot reach the judge with key " + os.environ["JUDGE_KEY"])
"""


def _job(tmp: Path, name: str, reward: str) -> Path:
    job = {
        "name": name,
        "algorithm": {"prompts_per_step": 4, "group_size": 2, "max_new_tokens": 6, "steps": 2, "warm_start_steps": 0},
        "task": {"name": "reverse", "min_len": 3, "max_len": 4, "reward": reward},
        "envs": {"JUDGE_KEY": None},
        "rollout": {"max_workers": 0},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@pytest.fixture
def pkg(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "styled_job_rewards.py").write_text(REWARDS)
    # prepended: the jobs' processes must import this rlboost as well
    paths = [str(tmp_path / "pkg"), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(paths), "JUDGE_KEY": SECRET}


def test_a_verl_reward_trains_and_its_scores_are_the_step_rewards(tmp_path: Path, pkg: dict[str, str]) -> None:
    home = tmp_path / "home"
    job = _job(tmp_path, "verljob", "styled_job_rewards:compute_score")
    dry = run_cli("launch", "--dryrun", str(job), "--env", "JUDGE_KEY", home=home, env=pkg)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "task.reward styled_job_rewards:compute_score (style verl) on 3 rows:" in dry.stdout
    proc = run_cli("launch", str(job), "--env", "JUDGE_KEY", home=home, env=pkg)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [j] = run_json("status", "verljob", home=home)["jobs"]
    assert j["status"] == "succeeded" and j["reward_errors"] == {}
    rows = [json.loads(line) for line in Path(j["metrics_file"]).read_text().splitlines()]
    assert [r["reward"] for r in rows if "reward" in r] == [1.0, 1.0]  # the dict's score, every response


def test_a_trl_reward_is_called_once_per_group(tmp_path: Path, pkg: dict[str, str]) -> None:
    home, calls = tmp_path / "home", tmp_path / "calls.txt"
    job = _job(tmp_path, "trljob", "styled_job_rewards:trl_batched")
    proc = run_cli("launch", str(job), "--env", "JUDGE_KEY", home=home, env={**pkg, "REWARD_CALLS": str(calls)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [j] = run_json("status", "trljob", home=home)["jobs"]
    assert j["status"] == "succeeded" and j["reward_errors"] == {}
    assert calls.read_text().split() == ["2"] * 8  # 2 steps x 4 prompts, each group of 2 in one call
    rows = [json.loads(line) for line in Path(j["metrics_file"]).read_text().splitlines()]
    assert [r["reward"] for r in rows if "reward" in r] == [0.5, 0.5]


def test_a_reward_that_always_raises_fails_the_job_naming_task_reward(tmp_path: Path, pkg: dict[str, str]) -> None:
    home = tmp_path / "home"
    job = _job(tmp_path, "brokenjob", "styled_job_rewards:broken")
    dry = run_cli("launch", "--dryrun", str(job), "--env", "JUDGE_KEY", home=home, env=pkg)
    assert dry.returncode == 2
    assert "task.reward styled_job_rewards:broken (style rlboost) raised RuntimeError: cannot reach the judge" in (
        dry.stdout + dry.stderr
    )
    proc = run_cli("launch", str(job), "--env", "JUDGE_KEY", home=home, env=pkg)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert (
        "task.reward failed on 8 of 8 responses in step 1 (styled_job_rewards:broken raised RuntimeError: "
        "cannot reach the judge with key ***)" in out  # the trainer redacts it (the job's --env value)
    ), out
    [j] = run_json("status", "brokenjob", home=home)["jobs"]
    assert j["status"] == "failed" and "task.reward failed on 8 of 8 responses in step 1" in j["error"]
    log = run_cli("logs", "brokenjob", "-n", "400", home=home, check=True).stdout
    assert "task.reward failed on 8 of 8" in log
    assert SECRET not in out + dry.stdout + dry.stderr + log + j["error"]
