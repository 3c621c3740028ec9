"""Prompt datasets: rows with a prompt and a reference answer, from a JSON Lines file, a parquet file
(pyarrow) or a Hugging Face `datasets` directory (`save_to_disk`; a DatasetDict's split by name). Every
format gives the same thing: one row dict per example, so a custom reward sees the same `row`.

Field names are the common ones, so GSM8K and MATH files load as they come:
  GSM8K: {"question": ..., "answer": "...reasoning...\\n#### 72"}  -> answer "72", demonstration kept
  MATH:  {"problem": ..., "solution": "... \\boxed{\\frac{1}{2}}"} -> answer "\\frac{1}{2}"
  plain: {"prompt": ..., "answer": "42"}
A reference that carries reasoning (a `####` line or a `\\boxed{}`) is also kept as a demonstration
for the supervised warm start; a bare answer is not (warm_start_steps must then be 0).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rlboost.contracts.dataset_files import (
    DEFAULT_SPLIT,
    INSTALL_HINT,
    DatasetError,
    dataset_format,
    missing_library,
    pick_split,
)
from rlboost.trainer.verifiers import extract_answer

PROMPT_FIELDS = ("prompt", "question", "problem")
ANSWER_FIELDS = ("answer", "solution")


@dataclass(frozen=True)
class Record:
    prompt: str
    answer: str  # the final answer the verifier compares with ("" if the row has none: custom rewards)
    demonstration: str | None  # a full worked response, when the file has one
    row: dict = field(default_factory=dict)  # the whole JSON object, for a custom reward


def _pick(obj: dict, field: str | None, candidates: tuple[str, ...], what: str, where: str) -> str:
    names = (field,) if field else candidates
    for name in names:
        if obj.get(name) is not None:  # a parquet column is null, not absent, in rows that lack it
            value = obj[name]
            if not isinstance(value, (str, int, float)):
                raise DatasetError(f"{where}: field {name!r} must be a string or a number")
            return str(value)
    raise DatasetError(f"{where}: no {what} field (looked for {', '.join(names)}; set task.{what}_field)")


def _rows(path: Path, split: str | None, default_split: str, split_key: str) -> Iterator[tuple[str, object]]:
    """(where, row) for every example of `path`; `where` names the file and line or row for errors."""
    fmt = dataset_format(path)
    if fmt != "jsonl" and (lib := missing_library(path)) is not None:
        raise DatasetError(f"{path}: reading it needs the {lib} package, which is not installed; {INSTALL_HINT}")
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types (ArrowInvalid, OSError) for a bad file
            raise DatasetError(f"{path}: not a readable parquet file ({e})") from None
        for n, row in enumerate(table.to_pylist(), 1):
            yield f"{path}: row {n}", row
        return
    if fmt == "hf-dir":
        import datasets

        name = pick_split(path, split, default_split, split_key)
        loaded = datasets.load_from_disk(str(path))
        data = loaded[name] if name is not None else loaded
        where = f"{path} [{name}]" if name is not None else str(path)
        for n, row in enumerate(data, 1):
            yield f"{where}: row {n}", row
        return
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{where}: not valid JSON ({e.msg})") from None
            yield where, obj


@dataclass(frozen=True)
class Fields:
    """Which fields of a row hold the prompt and the answer (None: the usual names), and whether every
    row must have an answer (not for a custom reward, which reads what it needs from the row)."""

    prompt: str | None = None
    answer: str | None = None
    require_answer: bool = True


def load_records(
    path: Path,
    fields: Fields = Fields(),
    split: str | None = None,
    *,
    default_split: str = DEFAULT_SPLIT,
    split_key: str = "task.split",
) -> list[Record]:
    """Read and check a dataset of any supported format; errors name the file and line (or row)."""
    records = []
    for where, obj in _rows(path, split, default_split, split_key):
        if not isinstance(obj, dict):
            raise DatasetError(f"{where}: each line must be a JSON object")
        records.append(_record(obj, fields, where))
    if not records:
        raise DatasetError(f"{path}: no records")
    return records


def _record(obj: dict, fields: Fields, where: str) -> Record:
    prompt = _pick(obj, fields.prompt, PROMPT_FIELDS, "prompt", where)
    names = (fields.answer,) if fields.answer else ANSWER_FIELDS
    if not fields.require_answer and not any(obj.get(n) is not None for n in names):
        return Record(prompt, "", None, obj)
    reference = _pick(obj, fields.answer, ANSWER_FIELDS, "answer", where)
    final = extract_answer(reference)
    answer = (final if final is not None else reference).strip()
    if not answer and fields.require_answer:
        raise DatasetError(f"{where}: empty answer")
    return Record(prompt, answer, _demonstration(reference) if final is not None else None, obj)


def load_jsonl(
    path: Path, prompt_field: str | None = None, answer_field: str | None = None, require_answer: bool = True
) -> list[Record]:
    """A JSON Lines file (or any supported format: see load_records)."""
    return load_records(path, Fields(prompt_field, answer_field, require_answer))


def _demonstration(reference: str) -> str:
    """A GSM8K solution ends in `#### x`; teach the boxed format the verifier reads instead."""
    if "####" in reference and "\\boxed" not in reference:
        body, _, final = reference.rpartition("####")
        return f"{body.strip()}\nThe final answer is \\boxed{{{final.strip()}}}."
    return reference
