"""The job file's YAML reader (rlboost/contracts/spec/loading.py's load_yaml): YAML 1.2's core schema, with limits
checked before anything is built.

A job file is small and shallow; YAML is neither by nature. A "billion laughs" file (1 KB of aliases
that expands to a billion values), a 10,000-deep flow list (PyYAML's composer recurses: a
RecursionError), a file of megabytes, a binary or UTF-16 file: each is refused with one line. The
limits are checked on the parser's event stream (an iterative parser; nothing is composed or expanded)
before PyYAML composes a single node.

Plain scalars resolve as YAML 1.2's core schema, not as PyYAML's YAML 1.1: `010` is 10, `0o10` 8,
`0x10` 16, `1e-6` a float; `1:30`, `1_000`, `yes`/`no`/`on`/`off` and dates are strings. Imports
nothing of ours.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import yaml
from yaml.constructor import ConstructorError

MAX_BYTES = 256 << 10  # a real job file is a few KB; PyYAML parses this much in well under a second
MAX_DEPTH = 32  # a real job file nests 5 deep (rollout.candidates[i].regions[j])
MAX_VALUES = 10_000  # scalars + collections, aliases expanded; a real job file has a few hundred
MAX_DIGITS = 40  # an integer's digits: no job-file number has more (Python refuses > 4300 with a ValueError)

_CORE = "tag:yaml.org,2002:"
_CORE_TAGS = {None, "!", *(_CORE + t for t in ("str", "int", "float", "bool", "null", "seq", "map"))}
_INT = re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+")
_FLOAT = re.compile(
    r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
)
_BOMS = (  # UTF-32 first: its little-endian mark starts with UTF-16's
    (b"\xff\xfe\x00\x00", "UTF-32 (little-endian)"),
    (b"\x00\x00\xfe\xff", "UTF-32 (big-endian)"),
    (b"\xff\xfe", "UTF-16 (little-endian)"),
    (b"\xfe\xff", "UTF-16 (big-endian)"),
)
_UTF8_BOM = b"\xef\xbb\xbf"


class JobYamlError(ValueError):
    """A job file the reader refuses, phrased for the user (`line N: ...` where a line is known)."""


def read_job_file(path: Path) -> str:
    """The job file's text: at most MAX_BYTES of UTF-8 (JobYamlError names the size or the encoding)."""
    with path.open("rb") as f:
        data = f.read(MAX_BYTES + 1)  # a huge file (or /dev/zero) is never read whole
    if len(data) > MAX_BYTES:
        raise JobYamlError(f"larger than {MAX_BYTES >> 10} KiB; a job file is a few KB (is this the right file?)")
    return decode_job_bytes(data)


def decode_job_bytes(data: bytes) -> str:
    """UTF-8 text (a UTF-8 byte-order mark is allowed); anything else is a JobYamlError naming what it found."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise JobYamlError(f"the file is {name}, by its byte-order mark; save it as UTF-8")
    data = data.removeprefix(_UTF8_BOM)
    if b"\0" in data:
        raise JobYamlError(f"not a text file: {_nul_kind(data)}; a job file is YAML text in UTF-8")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise JobYamlError(
            f"line {line}: not UTF-8 (byte 0x{data[e.start]:02x}; Latin-1 or Windows-1252?); save the file as UTF-8"
        ) from None


def _nul_kind(data: bytes) -> str:
    """What NUL bytes in a file suggest: UTF-16 text without a byte-order mark (every other byte NUL), or binary."""
    head = data[: min(len(data), 200) // 2 * 2]
    for name, zeros, chars in (("little", head[1::2], head[0::2]), ("big", head[0::2], head[1::2])):
        if zeros and not zeros.strip(b"\0") and all(32 <= c < 127 or c in b"\t\r\n" for c in chars):
            return f"UTF-16 ({name}-endian) without a byte-order mark"
    first = data.index(b"\0")
    return f"binary (NUL bytes, the first at byte {first})"


def check_limits(text: str) -> None:
    """Refuse text over the size, depth or expanded-size limits (JobYamlError), and tags outside YAML 1.2's
    core schema, from the event stream alone. A syntax error is PyYAML's (yaml.YAMLError)."""
    if len(text) > MAX_BYTES:
        raise JobYamlError(f"larger than {MAX_BYTES >> 10} KiB; a job file is a few KB")
    values = 0  # values so far, each alias counted as the values it stands for
    # per open collection: [values at its start, the deepest level reached below it, its anchor]
    open_: list[list] = []
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (values, levels) of its node

    def add(n: int, levels: int, event: yaml.Event) -> None:
        nonlocal values
        values += n
        deepest = len(open_) + levels
        if values > MAX_VALUES:
            why = "with its aliases expanded " if isinstance(event, yaml.AliasEvent) else ""
            raise JobYamlError(
                f"line {_line(event)}: the file holds more than {MAX_VALUES:,} values {why}(a real job file has a "
                "few hundred; an alias bomb?)"
            )
        if deepest > MAX_DEPTH:
            raise JobYamlError(
                f"line {_line(event)}: nested more than {MAX_DEPTH} levels deep (a real job file nests 5); "
                "flatten it"
            )
        if open_:
            open_[-1][1] = max(open_[-1][1], deepest)

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            if any(frame[2] == event.anchor for frame in open_):
                raise JobYamlError(f"line {_line(event)}: alias *{event.anchor} refers to a value that contains it")
            n, levels = anchors.get(event.anchor, (1, 0))  # an undefined one: the composer says so
            add(n, levels, event)
        elif isinstance(event, yaml.ScalarEvent | yaml.CollectionStartEvent):
            if event.tag not in _CORE_TAGS:
                shown = event.tag.replace(_CORE, "!!")
                raise JobYamlError(
                    f"line {_line(event)}: tag {shown} is not a job-file type (YAML 1.2 core: !!str, !!int, "
                    "!!float, !!bool, !!null, !!seq, !!map)"
                )
            if isinstance(event, yaml.ScalarEvent):
                add(1, 0, event)
                if event.anchor is not None:
                    anchors[event.anchor] = (1, 0)
            else:
                add(1, 1, event)
                open_.append([values - 1, len(open_) + 1, event.anchor])
        elif isinstance(event, yaml.CollectionEndEvent):
            start, deepest, anchor = open_.pop()
            if anchor is not None:
                anchors[anchor] = (values - start, deepest - len(open_))
            if open_:
                open_[-1][1] = max(open_[-1][1], deepest)
        elif isinstance(event, yaml.DocumentStartEvent):
            anchors.clear()  # anchors are per document (the composer refuses a second one anyway)


def _line(event: yaml.Event) -> int:
    return event.start_mark.line + 1


class JobFileLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2's core schema for plain scalars, that refuses duplicate keys (YAML silently
    keeps the last one) and YAML 1.1's merge keys (`<<: *base`, which YAML 1.2 has not)."""

    yaml_implicit_resolvers: dict = {}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == "<<" and key_node.style is None:
                raise JobYamlError(f"line {line}: merge keys (<<) are YAML 1.1, not 1.2; write the keys out")
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str | int | float | bool | None):
                continue  # an unhashable key: SafeLoader's own error says so
            if key in seen:
                raise JobYamlError(
                    f"line {line}: duplicate key {_short(key)} (first at line {seen[key]}); keep one of them"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        text = self.construct_scalar(node)
        if not _INT.fullmatch(text):
            raise ConstructorError(None, None, f"{_short(text)} is not a YAML 1.2 integer", node.start_mark)
        if len(text) > MAX_DIGITS:
            raise JobYamlError(
                f"line {node.start_mark.line + 1}: an integer of {len(text)} digits; no job-file number is that large"
            )
        base = {"0o": 8, "0x": 16}.get(text[:2], 10)
        return int(text[2:] if base != 10 else text, base)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        text = self.construct_scalar(node)
        if not _FLOAT.fullmatch(text):
            raise ConstructorError(None, None, f"{_short(text)} is not a YAML 1.2 float", node.start_mark)
        low = text.lower()
        if low.endswith((".inf", ".nan")):  # the job spec refuses them; kept as YAML reads them
            return math.nan if low.endswith("nan") else (-math.inf if low.startswith("-") else math.inf)
        return float(text)

    def construct_yaml_bool(self, node: yaml.ScalarNode) -> bool:
        text = self.construct_scalar(node)
        if text.lower() not in ("true", "false"):
            raise ConstructorError(None, None, f"{_short(text)} is not a YAML 1.2 boolean", node.start_mark)
        return text.lower() == "true"


# int before float: `10` matches both
for _tag, _pattern, _first in (
    ("bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
    ("null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
    ("int", _INT.pattern, "-+0123456789"),
    ("float", _FLOAT.pattern, "-+0123456789."),
):
    JobFileLoader.add_implicit_resolver(_CORE + _tag, re.compile(f"^(?:{_pattern})$"), list(_first))
JobFileLoader.add_constructor(_CORE + "int", JobFileLoader.construct_yaml_int)
JobFileLoader.add_constructor(_CORE + "float", JobFileLoader.construct_yaml_float)
JobFileLoader.add_constructor(_CORE + "bool", JobFileLoader.construct_yaml_bool)


class JobFileDumper(yaml.SafeDumper):
    """SafeDumper that also quotes the strings YAML 1.2 reads as numbers (`0o10`, `1e5`), so that a saved
    job file reads the same with JobFileLoader and with yaml.safe_load (YAML 1.1)."""


JobFileDumper.add_implicit_resolver(_CORE + "int", re.compile(f"^(?:{_INT.pattern})$"), list("-+0123456789"))
JobFileDumper.add_implicit_resolver(_CORE + "float", re.compile(f"^(?:{_FLOAT.pattern})$"), list("-+0123456789."))


def load(text: str) -> object:
    """Parse a job file's YAML within the limits. JobYamlError for a limit, a duplicate or merge key;
    yaml.YAMLError for a syntax error. An alias is a copy of its anchor's value (a change to one, by
    `--set`, does not reach the other)."""
    check_limits(text)
    return _copied(yaml.load(text, Loader=JobFileLoader))  # a SafeLoader subclass: no arbitrary objects


def _copied(value: object) -> object:
    # depth and size are within the limits checked above
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copied(v) for v in value]
    return value


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
