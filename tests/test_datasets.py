"""Prompt datasets (JSON Lines, parquet, Hugging Face `datasets` directories), their job-file keys, and
the math-answer verifier (GSM8K `####` and MATH `\\boxed{}` styles)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from rlboost.contracts.dataset_files import DatasetError
from rlboost.contracts.spec import SpecError, load_spec
from rlboost.trainer.datasets import Fields, load_jsonl, load_records
from rlboost.trainer.verifiers import answers_match, extract_answer, last_boxed, math_boxed, normalize


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


# ---- parquet and Hugging Face `datasets` directories (the `data` extra) ----------------------------

ROWS = [
    {"question": "Q1", "answer": "24 + 48 = 72\n#### 72", "level": 1},
    {"question": "Q2", "answer": "So it is $\\boxed{\\frac{1}{2}}$.", "level": 2},
    {"question": "Q3", "answer": "21", "level": 3},
]


def as_tuples(records: list) -> list[tuple]:
    return [(r.prompt, r.answer, r.demonstration, r.row) for r in records]


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    names = dict.fromkeys(k for r in rows for k in r)  # every row's columns (from_pylist takes the first's)
    pq.write_table(pa.table({k: [r.get(k) for r in rows] for k in names}), path)
    return path


def test_parquet_rows_load_as_the_same_jsonl_rows_do(tmp_path: Path) -> None:
    from_jsonl = load_jsonl(write(tmp_path, ROWS))
    from_parquet = load_records(write_parquet(tmp_path / "d.parquet", ROWS))
    assert as_tuples(from_parquet) == as_tuples(from_jsonl)
    assert from_parquet[0].row == ROWS[0]  # a custom reward gets the same row


def test_parquet_with_mixed_columns_and_custom_fields(tmp_path: Path) -> None:
    # GSM8K and MATH rows in one table: each row has nulls in the other's columns
    mixed = [{"question": "Q1", "answer": "#### 7"}, {"problem": "Q2", "solution": "\\boxed{3}"}]
    recs = load_records(write_parquet(tmp_path / "m.parquet", mixed))
    assert [(r.prompt, r.answer) for r in recs] == [("Q1", "7"), ("Q2", "3")]
    recs = load_records(write_parquet(tmp_path / "c.parquet", [{"q": "x", "a": 1}]), Fields("q", "a"))
    assert (recs[0].prompt, recs[0].answer) == ("x", "1")
    with pytest.raises(DatasetError, match=r"c\.parquet: row 1: no prompt field .*task\.prompt_field"):
        load_records(tmp_path / "c.parquet")
    # a custom reward's rows may have no answer, null or absent
    recs = load_records(tmp_path / "m.parquet", Fields(answer="answer", require_answer=False))
    assert [r.answer for r in recs] == ["7", ""]
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(DatasetError, match=r"bad\.parquet: not a readable parquet file"):
        load_records(tmp_path / "bad.parquet")


def save_dataset(path: Path, splits: dict[str, list[dict]] | list[dict]) -> Path:
    ds = pytest.importorskip("datasets")
    if isinstance(splits, list):
        ds.Dataset.from_list(splits).save_to_disk(str(path))
    else:
        ds.DatasetDict({k: ds.Dataset.from_list(v) for k, v in splits.items()}).save_to_disk(str(path))
    return path


def test_a_datasets_directory_loads_a_split_or_the_whole_dataset(tmp_path: Path) -> None:
    expected = as_tuples(load_jsonl(write(tmp_path, ROWS)))
    whole = save_dataset(tmp_path / "one", ROWS)
    assert as_tuples(load_records(whole)) == expected
    both = save_dataset(tmp_path / "dict", {"train": ROWS, "test": ROWS[:1]})
    assert as_tuples(load_records(both)) == expected  # split defaults to train
    assert as_tuples(load_records(both, split="test")) == expected[:1]
    assert as_tuples(load_records(both, default_split="test")) == expected[:1]  # eval_path's default
    with pytest.raises(DatasetError, match=r"task\.split: .* has no split 'validation' .*its splits: train, test"):
        load_records(both, split="validation")
    with pytest.raises(DatasetError, match=r"task\.split: .* holds a single Dataset, which has no splits"):
        load_records(whole, split="train")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match=r"not a Hugging Face datasets directory .*save_to_disk"):
        load_records(tmp_path / "empty")


def test_a_missing_library_is_an_error_naming_the_extra(tmp_path: Path, monkeypatch) -> None:
    path = write_parquet(tmp_path / "d.parquet", ROWS)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if pyarrow were not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DatasetError, match=r"needs the pyarrow package, .*pip install 'rlboost\[data\]'"):
        load_records(path)
    with pytest.raises(SpecError, match=r"task\.path: d\.parquet is a parquet file; reading it needs pyarrow"):
        load_spec(job_file(tmp_path, {"name": "jsonl", "path": "d.parquet"}))


# ---- the job file: task.path formats, task.split, task.chat_template --------------------------------


def job_file(tmp: Path, task: dict) -> Path:
    job = {"name": "hf-job", "model": {"kind": "hf", "path": "org/model"}, "task": task, "rollout": {"max_workers": 0}}
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_job_file_dataset_paths_and_splits(tmp_path: Path) -> None:
    write_parquet(tmp_path / "d.parquet", ROWS)
    save_dataset(tmp_path / "gsm", {"train": ROWS, "test": ROWS[:1]})
    spec = load_spec(job_file(tmp_path, {"name": "jsonl", "path": "d.parquet"}))
    assert spec.task.path == tmp_path / "d.parquet"
    task = {"name": "jsonl", "path": "gsm", "split": "train", "eval_every": 5, "eval_path": "gsm"}
    spec = load_spec(job_file(tmp_path, task))
    assert (spec.task.path, spec.task.eval_path, spec.task.eval_split) == (tmp_path / "gsm", tmp_path / "gsm", None)
    bad = [
        ({"path": "gsm", "split": "validation"}, r"task\.split: .*no split 'validation' .*its splits: train, test"),
        ({"path": "gsm", "eval_every": 5, "eval_path": "gsm", "eval_split": "dev"}, r"task\.eval_split: .*'dev'"),
        ({"path": "d.parquet", "split": "train"}, r"task\.split: applies to a Hugging Face datasets directory"),
        ({"path": "."}, r"task\.path: .*not a Hugging Face datasets directory"),
        ({"path": "d.csv"}, r"task\.path: d\.csv: rlboost reads JSON Lines .*parquet .*convert it"),
        ({"path": "nope.parquet"}, r"task\.path: file nope\.parquet not found"),
    ]
    (tmp_path / "d.csv").write_text("question,answer\nQ,1\n")
    for over, message in bad:
        with pytest.raises(SpecError, match=message):
            load_spec(job_file(tmp_path, {"name": "jsonl", **over}))
    # a DatasetDict without the default split names the key to set
    save_dataset(tmp_path / "only-test", {"test": ROWS})
    with pytest.raises(SpecError, match=r"task\.split: .*no split 'train' \(task\.split is not set"):
        load_spec(job_file(tmp_path, {"name": "jsonl", "path": "only-test"}))


@pytest.mark.parametrize(("written", "parsed"), [("on", "on"), ("off", "off"), ("auto", "auto"), ("'on'", "on")])
def test_chat_template_reads_yaml_on_and_off(tmp_path: Path, written: str, parsed: str) -> None:
    write(tmp_path, ROWS)
    path = job_file(tmp_path, {"name": "jsonl", "path": "d.jsonl"})
    path.write_text(path.read_text().replace("path: d.jsonl", f"path: d.jsonl\n  chat_template: {written}"))
    assert load_spec(path).task.chat_template == parsed


def test_chat_template_rejects_other_values(tmp_path: Path) -> None:
    write(tmp_path, ROWS)
    with pytest.raises(SpecError, match=r"task\.chat_template: invalid value 'sometimes'.*'auto', 'on' or 'off'"):
        load_spec(job_file(tmp_path, {"name": "jsonl", "path": "d.jsonl", "chat_template": "sometimes"}))
