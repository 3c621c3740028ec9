"""Job-file errors as the user reads them: `<field.path>: <problem> (<allowed values or fix>)`, one line
each, so a user can fix the file without reading the models."""

from __future__ import annotations

import re

from pydantic import ValidationError

from rlboost.contracts.spec.job import JobSpec
from rlboost.contracts.spec_hints import (
    clip_message,
    model_at,
    not_a_mapping,
    numeric_range,
    short_repr,
    unknown_key_hint,
)


class SpecError(Exception):
    """A job file problem, already phrased for the user (one line per problem; lines and their number
    capped, as they quote user input)."""

    def __init__(self, message: str) -> None:
        super().__init__(clip_message(message))


def loc_text(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


# strict mode's type errors, with the fix (YAML quotes make strings; `true` is a bool, not 1)
_STRICT_FIXES = {
    "int_type": "write a whole number, no quotes or decimals, e.g. 10",
    "float_type": "write a number without quotes, e.g. 3e-3 or 0.5",
    "bool_type": "write true or false without quotes",
    "string_type": 'quote it, e.g. "A100:8"',
    "list_type": "write a YAML list: [a, b], or one '- item' per line",
    "dict_type": "write a mapping: one 'key: value' per line, indented under it",
}


# pydantic's error types for a number out of its field's bounds (or not finite)
_RANGE_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number")


def format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors(include_url=False):
        parts = tuple(p for p in e["loc"] if not str(p).startswith("function-"))
        loc = loc_text(parts)
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        # an int too large for a float field (10**400) is out of its range, not of the wrong type
        huge = e["type"] == "float_type" and isinstance(got, int) and not isinstance(got, bool)
        if e["type"] == "extra_forbidden":
            msg = unknown_key_hint(JobSpec, parts)
        elif e["type"] == "model_type":  # pydantic's message names the model class
            msg = not_a_mapping(model_at(JobSpec, parts), got)
        elif e["type"] == "literal_error":
            msg = f"invalid value {short_repr(got)}; {msg.lower()}"
        elif e["type"] in _RANGE_ERRORS or huge:
            allowed = numeric_range(model_at(JobSpec, parts[:-1]), str(parts[-1])) if parts else None
            what = "is not a finite number" if e["type"] == "finite_number" else "is out of range"
            msg = f"{short_repr(got)} {what} (allowed: {allowed or msg.removeprefix('Input should be ')})"
        elif e["type"] in _STRICT_FIXES:
            msg = f"{msg} (got {short_repr(got)}, a {type(got).__name__}; {_STRICT_FIXES[e['type']]})"
        lines.append(msg if loc == "(top level)" and _names_a_field(msg) else f"{loc}: {msg}")
    return "\n".join(lines)


def _names_a_field(msg: str) -> bool:
    """A cross-field message that starts with the field at fault (`rollout.max_workers > 0 but …`)
    needs no `(top level):` in front of it."""
    head = re.match(r"[a-z_]+", msg)
    return head is not None and head.group() in JobSpec.model_fields and msg[head.end() : head.end() + 1] in ".[: "
