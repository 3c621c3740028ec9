"""Reading a job file: its YAML, `--set` overrides and `launch --env` names, validation into a JobSpec,
and the saved form."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from rlboost.contracts import job_yaml
from rlboost.contracts.spec.errors import SpecError, format_validation_error, loc_text
from rlboost.contracts.spec.job import JobSpec
from rlboost.contracts.spec.paths import resolve_paths


def load_yaml(text: str) -> object:
    """Parse a job file's YAML as YAML 1.2 within rlboost/contracts/job_yaml.py's limits (a size, a depth, a
    number of values with aliases expanded): a SpecError for those and for a duplicate key; a
    yaml.YAMLError for a syntax error."""
    try:
        return job_yaml.load(text)
    except job_yaml.JobYamlError as e:
        raise SpecError(str(e)) from None


_SET_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[0-9]{1,9}\])*")  # an index: no list is longer


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """`--set key.path=value` (value read as a YAML scalar: `3`, `1e-6`, `true`, `A100:8`), applied to the
    parsed file before validation so that a bad value is blamed on its field. Lists by index:
    `rollout.candidates[0].accelerator=H100`."""
    out = copy.deepcopy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(_SET_KEY.fullmatch(p) for p in parts):
            raise SpecError(f"--set {item}: expected KEY.PATH=VALUE (e.g. --set algorithm.steps=10)")
        if len(parts) > job_yaml.MAX_DEPTH:
            raise SpecError(f"--set {key}: more than {job_yaml.MAX_DEPTH} levels deep; no job-file key is")
        try:
            value = load_yaml(text) if text.strip() else None
        except SpecError as e:  # a limit or a duplicate key; a one-line value needs no line number
            raise SpecError(f"--set {key}: {str(e).removeprefix('line 1: ')}") from None
        except yaml.YAMLError as e:
            raise SpecError(f"--set {item}: the value is not a YAML scalar ({_yaml_problem(e)})") from None
        steps: list[str | int] = []
        for p in parts:
            name, *idx = p.replace("]", "").split("[")
            steps += [name, *map(int, idx)]
        _set_path(out, steps, value, item)
    return out


def _with_env_names(raw: dict, names: list[str]) -> dict:
    """The parsed job file with each `--env` name under `envs:` as null (its value is kept apart)."""
    envs = raw.get("envs")
    if envs is None:
        envs = {}
    if not isinstance(envs, dict):
        raise SpecError("envs: must be a mapping of NAME: value (got a list or a scalar)")
    return {**raw, "envs": {**envs, **dict.fromkeys(names)}}


def _set_path(node: object, steps: list[str | int], value: object, item: str) -> None:
    for depth, step in enumerate(steps[:-1]):
        at = loc_text(tuple(steps[: depth + 1]))
        if isinstance(step, int):
            if not isinstance(node, list) or step >= len(node):
                raise SpecError(f"--set {item}: {at} is not in the job file (no such list item)")
            node = node[step]
        elif isinstance(node, dict):
            node = node.setdefault(step, {})
            if node is None:
                raise SpecError(f"--set {item}: {at} is empty in the job file")
        else:
            raise SpecError(f"--set {item}: {loc_text(tuple(steps[:depth]))} is not a mapping")
    last = steps[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise SpecError(f"--set {item}: {loc_text(tuple(steps))} is not in the job file (no such list item)")
        node[last] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise SpecError(f"--set {item}: {loc_text(tuple(steps[:-1]))} is not a mapping")


def load_spec(
    path: str | Path, overrides: list[str] | None = None, *, env_names: list[str] | None = None, on_node: bool = False
) -> JobSpec:
    """Read and validate a job file (with `--set` overrides); raise SpecError with user-facing lines.

    `env_names`: `launch --env` names, recorded under `envs:` with a null value (theirs is secret).
    `on_node`: read on the trainer node, where file_mounts' sources are not (their destinations are)."""
    p = Path(path)
    if p.is_dir():
        raise SpecError(f"{p} is a directory; pass a job YAML file")
    if not p.is_file():
        raise SpecError(f"{p}: job file not found (check the path)")
    try:
        raw = load_yaml(job_yaml.read_job_file(p))
    except (SpecError, job_yaml.JobYamlError) as e:
        raise SpecError(f"{p}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{p}: not valid YAML{where} ({_yaml_problem(e)})") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{p}: the job file must be a YAML mapping with at least `name:`")
    if overrides:
        raw = apply_overrides(raw, overrides)
    if env_names:
        raw = _with_env_names(raw, env_names)
    spec = parse_spec(raw, source=str(p) + (" with --set" if overrides else ""))
    return resolve_paths(spec, p.parent, on_node=on_node)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's problem, without the context and the source line it quotes (those can be long)."""
    problem = getattr(e, "problem", None)
    return problem if isinstance(problem, str) else str(e).splitlines()[0]


def parse_spec(raw: dict, source: str = "job") -> JobSpec:
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as e:
        raise SpecError(f"{source}: invalid job file\n{format_validation_error(e)}") from None


def spec_to_yaml(spec: JobSpec) -> str:
    """The saved job file: reads the same with load_yaml (YAML 1.2) and yaml.safe_load (YAML 1.1)."""
    return yaml.dump(spec.model_dump(mode="json"), Dumper=job_yaml.JobFileDumper, sort_keys=False)
