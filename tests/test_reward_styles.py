"""Reward styles (rlboost, veRL, TRL; rlboost/contracts/rewards.py): detected from the function's
parameter names or declared (task.reward_style), called with the right arguments, a step over
task.reward_error_budget stops the job, exception text is redacted of secrets, and `launch --dryrun`
tries the reward on a few rows."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlboost.contracts.redact import redact
from rlboost.contracts.rewards import (
    CustomReward,
    RewardBudgetExceeded,
    RewardStyleError,
    detect_style,
    ground_truth,
)
from rlboost.contracts.spec import SpecError, TaskSpec, load_spec
from rlboost.models.vocab import EOS, encode
from rlboost.trainer.reward_check import RewardCheckError, check_reward
from rlboost.trainer.tasks import make_task

_names = itertools.count()

REWARDS = """
calls = []

def plain(prompt, response, row):
    return 1.0

def renamed(q, a, example):  # rlboost's call, other names
    return 0.5

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    calls.append((data_source, solution_str, ground_truth, extra_info))
    return {"score": 1.0 if solution_str == ground_truth else 0.25, "acc": True}

def gsm8k(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
    calls.append((solution_str, ground_truth, method))
    return score if solution_str == ground_truth else format_score

def verl_renamed(data_source, solution, gt, extra=None):  # veRL's order, positionally
    calls.append((data_source, solution, gt, extra))
    return 0.75

def trl_reward(prompts, completions, **kwargs):
    calls.append((list(prompts), list(completions), kwargs))
    return [float(len(c)) for c in completions]

def trl_short(completions, **kwargs):
    return [1.0]

def trl_scalar(completions, **kwargs):  # a float, not a list
    return 1.0

def trl_answer(completions, answer, **kwargs):
    return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]

def two(a, b):
    return 1.0

def ambiguous(prompts, solution_str, row):
    return 1.0

def secret_raiser(prompt, response, row):
    raise PermissionError("token hf_SECRETvalue123 rejected for " + response)

def always_raises(prompt, response, row):
    raise AssertionError("bad row")

def flaky(prompt, response, row):
    if response.startswith("x"):
        raise KeyError("missing")
    return 1.0
"""


@pytest.fixture
def mod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import importlib

    name = f"style_rewards_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


def path(mod, fn: str) -> str:
    return f"{mod.__name__}:{fn}"


@pytest.mark.parametrize(
    ("fn", "style"),
    [
        ("plain", "rlboost"),
        ("renamed", "rlboost"),
        ("compute_score", "verl"),
        ("gsm8k", "verl"),
        ("verl_renamed", "verl"),
        ("trl_reward", "trl"),
        ("trl_short", "trl"),
        ("trl_answer", "trl"),
    ],
)
def test_style_is_detected_from_parameter_names(mod, fn: str, style: str) -> None:
    assert detect_style(getattr(mod, fn)) == style
    assert CustomReward(path(mod, fn)).style == style


@pytest.mark.parametrize(("fn", "why"), [("two", "fit no reward style"), ("ambiguous", "fit both verl and trl")])
def test_an_undetectable_signature_is_a_job_file_error(tmp_path: Path, mod, fn: str, why: str) -> None:
    with pytest.raises(RewardStyleError, match=why):
        detect_style(getattr(mod, fn), path=path(mod, fn))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "styles", "task": {"reward": path(mod, fn)}, "rollout": {"max_workers": 0}}))
    with pytest.raises(SpecError) as e:
        load_spec(job)
    text = str(e.value)
    assert f"task.reward {path(mod, fn)}" in text and why in text
    for accepted in ("score(prompt, response, row)", "compute_score(data_source, solution_str, ground_truth",
                     "reward(prompts, completions, **kwargs)", "task.reward_style: rlboost | verl | trl"):
        assert accepted in text


def test_a_declared_style_overrides_detection(tmp_path: Path, mod) -> None:
    spec = TaskSpec(reward=path(mod, "two"), reward_style="rlboost")
    assert spec.reward_style == "rlboost"
    assert detect_style(mod.plain, "trl") == "trl"
    with pytest.raises(ValueError, match="reward_style: apply to a custom reward"):
        TaskSpec(reward="exact_match", reward_style="verl")


def test_ground_truth_from_answer_or_verl_nested_reward_model() -> None:
    assert ground_truth({"answer": "5"}) == "5"
    assert ground_truth({"ground_truth": "7", "answer": "5"}) == "7"
    assert ground_truth({"reward_model": {"style": "rule", "ground_truth": "42"}}) == "42"
    assert ground_truth({"prompt": "x"}) is None


def test_verl_gets_data_source_solution_ground_truth_and_the_row_and_a_dict_scores(mod) -> None:
    r = CustomReward(path(mod, "compute_score"), data_source="my/task.parquet")
    row = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "72"}, "extra": 1}
    assert r("prompt", "72", row) == 1.0
    assert r("prompt", "71", {"reward_model": {"ground_truth": "72"}}) == 0.25
    assert mod.calls == [
        ("openai/gsm8k", "72", "72", row),
        ("my/task.parquet", "71", "72", {"reward_model": {"ground_truth": "72"}}),
    ]
    assert not r.errors


def test_verl_gsm8k_signature_is_called_by_keyword(mod) -> None:
    r = CustomReward(path(mod, "gsm8k"))
    assert r("p", "18", {"answer": "18"}) == 1.0 and r("p", "17", {"answer": "18"}) == 0.0
    assert mod.calls == [("18", "18", "strict"), ("17", "18", "strict")]
    r2 = CustomReward(path(mod, "verl_renamed"), data_source="reverse")
    assert r2("p", "a", {"answer": "b"}) == 0.75
    assert mod.calls[-1] == ("reverse", "a", "b", {"answer": "b"})


def test_a_dict_without_score_is_not_a_number(mod) -> None:
    r = CustomReward(path(mod, "compute_score"))
    r.fn = lambda data_source, solution_str, ground_truth, extra_info=None: {"acc": 1.0}
    assert r("p", "x", {}) == 0.0 and r.errors == {"not a number": 1}


def test_trl_is_called_once_per_group_with_columns_as_kwargs(mod) -> None:
    task = make_task(TaskSpec(name="reverse", reward=path(mod, "trl_reward")))
    (p,) = task.sample(np.random.default_rng(0), 1)
    responses = [[*encode(p.row["answer"]), EOS], encode("ab"), []]
    got = task.rewards([p, p, p], responses)
    assert got == [float(len(p.row["answer"])), 2.0, 0.0]
    assert len(mod.calls) == 1  # one batched call for the group
    prompts, completions, kwargs = mod.calls[0]
    assert prompts == [p.prompt_text] * 3 and completions == [p.row["answer"], "ab", ""]
    assert kwargs == {"answer": [p.row["answer"]] * 3}  # every column but the prompt, aligned


def test_trl_wrong_length_is_an_error_kind_for_every_response(mod) -> None:
    r = CustomReward(path(mod, "trl_short"))
    assert r.batch(["a", "b", "c"], ["1", "2", "3"], [{}, {}, {}]) == [0.0, 0.0, 0.0]
    assert r.errors == {"wrong length": 3}
    assert r.batch(["a"], ["1"], [{}]) == [1.0]
    r2 = CustomReward(path(mod, "trl_answer"))  # a named column, no prompts parameter
    assert r2.batch(["a", "b"], ["1", "2"], [{"answer": "1"}, {"answer": "3"}]) == [1.0, 0.0]


def test_redact_replaces_each_secret_of_four_or_more_characters() -> None:
    text = "key sk-abcdef and sk-abcdef-long, pin 123, word abcd"
    assert redact(text, ["sk-abcdef", "sk-abcdef-long", "123", "", "abcd"]) == "key *** and ***, pin 123, word ***"
    assert redact("nothing here", []) == "nothing here"


def test_a_secret_in_the_exception_never_reaches_the_log_or_the_error(mod, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rlboost.trainer")
    r = CustomReward(path(mod, "secret_raiser"), secrets=["hf_SECRETvalue123"])
    assert [r("p", "resp", {}) for _ in range(4)] == [0.0] * 4
    with pytest.raises(RewardBudgetExceeded) as e:
        r.end_step(1)
    logged = " ".join(m.getMessage() for m in caplog.records)
    assert "PermissionError: token *** rejected" in logged and "PermissionError: token *** rejected" in str(e.value)
    assert "hf_SECRETvalue123" not in logged + str(e.value)


def test_the_error_budget_trips_on_most_failures_or_an_all_failing_first_step(mod) -> None:
    r = CustomReward(path(mod, "always_raises"))
    for _ in range(48):
        r("p", "resp", {})
    with pytest.raises(RewardBudgetExceeded) as e:
        r.end_step(1)
    where = path(mod, "always_raises")
    head = f"task.reward failed on 48 of 48 responses in step 1 ({where} raised AssertionError: bad row)"
    assert str(e.value).startswith(head)
    assert "task.reward_error_budget (now 0.5)" in str(e.value)

    f = CustomReward(path(mod, "flaky"), budget=0.5)
    f.batch(["p"] * 4, ["x", "ok", "ok", "ok"], [{}] * 4)
    f.end_step(1)  # 1 of 4: within the budget
    f.batch(["p"] * 4, ["x", "x", "ok", "ok"], [{}] * 4)
    f.end_step(2)  # exactly the budget: not over it
    f.batch(["p"] * 4, ["x", "x", "x", "ok"], [{}] * 4)
    with pytest.raises(RewardBudgetExceeded, match=r"failed on 3 of 4 responses in step 3 .*KeyError: 'missing'"):
        f.end_step(3)
    f.end_step(4)  # a new window: nothing called, nothing to judge

    lenient = CustomReward(path(mod, "always_raises"), budget=1.0)
    lenient("p", "r", {})
    with pytest.raises(RewardBudgetExceeded, match="failed on 1 of 1 responses in step 1"):
        lenient.end_step(1)  # a first step that fails entirely stops the job whatever the budget
    lenient("p", "r", {})
    lenient.end_step(2)  # later: within a budget of 1.0


def _job(tmp_path: Path, task: dict) -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "dry", "task": task, "rollout": {"max_workers": 0}}))
    return job


def test_dryrun_check_scores_a_few_rows_with_their_answers(tmp_path: Path, mod) -> None:
    spec = load_spec(_job(tmp_path, {"name": "reverse", "reward": path(mod, "compute_score")}))
    lines = check_reward(spec, [])
    assert lines is not None and lines[0] == f"task.reward {path(mod, 'compute_score')} (style verl) on 3 rows:"
    scores = [float(line.rsplit(" ", 1)[1]) for line in lines[1:]]
    assert scores == [1.0, 0.25] * 3  # the reference answer, then an empty response, per row
    assert check_reward(load_spec(_job(tmp_path, {"name": "reverse"})), []) is None  # built-in: not tried


def test_dryrun_check_fails_naming_task_reward_with_the_secret_redacted(tmp_path: Path, mod) -> None:
    spec = load_spec(_job(tmp_path, {"name": "reverse", "reward": path(mod, "secret_raiser")}))
    with pytest.raises(RewardCheckError) as e:
        check_reward(spec, ["hf_SECRETvalue123"])
    text = str(e.value)
    where = path(mod, "secret_raiser")
    assert text.startswith(f"task.reward {where} (style rlboost) raised PermissionError: token ***")
    assert "on row 1" in text and "task.reward_style" in text and "hf_SECRETvalue123" not in text
    spec = load_spec(_job(tmp_path, {"name": "reverse", "reward": path(mod, "trl_short"), "reward_style": "trl"}))
    assert check_reward(spec, []) is not None  # one row at a time: a list of one is right
    spec = load_spec(_job(tmp_path, {"name": "reverse", "reward": path(mod, "trl_scalar")}))
    with pytest.raises(RewardCheckError, match=r"returned float 1\.0, not a list"):
        check_reward(spec, [])
