"""Hints for job-file errors (rlboost/contracts/spec/): the close match of a mistyped key or accelerator, the
NAME:COUNT form of a count written another way, and a section's example mapping. Imports nothing of ours."""

from __future__ import annotations

import difflib
import re
import reprlib
import types
import typing
from collections.abc import Iterable

from pydantic import BaseModel
from pydantic.fields import FieldInfo

# an example mapping for a section whose first field says little (the others use their first field)
_EXAMPLES = {
    "TrainerSpec": '{accelerators: "A100:8"}',
    "SpotCandidate": "{accelerator: A100, clouds: [local]}",
    "PerfSpec": "{tokens_per_s: 3926}",
    "WandbSpec": "{project: my-project}",
    "LoggingSpec": "{tensorboard: tb}",
    "SyntheticSpec": "{prompt_tokens: 1000}",
}


# letters typed for the digits they look like (A10O for A100)
_LOOKALIKE = str.maketrans({"o": "0", "i": "1", "l": "1"})


def close_matches(word: str, choices: Iterable[str]) -> list[str]:
    """The choices `word` most likely misspells (case-insensitive; a letter O for a zero counts as the
    zero): the one it matches but for that, else the equally closest ones; [] when none is close."""
    by_lower = {c.lower(): c for c in choices}
    key = word.lower().translate(_LOOKALIKE)
    same = [c for low, c in by_lower.items() if low.translate(_LOOKALIKE) == key]
    if len(same) == 1:
        return same
    scores = {low: difflib.SequenceMatcher(None, word.lower(), low).ratio() for low in by_lower}
    best = max(scores.values(), default=0.0)
    return [by_lower[low] for low in sorted(scores) if scores[low] == best] if best >= 0.6 else []


def did_you_mean(word: str, choices: Iterable[str], quote: bool = True) -> str | None:
    """ "did you mean 'A100'?" (or "'A100' or 'A10G'") for a misspelt `word`, or None."""
    near = close_matches(word, choices)
    if not near:
        return None
    return f"did you mean {' or '.join(repr(n) if quote else n for n in near)}?"


def _unwrap(tp: object) -> object:
    """`X | None` -> X; Annotated[X, ...] -> X (one level of each, repeatedly)."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def model_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The pydantic model class at `loc` below `root` (a list item by index, a dict value by key), or None."""
    tp: object = root
    for part in loc:
        tp = _unwrap(tp)
        origin = typing.get_origin(tp)
        if isinstance(part, int) and origin is list:
            tp = typing.get_args(tp)[0]
        elif origin is dict:
            tp = typing.get_args(tp)[1]
        elif isinstance(tp, type) and issubclass(tp, BaseModel) and part in tp.model_fields:
            tp = tp.model_fields[part].annotation
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def key_names(cls: type[BaseModel]) -> list[str]:
    """The keys a section accepts: its field names and their aliases."""
    names = list(cls.model_fields)
    names += [f.alias for f in cls.model_fields.values() if f.alias and f.alias not in names]
    return names


def unknown_key_hint(root: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """The message for an unknown key at `loc`: its close match in that section, if any."""
    cls = model_at(root, loc[:-1])
    hint = did_you_mean(str(loc[-1]), key_names(cls), quote=False) if cls is not None else None
    if hint is not None:
        return f"unknown key; {hint} (or remove it)"
    return "unknown key (remove it, or check its spelling against README's job-file reference)"


def example_mapping(cls: type[BaseModel]) -> str:
    """A one-key YAML flow mapping the section accepts, e.g. `{kind: tiny-gpt}`."""
    if cls.__name__ in _EXAMPLES:
        return _EXAMPLES[cls.__name__]
    for name, f in cls.model_fields.items():
        if isinstance(f.default, str | int | float | bool) and f.default is not None:
            return f"{{{name}: {str(f.default).lower() if isinstance(f.default, bool) else f.default}}}"
    return f"{{{next(iter(cls.model_fields))}: ...}}"


def not_a_mapping(cls: type[BaseModel] | None, got: object) -> str:
    """The message for a section given a scalar or a list instead of a mapping (no internal class names)."""
    example = example_mapping(cls) if cls is not None else "{key: value}"
    if got is None:
        return f"empty; give a mapping such as {example}, or remove the line to keep the defaults"
    return f"expected a mapping such as {example}, got {got!r}"


_COUNTED = (
    # A100x8, A100*8, A100 8, A100-8, A100_8
    re.compile(r"(?P<name>[A-Za-z][A-Za-z0-9._-]*?)\s*(?P<sep>[xX×*_-]|\s)\s*(?P<n>[1-9][0-9]*)"),
    # 8xA100, 8 x A100, 8A100
    re.compile(r"(?P<n>[1-9][0-9]*)\s*(?P<sep>[xX×*_-]|\s)?\s*(?P<name>[A-Za-z][A-Za-z0-9._-]*)"),
)


def count_form(value: str, known: Iterable[str] = ()) -> str | None:
    """`value` rewritten as NAME:COUNT when it reads as a count-suffixed (or -prefixed) accelerator in
    another form ('A100x8', 'A100-8', '8xA100', 'A100 8' -> 'A100:8'), or None. A NAME in `known` is
    spelled as there; another needs an x, * or a space around a count of at most 64 (a name may end
    in -digits: tpu-v2-8, or hold an x: RTX6000)."""
    names = {k.lower(): k for k in known}
    for pattern in _COUNTED:
        m = pattern.fullmatch(value.strip())
        if m is None:
            continue
        name, n, sep = m.group("name"), m.group("n"), (m.group("sep") or "-").strip()
        if name.lower() in names:
            return f"{names[name.lower()]}:{n}"
        if sep in ("", "x", "X", "×", "*") and int(n) <= 64:
            return f"{name}:{n}"
    return None


# ---- error text that quotes user input stays short (a 1 MB value, a 10,000-item list) ----
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxdict = _REPR.maxtuple = _REPR.maxset = 4
_REPR.maxlevel = 3
_REPR.maxlong = 40
MAX_LINE = 300  # characters of one error line
MAX_LINES = 25  # lines of one error


def short_repr(value: object) -> str:
    """repr() of user input, cut to a few dozen characters (reprlib: never builds the whole repr)."""
    try:
        return _REPR.repr(value)
    except ValueError:  # an int past Python's 4300-digit repr limit
        return f"an integer of {value.bit_length() if isinstance(value, int) else '?'} bits"


def clip_message(text: str) -> str:
    """An error message of at most MAX_LINES lines of MAX_LINE characters: a long line keeps its head (the
    field) and its tail (the fix), a long list of problems its first ones."""
    lines = text.splitlines() or [""]
    more = len(lines) - MAX_LINES
    lines = [_clip_line(line) for line in lines[:MAX_LINES]]
    if more > 0:
        lines.append(f"… and {more} more")
    return "\n".join(lines)


def _clip_line(line: str) -> str:
    if len(line) <= MAX_LINE:
        return line
    head = MAX_LINE * 2 // 3
    return f"{line[:head]} … {line[-(MAX_LINE - head - 3):]}"


def _constraints(tp: object) -> list[object]:
    """The constraint objects (annotated_types' Ge, Lt, ...) inside an annotation, through Optional and Annotated."""
    out: list[object] = []
    for arg in typing.get_args(tp):
        out += arg.metadata if isinstance(arg, FieldInfo) else _constraints(arg)
    return out


def numeric_range(cls: type[BaseModel] | None, name: str) -> str | None:
    """The range a numeric field allows, as `0 <= seed < 4294967296`; None when it has no bounds."""
    if cls is None or name not in cls.model_fields:
        return None
    field = cls.model_fields[name]
    low = high = ""
    for c in [*field.metadata, *_constraints(field.annotation)]:
        for attr, side in (("ge", "<="), ("gt", "<"), ("le", "<="), ("lt", "<")):
            value = getattr(c, attr, None)
            if value is None:
                continue
            if attr in ("ge", "gt"):
                low = f"{_num(value)} {side} "
            else:
                high = f" {side} {_num(value)}"
    return f"{low}{name}{high}" if low or high else None


def _num(value: object) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e7 else f"{value:g}"
    return str(value)
