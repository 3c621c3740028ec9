"""A job's environment variables: `envs:` in the job file and `rlboost launch --env`.

Values written in the job file are plain configuration: they are saved with the job (spec.yaml,
state.db). Values given with `--env NAME` (taken from the caller's environment) or `--env NAME=VALUE`
are secrets: the saved job file records only the name (`NAME: null`), the value goes to a 0600 file
in the run directory beside the job token, reaches the nodes by the token's path (enrolment, or on
SkyPilot's trainer cluster the task's `secrets:`, which SkyPilot redacts; never boot data), and is
scrubbed from every message rlboost records. A `NAME=VALUE` leaves the command line at start-up
(argv_envs.py); a name given twice is an error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from rlboost.cli.argv_envs import moved_values
from rlboost.contracts.spec import JobSpec, SpecError, env_name_problem

SECRET_ENVS_FILE = "envs.secret.json"
# shorter values are not scrubbed from messages: they would mangle ordinary words and numbers
MIN_REDACTED_LEN = 4


def parse_env_options(items: list[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`--env NAME` (from `environ`) and `--env NAME=VALUE`, checked; name -> value. By default
    `environ` is this process's, with the values argv_envs.py moved out of its command line."""
    environ = {**os.environ, **moved_values()} if environ is None else environ
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        problem = env_name_problem(name)
        if problem:
            raise SpecError(f"--env {name}: {problem}")
        if name in out:
            raise SpecError(f"--env {name}: given more than once; pass each variable once")
        if not sep:
            if name not in environ:
                raise SpecError(
                    f"--env {name}: {name} is not set in your environment; export it first, or pass --env {name}=VALUE"
                )
            value = environ[name]
        out[name] = value
    return out


def missing_values(spec: JobSpec, secret: Mapping[str, str]) -> list[str]:
    """One line per `envs:` entry that has no value (null in the file, no `--env`)."""
    return [
        f"envs.{name}: no value (null in the job file); pass --env {name} to take it from your "
        f"environment, or --env {name}=VALUE"
        for name, value in spec.envs.items()
        if value is None and name not in secret
    ]


def write_secret_envs(run_dir: Path, values: Mapping[str, str]) -> None:
    path = run_dir / SECRET_ENVS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(dict(values), f)


def read_secret_envs(run_dir: Path) -> dict[str, str]:
    path = run_dir / SECRET_ENVS_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def split_envs(spec: JobSpec, run_dir: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(plain, secret) variables for the job's nodes. A secret value overrides the file's."""
    secret = read_secret_envs(run_dir)
    plain = {k: v for k, v in spec.envs.items() if v is not None and k not in secret}
    return plain, {k: v for k, v in secret.items() if k in spec.envs}


class Redactor:
    """Scrubs secret values out of text before rlboost records or prints it."""

    def __init__(self, secret: Mapping[str, str]) -> None:
        # longest first, so a value that contains another is replaced whole
        self.pairs = sorted(
            ((v, f"<{k} redacted>") for k, v in secret.items() if len(v) >= MIN_REDACTED_LEN),
            key=lambda p: -len(p[0]),
        )

    def __call__(self, text: str | None) -> str | None:
        if not text:
            return text
        for value, mark in self.pairs:
            text = text.replace(value, mark)
        return text
