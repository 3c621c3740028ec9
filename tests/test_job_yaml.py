"""Job files that would hang or crash the parser, and values no real job has (issue 36): each is one
clear error naming the thing at fault, found before anything is expanded."""

from __future__ import annotations

import math
import re
import types
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from rlboost.contracts.job_yaml import MAX_BYTES, MAX_DEPTH, MAX_VALUES
from rlboost.contracts.spec import (
    JobSpec,
    SpecError,
    TaskSpec,
    apply_overrides,
    load_spec,
    load_yaml,
    parse_spec,
    spec_to_yaml,
)
from rlboost.contracts.spec_hints import MAX_LINE, numeric_range

BASE = {"name": "lim", "rollout": {"max_workers": 0}}


def billion_laughs() -> str:
    """~400 bytes that expand to 9**9 values in algorithm.steps (the composer and the constructor share
    them; pydantic and the error's repr walked them all: 100% CPU and GBs, issue 36)."""
    lines = ["name: bomb", "rollout: {max_workers: 0}", "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"{c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
    return "\n".join([*lines, "algorithm: {steps: *i}"]) + "\n"


def write(tmp_path: Path, data: str | bytes) -> Path:
    p = tmp_path / "job.yaml"
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data)
    return p


def one_error(tmp_path: Path, data: str | bytes) -> str:
    with pytest.raises(SpecError) as e:
        load_spec(write(tmp_path, data))
    return str(e.value)


# ---- limits, checked on the event stream before anything is composed ----
def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path):
    text = billion_laughs()
    assert len(text) < 1024
    msg = one_error(tmp_path, text)
    assert f"more than {MAX_VALUES:,} values with its aliases expanded" in msg and "\n" not in msg, msg


def test_aliases_within_the_limit_work_and_are_copies():
    raw = load_yaml(
        "name: al\nrollout:\n  max_workers: 1\n  candidates:\n"
        "    - {accelerator: A100, regions: &r [us-east-1, us-west-2]}\n    - {accelerator: H100, regions: *r}\n"
    )
    assert raw["rollout"]["candidates"][1]["regions"] == ["us-east-1", "us-west-2"]
    out = apply_overrides(raw, ["rollout.candidates[1].regions[0]=eu-west-1"])
    assert out["rollout"]["candidates"][0]["regions"] == ["us-east-1", "us-west-2"]  # the anchor's is untouched


@pytest.mark.parametrize(
    "value",
    [
        "[" * 10_000 + "]" * 10_000,  # PyYAML's composer recursed: RecursionError
        "{a: " * 10_000 + "1" + "}" * 10_000,
        "\n" + "".join(" " * (i + 4) + f"k{i}:\n" for i in range(MAX_DEPTH + 5)),  # block mappings
    ],
    ids=["flow-list", "flow-mapping", "block-mapping"],
)
def test_deep_nesting_is_refused(tmp_path, value):
    msg = one_error(tmp_path, f"name: deep\nalgorithm:\n  steps: {value}\n")
    assert f"nested more than {MAX_DEPTH} levels deep" in msg, msg


def test_an_alias_that_nests_too_deep_is_refused(tmp_path):
    deep = "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2)
    msg = one_error(tmp_path, f"name: deep\na: &a {deep}\nb: {{c: {{d: *a}}}}\n")
    assert f"line 3: nested more than {MAX_DEPTH} levels deep" in msg, msg


def test_a_recursive_alias_is_refused(tmp_path):
    assert "alias *a refers to a value that contains it" in one_error(tmp_path, "name: &a [*a]\n")


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path):
    msg = one_error(tmp_path, "name: big\n# " + "x" * MAX_BYTES + "\n")
    assert f"larger than {MAX_BYTES >> 10} KiB" in msg, msg


@pytest.mark.parametrize(
    "data, needle",
    [
        ("name: x\n".encode("utf-16"), "UTF-16 (little-endian), by its byte-order mark; save it as UTF-8"),
        ("name: x\n".encode("utf-16-be"), "UTF-16 (big-endian) without a byte-order mark"),
        ("name: x\n".encode("utf-32"), "UTF-32 (little-endian), by its byte-order mark"),
        (b"name: x\n\x7fELF\x02\x01\x01\x00\x00\x00", "binary (NUL bytes, the first at byte 15)"),
        ("name: x\nregion: café\n".encode("latin-1"), "line 2: not UTF-8 (byte 0xe9"),
    ],
)
def test_a_file_not_in_utf8_names_what_it_is(tmp_path, data, needle):
    msg = one_error(tmp_path, data)
    assert needle in msg and "\n" not in msg, msg


def test_a_utf8_byte_order_mark_is_fine(tmp_path):
    assert load_spec(write(tmp_path, "\ufeffname: bom\nrollout: {max_workers: 0}\n")).name == "bom"


@pytest.mark.parametrize(
    "item, needle",
    [
        ("algorithm.steps=" + "[" * 10_000 + "]" * 10_000, f"--set algorithm.steps: nested more than {MAX_DEPTH}"),
        ("envs" + ".a" * 10_000 + "=x", f"more than {MAX_DEPTH} levels deep; no job-file key is"),
        (f"rollout.candidates[{'9' * 5000}].accelerator=x", "expected KEY.PATH=VALUE"),  # int(): a ValueError
    ],
    ids=["deep-value", "deep-key", "huge-index"],
)
def test_a_deep_or_huge_set_is_refused(item, needle):
    with pytest.raises(SpecError) as e:
        apply_overrides(dict(BASE), [item])
    assert needle in str(e.value) and len(str(e.value)) <= MAX_LINE, str(e.value)[:400]


@pytest.mark.parametrize(
    "line, needle",
    [
        ("algorithm: {steps: " + "9" * 5000 + "}", "line 2: an integer of 5000 digits"),
        ("name2: !!timestamp 2001-12-14", "line 2: tag !!timestamp is not a job-file type"),
        ("name2: !!python/object/apply:os.system [ls]", "tag !!python/object/apply:os.system is not"),
        ("base: &b {steps: 3}\nalgorithm: {<<: *b}", "line 3: merge keys (<<) are YAML 1.1"),
        ("algorithm: {steps: !!int ten}", "'ten' is not a YAML 1.2 integer"),
    ],
)
def test_what_yaml_12_core_does_not_have_is_refused(tmp_path, line, needle):
    assert needle in one_error(tmp_path, f"name: tags\n{line}\n")


def test_error_text_quoting_user_input_is_capped(tmp_path):
    huge = "x" * 4_000  # 50 of them stay within the size limit
    msg = one_error(tmp_path, f"name: {huge}\nalgorithm: {{steps: [{', '.join([huge] * 50)}]}}\n")
    assert "name: 'xxx" in msg and "algorithm.steps: Input should be a valid integer" in msg
    assert all(len(line) <= MAX_LINE for line in msg.splitlines()) and len(msg) < 2000, len(msg)
    with pytest.raises(SpecError) as e:
        parse_spec({"name": "many", **{f"zz{i}": 1 for i in range(500)}})
    assert len(str(e.value).splitlines()) < 30 and str(e.value).endswith("… and 476 more"), str(e.value)[-200:]


# ---- numbers as YAML 1.2 reads them ----
@pytest.mark.parametrize(
    "text, value",
    [
        ("010", 10),  # YAML 1.1 (PyYAML): octal 8
        ("0o10", 8),
        ("0x10", 16),
        ("-7", -7),
        ("1e-6", 1e-6),
        ("1.", 1.0),
        ("1:30", "1:30"),  # YAML 1.1: sexagesimal 90
        ("1_000", "1_000"),  # YAML 1.1: 1000
        ("0b101", "0b101"),
        ("yes", "yes"),  # YAML 1.1: True
        ("off", "off"),
        ("True", True),
        ("~", None),
        ("2001-12-14", "2001-12-14"),  # YAML 1.1: a date
    ],
)
def test_scalars_resolve_as_yaml_12_core(text, value):
    assert load_yaml(f"v: {text}") == {"v": value}


@pytest.mark.parametrize(
    "steps, expected",
    [("010", 10), ("0x10", 16), ("1:30", "algorithm.steps: Input should be a valid integer (got '1:30', a str")],
)
def test_steps_as_yaml_12_reads_them(tmp_path, steps, expected):
    text = f"name: y12\nrollout: {{max_workers: 0}}\nalgorithm: {{steps: {steps}}}\n"
    if isinstance(expected, int):
        assert load_spec(write(tmp_path, text)).algorithm.steps == expected
    else:
        assert expected in one_error(tmp_path, text)


def test_chat_template_on_and_off_read_as_before():
    task = {"name": "jsonl", "path": "x.jsonl"}
    for text, mode in (("on", "on"), ("off", "off"), ("true", "on"), ("false", "off")):
        raw = load_yaml(f"chat_template: {text}")
        assert TaskSpec.model_validate({**task, **raw}).chat_template == mode


def test_a_boolean_key_given_yes_names_the_fix():
    with pytest.raises(SpecError) as e:
        parse_spec({**BASE, "rollout": {"max_workers": 0, "migration": load_yaml("v: yes")["v"]}})
    assert "rollout.migration: Input should be a valid boolean (got 'yes', a str; write true or false" in str(e.value)


def test_saved_specs_read_the_same_in_yaml_11_and_12():
    import yaml

    spec = parse_spec({**BASE, "envs": {"A": "0o10", "B": "1e5", "C": "1:30", "D": "yes", "E": "010"}})
    text = spec_to_yaml(spec)
    assert load_yaml(text)["envs"] == yaml.safe_load(text)["envs"] == spec.envs


# ---- every number has a range; no number is infinite or NaN ----
def _numeric_fields(model: type[BaseModel] = JobSpec, prefix: str = ""):
    for name, field in model.model_fields.items():
        tp = field.annotation
        is_union = typing.get_origin(tp) in (typing.Union, types.UnionType)
        args = [a for a in typing.get_args(tp) if a is not type(None)] if is_union else [tp]
        for arg in args:
            inner = typing.get_args(arg)[0] if typing.get_origin(arg) is typing.Annotated else arg
            if typing.get_origin(inner) is dict:
                inner = typing.get_args(inner)[1]
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    yield from _numeric_fields(inner, f"{prefix}{name}.X.")
            elif typing.get_origin(inner) is list:
                inner = typing.get_args(inner)[0]
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    yield from _numeric_fields(inner, f"{prefix}{name}[0].")
            elif isinstance(inner, type) and issubclass(inner, BaseModel):
                yield from _numeric_fields(inner, f"{prefix}{name}.")
            elif inner in (int, float):
                yield prefix + name, model, name, inner


NUMERIC = list(_numeric_fields())


def test_every_number_in_the_job_file_has_both_bounds():
    assert len(NUMERIC) > 60  # the walk reached the nested models
    unbounded = [path for path, model, name, _ in NUMERIC
                 if not re.fullmatch(rf"\S+ <=? {name} <=? \S+", numeric_range(model, name) or "")]
    assert not unbounded, unbounded


def _raw_with(path: str, value: object) -> dict:
    raw: dict = {"name": "num", "rollout": {"max_workers": 0}}
    node = raw
    parts = path.split(".")
    for part in parts[:-1]:
        key, _, idx = part.partition("[")
        key = {"X": "A100"}.get(key, key)
        if idx:
            node = node.setdefault(key, [{"accelerator": "A100"}])[0]
        else:
            node = node.setdefault(key, {})
    node[parts[-1]] = value
    return raw


@pytest.mark.parametrize("path", [p for p, _, _, tp in NUMERIC if tp is float])
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e308])
def test_no_float_field_takes_a_non_finite_or_absurd_number(path, bad):
    with pytest.raises(SpecError) as e:
        parse_spec(_raw_with(path, bad))
    loc = path.replace(".X.", ".A100.")
    pattern = rf"{re.escape(loc)}: \S+ is (out of range|not a finite number) \(allowed: "
    assert re.search(pattern, str(e.value)), str(e.value)


@pytest.mark.parametrize("seed", [-1, 2**32, 2**64 + 1])
def test_seed_outside_what_numpy_and_torch_take_is_refused(seed):
    with pytest.raises(SpecError) as e:
        parse_spec({**BASE, "algorithm": {"seed": seed}})
    assert f"algorithm.seed: {seed} is out of range (allowed: 0 <= seed < 4294967296)" in str(e.value)
    parse_spec({**BASE, "algorithm": {"seed": 2**32 - 1}})
