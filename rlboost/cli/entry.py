"""The `rlboost` command (pyproject's script): `--env NAME=VALUE` values leave the command line before
the CLI is even imported (argv_envs.py), then the CLI runs."""

from __future__ import annotations

from rlboost.cli.argv_envs import reexec_without_env_values


def main() -> None:
    reexec_without_env_values()
    from rlboost.cli.main import app

    app(prog_name="rlboost")
