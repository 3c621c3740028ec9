"""What every section of the job file is built from: the strict base model and the units its numbers
come in (each with bounds no real job leaves), and the accelerator form `NAME` or `NAME:COUNT`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from rlboost.contracts.spec_hints import count_form


class Strict(BaseModel):
    # strict: no silent coercion (`steps: "10"`, `steps: true`, `max_workers: 2.5` are errors); fields
    # whose YAML form is a string of another type (paths) opt out one by one with LaxPath.
    # allow_inf_nan=False: no number is .inf or .nan (an infinite price billed $inf, an infinite time
    # scale $0.00); every number also has bounds no real job leaves (tests/test_job_yaml.py checks each has)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# a path is written as a string in YAML (and in a model_dump(mode="json") round trip)
LaxPath = Annotated[Path, Field(strict=False)]

# the units most numbers come in, each with bounds no real job leaves
Price = Annotated[float, Field(ge=0, le=10_000)]  # $/h of one node or instance (8 H100s: ~$100)
Seconds = Annotated[float, Field(ge=0, le=604_800)]  # a duration: at most a week
Hours = Annotated[float, Field(gt=0, le=10_000)]  # a job's span: at most ~14 months
TokenRate = Annotated[float, Field(gt=0, le=1e9)]  # tokens/s, of one GPU or a whole cluster
SEED_LIMIT = 2**32  # numpy's legacy seeding (and with it HF's set_seed) takes 0 <= seed < 2**32


def check_accelerator(value: str | None) -> str | None:
    if value is None:
        return None
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(:[1-9][0-9]*)?", value):
        from rlboost.contracts.perf import DEFAULT_PERF

        fixed = count_form(value, DEFAULT_PERF)
        hint = f"did you mean {fixed!r}?" if fixed else "e.g. 'A100:8', 'H100', 'cpu'"
        raise ValueError(f"{value!r} is not NAME or NAME:COUNT ({hint})")
    return value
