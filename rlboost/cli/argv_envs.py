"""`rlboost launch --env NAME=VALUE`: the value leaves the process's command line at once.

A command line is world-readable (`ps`, /proc/PID/cmdline) for as long as the process lives, and an
attached `launch` is the job's controller for the whole job. So at start-up, before anything else,
the CLI runs itself again (same pid, exec) with `--env NAME` in place of each `--env NAME=VALUE` and
the values in one variable of the new process's environment, which only the same user (and root)
can read; parse_env_options (job_envs.py) takes them from there, and the variable is dropped from
os.environ, so no process the CLI starts inherits it. Imports nothing heavy: it runs before the CLI.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

from rlboost.contracts.env_names import Env

# the `--env NAME=VALUE` values moved out of argv (into Env.ENV_FROM_ARGV, as JSON {name: value})
_moved: dict[str, str] = {}


def moved_values() -> dict[str, str]:
    """The values this process's command line had (empty unless it was run again without them)."""
    return dict(_moved)


def without_values(args: list[str]) -> tuple[list[str], dict[str, str]] | None:
    """`args` (after the program) of a `launch` with every `--env NAME=VALUE` (or `--env=NAME=VALUE`)
    as `--env NAME`, and the values; None when there is nothing to move, or when a name is given
    twice (left as it is, so the CLI names the duplicate)."""
    command = next((a for a in args if not a.startswith("-")), None)
    if command != "launch":
        return None
    out: list[str] = []
    moved: dict[str, str] = {}
    names: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--env" and i + 1 < len(args):
            item, i = args[i + 1], i + 2
        elif a.startswith("--env="):
            item, i = a[len("--env=") :], i + 1
        else:
            out.append(a)
            i += 1
            continue
        name, sep, value = item.partition("=")
        names.append(name)
        if sep:
            moved[name] = value
        out += ["--env", name]
    if not moved or len(set(names)) != len(names):
        return None
    return out, moved


def reexec_without_env_values() -> None:
    """Called first thing by the `rlboost` entry points: run again without `--env` values in argv,
    or (in the process run again) take the values from the environment."""
    if Env.ENV_FROM_ARGV in os.environ:
        with contextlib.suppress(ValueError):  # not ours: `--env NAME` then reads the real environment
            _moved.update(json.loads(os.environ.pop(Env.ENV_FROM_ARGV)))
        return
    found = without_values(sys.argv[1:])
    if found is None:
        return
    args, moved = found
    # what ran this interpreter before the CLI's own arguments: `-m rlboost.cli.main`, or the script
    orig = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    prefix = orig[: len(orig) - len(sys.argv) + 1]
    env = {**os.environ, Env.ENV_FROM_ARGV: json.dumps(moved)}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [*prefix, *args], env)
    except OSError as e:  # the values stay visible in `ps`; the launch goes on
        print(f"warning: could not take the --env values out of the command line ({e})", file=sys.stderr)
