"""README's job file reference lists every key the job file accepts (rlboost/contracts/spec/'s models).

A key counts as listed when a row of the reference table names it in its first column (`a.b.c`),
or names it in backticks anywhere in a row about its parent (`rollout.candidates[]` lists
`accelerator`, `clouds`, ...; `model.n_layer`, `n_head` share a row)."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from rlboost.contracts.spec import JobSpec

README = Path(__file__).resolve().parents[1] / "README.md"


def _models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) is dict:  # `perf.<ACCELERATOR>`: the map itself is the key
        return []
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def job_file_keys(model: type[BaseModel] = JobSpec, prefix: str = "") -> Iterator[str]:
    for name, field in model.model_fields.items():
        path = prefix + (field.alias or name)
        subs = _models(field.annotation)
        if not subs:
            yield path
        for sub in subs:
            yield from job_file_keys(sub, path + ".")


def reference_rows() -> list[tuple[list[str], list[str]]]:
    """Each table row: (the keys of its first column, every backticked name in the row)."""
    text = README.read_text()
    section = text[text.index("## Job file reference") : text.index("\n## ", text.index("## Job file reference") + 1)]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `"):
            heads = [re.sub(r"\[\]$|\.<.*>$", "", k) for k in re.findall(r"`([^`]+)`", line.split("|")[1])]
            rows.append((heads, re.findall(r"`([^`]+)`", line)))
    return rows


def listed(key: str, rows: list[tuple[list[str], list[str]]]) -> bool:
    parent, _, leaf = key.rpartition(".")
    for heads, names in rows:
        if key in heads:
            return True
        about_parent = heads[0] == parent or heads[0].rpartition(".")[0] == parent
        if parent and about_parent and leaf in names:
            return True
    return False


def test_every_job_file_key_is_in_the_readme_reference() -> None:
    keys = sorted(set(job_file_keys()))
    assert len(keys) > 100  # the walk reached the nested models (candidates, synthetic lengths, ...)
    rows = reference_rows()
    missing = [k for k in keys if not listed(k, rows)]
    assert not missing, f"README's job file reference lacks: {missing}"


def test_the_check_notices_a_missing_key() -> None:
    rows = [(heads, names) for heads, names in reference_rows() if "rollout.flush_s" not in heads]
    assert not listed("rollout.flush_s", rows)
    assert listed("rollout.candidates.spot_price", rows) and listed("task.answer_field", rows)
