"""What the job file's text must be to reach a path, a command line or a process's environment on a
node: no NUL byte anywhere (the kernel ends every path, argument and variable at one), environment
values and `setup:` within what execve takes, region names plain labels."""

from __future__ import annotations

import re

# Linux takes at most MAX_ARG_STRLEN (128 KiB) per argument or NAME=value string and about 2 MiB of
# arguments and environment together (ARG_MAX: a quarter of the stack limit); rlboost's own variables
# and the command line share that, so a job's variables stay well below it.
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_ENVS_BYTES = 128 * 1024
# `setup:` reaches every node as RLBOOST_SETUP_B64 (base64: 4/3 of it), one variable of MAX_ARG_STRLEN
MAX_SETUP_BYTES = 64 * 1024
# a region or zone as clouds write them (us-east-1, us-east-1a, us-central1-a) and as a worker's hello
# carries it (rlboost/contracts/protocol.py): no '/', no leading '.', nothing a path could climb with
REGION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def nul_problem(raw: object, at: str = "") -> str | None:
    """The first place (`task.path`, `envs key 'A\\x00'`) of a NUL byte in the parsed job file, or None."""
    if isinstance(raw, str):
        return (
            f"{at or '(top level)'}: holds a NUL byte (\\x00), which no path, command or environment "
            "variable can carry; remove it"
            if "\0" in raw
            else None
        )
    if isinstance(raw, dict):
        for key, value in raw.items():
            where = f"{at}.{key}" if at else str(key)
            if isinstance(key, str) and "\0" in key:
                parent = at or "(top level)"
                return (
                    f"{parent}: the key {key!r} holds a NUL byte (\\x00), which no path or environment "
                    "variable can carry; remove it"
                )
            found = nul_problem(value, where)
            if found:
                return found
    if isinstance(raw, list):
        for i, value in enumerate(raw):
            found = nul_problem(value, f"{at}[{i}]")
            if found:
                return found
    return None


def env_size_problem(envs: dict[str, str | None]) -> str | None:
    """Why the job's `envs:` values cannot start a process (too long, each or all together), or None."""
    total = 0
    for name, value in envs.items():
        size = len(value.encode("utf-8", "surrogatepass")) if value else 0
        if size > MAX_ENV_VALUE_BYTES:
            return (
                f"envs.{name}: its value is {size:,} bytes, over the {MAX_ENV_VALUE_BYTES:,} an environment "
                "variable may hold here (a node's exec fails with 'Argument list too long'); put the value in "
                "a file (file_mounts) and pass its path"
            )
        total += len(name) + 1 + size
    if total > MAX_ENVS_BYTES:
        return (
            f"envs: {total:,} bytes of variables in all, over {MAX_ENVS_BYTES:,}; put long values in files "
            "(file_mounts) and pass their paths"
        )
    return None


def setup_size_problem(setup: str) -> str | None:
    size = len(setup.encode("utf-8", "surrogatepass"))
    if size <= MAX_SETUP_BYTES:
        return None
    return (
        f"{size:,} bytes, over {MAX_SETUP_BYTES:,} (it reaches every node in one environment variable); "
        "put the commands in a script (in the workdir or a file mount) and run that from setup"
    )


def region_problem(value: str) -> str | None:
    if REGION_RE.fullmatch(value):
        return None
    return (
        f"{value!r} is not a region or zone name (letters, digits, '.', '_', '-', starting with a letter "
        "or digit, at most 64; e.g. us-east-1, us-central1-a)"
    )
