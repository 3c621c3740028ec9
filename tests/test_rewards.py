"""Custom rewards (`task.reward: module:function`): checked when the job file loads, called with
(prompt, response, row) on both task kinds, and a failing reward scores 0, is counted and logged once."""

from __future__ import annotations

import itertools
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlboost.contracts.rewards import CustomReward, RewardImportError, import_reward
from rlboost.contracts.spec import SpecError, TaskSpec, load_spec
from rlboost.models.vocab import EOS, encode
from rlboost.trainer.tasks import make_task

_names = itertools.count()

REWARDS = """
import math

calls = []

def score(prompt, response, row):
    calls.append((prompt, response, dict(row)))
    return 1.0 if response == row.get("answer") else 0.25

def length(prompt, response, row):
    return float(len(response))

def raises(prompt, response, row):
    if response.startswith("x"):
        raise ZeroDivisionError("boom")
    return {"nan": math.nan, "str": "high", "inf": math.inf}.get(response, 1.0)

not_callable = 3
"""


@pytest.fixture
def rewards_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh module of reward functions on sys.path; returns its (unique) name."""
    name = f"user_rewards_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def write_job(tmp: Path, task: dict) -> Path:
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump({"name": "rew", "task": task, "rollout": {"max_workers": 0}}))
    return path


def test_job_file_accepts_an_importable_function(tmp_path: Path, rewards_module: str) -> None:
    spec = load_spec(write_job(tmp_path, {"name": "reverse", "reward": f"{rewards_module}:score"}))
    assert spec.task.reward == f"{rewards_module}:score"


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ("no_such_pkg_xyz.rewards:score", r"task.reward: cannot import 'no_such_pkg_xyz.rewards' .*PYTHONPATH"),
        ("{mod}:missing", r"task.reward: module '{mod}' has no attribute 'missing'; check the name after ':'"),
        ("{mod}:not_callable", r"task.reward: {mod}:not_callable is a int, not a function; .*score\(prompt: str"),
        ("exactmatch", r"task.reward: 'exactmatch' is neither a built-in verifier \(exact_match, math_boxed\)"),
        ("{mod}.score", r"neither a built-in verifier .*\(module.submodule:function\)"),
    ],
)
def test_a_bad_reward_is_a_job_file_error(tmp_path: Path, rewards_module: str, reward: str, message: str) -> None:
    job = write_job(tmp_path, {"name": "reverse", "reward": reward.format(mod=rewards_module)})
    with pytest.raises(SpecError, match=message.format(mod=rewards_module)):
        load_spec(job)


def test_a_module_that_fails_to_import_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_rewards_mod.py").write_text("import json\nraise RuntimeError('needs a GPU')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RewardImportError, match=r"importing 'broken_rewards_mod' raised RuntimeError: needs a GPU"):
        import_reward("broken_rewards_mod:score")


def test_failures_score_zero_are_counted_by_kind_and_logged_once(
    rewards_module: str, caplog: pytest.LogCaptureFixture
) -> None:
    r = CustomReward(f"{rewards_module}:raises")
    caplog.set_level(logging.WARNING, logger="rlboost.trainer")
    got = [r("p", resp, {}) for resp in ("x1", "ok", "x2", "nan", "inf", "str", "x3")]
    assert got == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert r.errors == {"ZeroDivisionError": 3, "non-finite": 2, "not a number": 1}
    assert r.error_count == 6
    warned = [m.getMessage() for m in caplog.records]
    assert len(warned) == 3  # once per kind
    assert "raised ZeroDivisionError: boom" in warned[0] and "reward_errors['ZeroDivisionError']" in warned[0]


def test_numpy_scalars_are_numbers(rewards_module: str) -> None:
    r = CustomReward(f"{rewards_module}:length")
    r.fn = lambda p, s, row: np.float32(0.5)
    assert r("p", "r", {}) == 0.5 and not r.errors


def test_builtin_task_calls_the_function_with_question_response_and_row(rewards_module: str) -> None:
    import importlib

    task = make_task(TaskSpec(name="reverse", reward=f"{rewards_module}:score"))
    (p,) = task.sample(np.random.default_rng(0), 1)
    q, a = p.row["prompt"], p.row["answer"]
    assert a == q[::-1] and p.prompt_text == q
    assert task.reward(p, [*encode(a), EOS]) == 1.0  # the end-of-sequence is not part of the text
    assert task.reward(p, encode(a + "a")) == 0.25
    calls = importlib.import_module(rewards_module).calls
    assert calls[-2] == (q, a, {"prompt": q, "answer": a})


def test_jsonl_task_gives_the_whole_row_and_needs_no_answer_field(tmp_path: Path, rewards_module: str) -> None:
    import importlib

    from rlboost.contracts.spec import ModelSpec
    from testkit.hf_fixtures import make_tiny_model

    model = make_tiny_model(tmp_path / "m")
    data = tmp_path / "d.jsonl"
    rows = [{"prompt": "What is 2 + 3?", "answer": "5", "meta": {"level": 1}}, {"prompt": "Say hi", "style": "short"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = TaskSpec(name="jsonl", path=data, reward=f"{rewards_module}:score", instruction=None)
    task = make_task(spec, ModelSpec(kind="hf", path=str(model), dtype="float32"))
    problems = sorted(task.sample(np.random.default_rng(0), 2), key=lambda p: p.prompt_text)
    tok = task.tokenizer
    response = [*tok.encode("5", add_special_tokens=False), task.eos_id]
    assert task.reward(problems[1], response) == 1.0
    assert task.reward(problems[0], response) == 0.25  # the row has no answer: the function decides
    calls = importlib.import_module(rewards_module).calls
    assert calls == [("What is 2 + 3?", "5", rows[0]), ("Say hi", "5", rows[1])]
    assert not math.isnan(task.reward(problems[0], []))
