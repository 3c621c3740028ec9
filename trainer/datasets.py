"""JSONL prompt datasets: one JSON object per line, a prompt and a reference answer.

Field names are the common ones, so GSM8K and MATH files load as they come:
  GSM8K: {"question": ..., "answer": "...reasoning...\\n#### 72"}  -> answer "72", demonstration kept
  MATH:  {"problem": ..., "solution": "... \\boxed{\\frac{1}{2}}"} -> answer "\\frac{1}{2}"
  plain: {"prompt": ..., "answer": "42"}
A reference that carries reasoning (a `####` line or a `\\boxed{}`) is also kept as a demonstration
for the supervised warm start; a bare answer is not (warm_start_steps must then be 0).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from trainer.verifiers import extract_answer

PROMPT_FIELDS = ("prompt", "question", "problem")
ANSWER_FIELDS = ("answer", "solution")


@dataclass(frozen=True)
class Record:
    prompt: str
    answer: str  # the final answer the verifier compares with ("" if the row has none: custom rewards)
    demonstration: str | None  # a full worked response, when the file has one
    row: dict = field(default_factory=dict)  # the whole JSON object, for a custom reward


class DatasetError(ValueError):
    pass


def _pick(obj: dict, field: str | None, candidates: tuple[str, ...], what: str, where: str) -> str:
    names = (field,) if field else candidates
    for name in names:
        if name in obj:
            value = obj[name]
            if not isinstance(value, (str, int, float)):
                raise DatasetError(f"{where}: field {name!r} must be a string or a number")
            return str(value)
    raise DatasetError(f"{where}: no {what} field (looked for {', '.join(names)}; set task.{what}_field)")


def load_jsonl(
    path: Path, prompt_field: str | None = None, answer_field: str | None = None, require_answer: bool = True
) -> list[Record]:
    """Read and check a dataset; errors name the file and line. Without `require_answer` (a custom
    reward, which reads what it needs from the row) a row may have no answer field."""
    records = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise DatasetError(f"{where}: each line must be a JSON object")
            prompt = _pick(obj, prompt_field, PROMPT_FIELDS, "prompt", where)
            names = (answer_field,) if answer_field else ANSWER_FIELDS
            if not require_answer and not any(n in obj for n in names):
                records.append(Record(prompt, "", None, obj))
                continue
            reference = _pick(obj, answer_field, ANSWER_FIELDS, "answer", where)
            final = extract_answer(reference)
            answer = (final if final is not None else reference).strip()
            if not answer and require_answer:
                raise DatasetError(f"{where}: empty answer")
            records.append(Record(prompt, answer, _demonstration(reference) if final is not None else None, obj))
    if not records:
        raise DatasetError(f"{path}: no records")
    return records


def _demonstration(reference: str) -> str:
    """A GSM8K solution ends in `#### x`; teach the boxed format the verifier reads instead."""
    if "####" in reference and "\\boxed" not in reference:
        body, _, final = reference.rpartition("####")
        return f"{body.strip()}\nThe final answer is \\boxed{{{final.strip()}}}."
    return reference
