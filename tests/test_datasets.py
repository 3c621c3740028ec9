"""JSONL prompt datasets and the math-answer verifier (GSM8K `####` and MATH `\\boxed{}` styles)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.datasets import DatasetError, load_jsonl
from trainer.verifiers import answers_match, extract_answer, last_boxed, math_boxed, normalize


def write(tmp: Path, rows: list) -> Path:
    p = tmp / "d.jsonl"
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def test_gsm8k_math_and_plain_rows_load(tmp_path: Path) -> None:
    recs = load_jsonl(
        write(
            tmp_path,
            [
                {"question": "Q1", "answer": "24 + 48 = 72\n#### 72"},
                {"problem": "Q2", "solution": "So it is $\\boxed{\\frac{1}{2}}$."},
                {"prompt": "Q3", "answer": 21},
                "",
            ],
        )
    )
    assert [(r.prompt, r.answer) for r in recs] == [("Q1", "72"), ("Q2", "\\frac{1}{2}"), ("Q3", "21")]
    assert recs[0].demonstration == "24 + 48 = 72\nThe final answer is \\boxed{72}."
    assert recs[1].demonstration is not None and recs[2].demonstration is None


def test_custom_fields_and_clear_errors(tmp_path: Path) -> None:
    recs = load_jsonl(write(tmp_path, [{"q": "x", "a": "1"}]), prompt_field="q", answer_field="a")
    assert recs[0].answer == "1"
    with pytest.raises(DatasetError, match=r"d.jsonl:1: no prompt field .*task.prompt_field"):
        load_jsonl(write(tmp_path, [{"text": "x", "answer": "1"}]))
    with pytest.raises(DatasetError, match=r"d.jsonl:2: not valid JSON"):
        load_jsonl(write(tmp_path, [{"prompt": "x", "answer": "1"}, "{oops"]))
    with pytest.raises(DatasetError, match="no records"):
        load_jsonl(write(tmp_path, [""]))


@pytest.mark.parametrize(
    ("response", "reference", "reward"),
    [
        ("so the answer is \\boxed{72}.", "72", 1.0),
        ("\\boxed{71}", "72", 0.0),
        ("first \\boxed{1} then \\boxed{ 72 }", "72", 1.0),  # the last box counts
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("\\boxed{1,234}", "1234", 1.0),
        ("\\boxed{5.0}", "5", 1.0),
        ("\\boxed{\\text{ 12 }}", "12", 1.0),
        ("#### 18", "18", 1.0),
        ("the answer is 72", "72", 0.0),  # no final-answer marker: no reward
        ("\\boxed{\\sqrt{2}}", "\\sqrt{2}", 1.0),
        ("\\boxed{x^{2}+1}", "x^{2} + 1", 1.0),
        ("\\boxed{}", "0", 0.0),
    ],
)
def test_math_boxed_reward(response: str, reference: str, reward: float) -> None:
    assert math_boxed(response, reference) == reward


def test_extraction_helpers() -> None:
    assert last_boxed("a \\boxed{\\frac{a}{b}} b") == "\\frac{a}{b}"
    assert last_boxed("\\boxed{unclosed") is None
    assert extract_answer("x\n#### 1,000") == "1,000"
    assert normalize("$\\left( 1 \\right)$") == "(1)"
    assert answers_match("1/2", "\\frac{1}{2}") and not answers_match("1/3", "0.5")
