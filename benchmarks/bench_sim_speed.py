"""Simulator speed (issue 14): time `rlboost simulate` runs, and check that two `--json` outputs give the
same numbers.

    # wall and CPU seconds (the command and its worker processes) of a command, median of N runs
    python benchmarks/bench_sim_speed.py time -n 3 -- rlboost simulate examples/simulate/gcp-a100.yaml \
        --hours 48 --sweep --sweep-workers 1,2,4,8,16,32,48,64 --json
    # every field of two --json outputs: numbers to 3 significant digits, text exactly (the title's
    # "replayed in N s" aside); exits 1 on a difference
    python benchmarks/bench_sim_speed.py compare before.json after.json

CPU seconds are the fairer figure on a shared machine: wall time moves with whatever else runs.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TIMING = re.compile(r"replayed in [0-9.]+s")


def run_timed(cmd: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run; CPU = user + system of the command and everything it waited on."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def same_to(a: float, b: float, digits: int) -> bool:
    return f"{a:.{digits}g}" == f"{b:.{digits}g}"


def differences(a: Any, b: Any, digits: int, where: str = "") -> list[str]:
    """Where two JSON values differ (numbers beyond `digits` significant digits, anything else at all)."""
    num = (int, float)
    if isinstance(a, num) and isinstance(b, num) and not isinstance(a, bool) and not isinstance(b, bool):
        return [] if same_to(a, b, digits) else [f"{where}: {a!r} != {b!r}"]
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}.{k}: only in one" for k in sorted(set(a) ^ set(b))]
        for k in a.keys() & b.keys():
            out += differences(a[k], b[k], digits, f"{where}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, digits, f"{where}[{i}]")]
    if isinstance(a, str) and isinstance(b, str):
        a, b = TIMING.sub("replayed in _s", a), TIMING.sub("replayed in _s", b)
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def count_numbers(x: Any) -> int:
    if isinstance(x, dict):
        return sum(count_numbers(v) for v in x.values())
    if isinstance(x, list):
        return sum(count_numbers(v) for v in x)
    return int(isinstance(x, (int, float)) and not isinstance(x, bool))


def cmd_time(args: argparse.Namespace) -> int:
    runs = [run_timed(args.command) for _ in range(args.n)]
    for i, (w, c) in enumerate(runs, 1):
        print(f"run {i}: wall {w:.1f} s, CPU {c:.1f} s")
    walls, cpus = zip(*runs)
    print(f"median of {args.n}: wall {statistics.median(walls):.1f} s, CPU {statistics.median(cpus):.1f} s")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    a, b = (json.loads(Path(p).read_text()) for p in (args.before, args.after))
    diffs = differences(a, b, args.digits)
    exact = differences(a, b, 17)
    for d in diffs[:50]:
        print(d)
    print(
        f"{args.before} vs {args.after}: {count_numbers(a)} numbers, {len(diffs)} differ at {args.digits} "
        f"significant digits, {len(exact)} fields differ at all"
    )
    return 1 if diffs else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("time", help="wall and CPU seconds of a command, median of -n runs")
    t.add_argument("-n", type=int, default=3)
    t.add_argument("command", nargs=argparse.REMAINDER)
    c = sub.add_parser("compare", help="two --json outputs, numbers to --digits significant digits")
    c.add_argument("before")
    c.add_argument("after")
    c.add_argument("--digits", type=int, default=3)
    args = ap.parse_args(argv)
    if args.what == "time":
        args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
        return cmd_time(args)
    return cmd_compare(args)


if __name__ == "__main__":
    sys.exit(main())
