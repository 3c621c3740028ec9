"""Simulator speed (issue 14): time `rlboost simulate` runs, and check that two `--json` outputs give the
same numbers.

    # wall and CPU seconds (the command and its worker processes) of a command, median of N runs
    python benchmarks/bench_sim_speed.py time -n 3 -- rlboost simulate examples/simulate/gcp-a100.yaml \
        --hours 48 --sweep --sweep-workers 1,2,4,8,16,32,48,64 --json
    # every field of two --json outputs: numbers to 3 significant digits, text exactly (the title's
    # "replayed in N s" aside); exits 1 on a difference
    python benchmarks/bench_sim_speed.py compare before.json after.json
    # every field of every replay (all presets) of the shipped examples (2 h each) and three local jobs
    # with fixed platform timings (cores shared, torch's static batches, preemptions): run it on two
    # commits and `compare` the files (its last line counts the fields that differ at all)
    PYTHONPATH=. python benchmarks/bench_sim_speed.py replays out.json
    # CPU seconds of one replay in this process: gcp-a100, max_workers 64, rlboost-throughput, 3 h
    PYTHONPATH=. python benchmarks/bench_sim_speed.py replay-cpu -n 5

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


def _local_jobs(tmp: Path) -> dict[str, Path]:
    """Local jobs whose platform timings are given (no calibration): synthetic engines on a trace with
    preemptions; tiny-gpt (torch engines: static batches, a dispatch round trip) on 2 shared cores, and
    on 1.5 cores through the same preemptions."""
    import yaml

    drops = {"metadata": {"gap_seconds": 60}, "data": ([3] * 22 + [1] * 4) * 40}
    (tmp / "drops.json").write_text(json.dumps(drops))
    (tmp / "two.json").write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [2] * 600}))
    local = {"trace": str(tmp / "drops.json"), "time_scale": 60.0, "notice_seconds": 1.0, "notice_fraction": 0.5}
    candidates = [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.44, "on_demand_price": 3.67}]
    synthetic = {
        "name": "syn-local",
        "model": {"kind": "synthetic", "train_tokens_per_s": 1500},
        "algorithm": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 150, "steps": 12, "seed": 5},
        "trainer": {"accelerators": "A100:1", "hourly_price": 4.1},
        "rollout": {
            "engine": "synthetic",
            "engine_batch": 32,
            "max_workers": 3,
            "min_workers": 3,
            "candidates": candidates,
            "synthetic": {"lengths": {"median_tokens": 30, "sigma": 0.8, "prompt_sigma": 0.5}},
        },
        "perf": {"A100": {"tokens_per_s": 400, "seq_tokens_per_s": 25, "prefill_tokens_per_s": 50000,
                          "train_tokens_per_s": 1500, "ref_batch": 32}},
        "local": local,
        "simulate": {"boot_s": 2.0, "trainer_boot_s": 2.5, "reserved_boot_s": 3.0, "pull_s": 0.05,
                     "reserved_pull_s": 0.1, "step_overhead_s": 0.05},
    }
    tiny = {
        "name": "tiny-local",
        "model": {"kind": "tiny-gpt"},
        "algorithm": {"prompts_per_step": 32, "group_size": 8, "max_new_tokens": 12, "steps": 40, "seed": 3},
        "task": {"name": "reverse", "reward": "exact_match"},
        "trainer": {"accelerators": "A100:1", "hourly_price": 4.1},
        "rollout": {"engine": "torch", "max_workers": 2, "min_workers": 2, "candidates": candidates},
        "perf": {"A100": {"tokens_per_s": 49000, "seq_tokens_per_s": 2000, "prefill_tokens_per_s": 113000,
                          "train_tokens_per_s": 20000, "ref_batch": 64}},
        "local": {**local, "trace": str(tmp / "two.json")},
        "simulate": {"boot_s": 2.0, "pull_s": 0.013, "reserved_pull_s": 0.01, "step_overhead_s": 0.0035,
                     "warm_start_s": 0.9, "cpu_cores": 2, "dispatch_s": 0.006},
    }
    preempted = {
        **tiny,
        "name": "tiny-preempt",
        "rollout": {**tiny["rollout"], "max_workers": 3, "min_workers": 0},
        "local": local,
        "simulate": {**tiny["simulate"], "cpu_cores": 1.5},
    }
    out = {}
    for job in (synthetic, tiny, preempted):
        out[job["name"]] = tmp / f"{job['name']}.yaml"
        out[job["name"]].write_text(yaml.safe_dump(job))
    return out


def cmd_replays(args: argparse.Namespace) -> int:
    import tempfile

    from rlboost.contracts.spec import load_spec
    from rlboost.simulator import PRESETS
    from rlboost.simulator import cli as sim_cli

    jobs = {f.stem: (f, 2.0) for f in sorted(Path("examples/simulate").glob("*.yaml"))}
    out: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        jobs |= {name: (path, None) for name, path in _local_jobs(Path(tmp)).items()}
        for name, (path, hours) in jobs.items():
            t0 = time.process_time()
            replay = sim_cli.prepare(load_spec(path), None, hours=hours, calibrated=False)
            results = replay.simulate(list(PRESETS.values()))
            out[name] = [
                {"policy": r.policy.name, **{k: v for k, v in vars(r).items() if k != "policy"}} for r in results
            ]
            print(f"{name}: {len(results)} replays, {time.process_time() - t0:.1f} CPU s", file=sys.stderr)
    Path(args.out).write_text(json.dumps(out))
    return 0


def cmd_replay_cpu(args: argparse.Namespace) -> int:
    from rlboost.contracts.spec import load_spec
    from rlboost.simulator import PRESETS
    from rlboost.simulator import cli as sim_cli

    spec = load_spec(Path("examples/simulate/gcp-a100.yaml"))
    replay = sim_cli.prepare(spec, None, hours=args.hours, calibrated=False).with_max_workers(64)
    cpus = []
    for i in range(args.n):
        t0 = time.process_time()
        r = replay.simulate([PRESETS["rlboost-throughput"]])[0]
        cpus.append(time.process_time() - t0)
        print(f"run {i + 1}: {cpus[-1]:.2f} CPU s ({r.steps} steps, ${r.dollars:.2f})")
    print(f"median of {args.n}: {statistics.median(cpus):.2f} CPU s")
    return 0


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
    r = sub.add_parser("replays", help="every field of every replay of the shipped examples and local jobs")
    r.add_argument("out")
    rc = sub.add_parser("replay-cpu", help="CPU seconds of one replay in this process, median of -n")
    rc.add_argument("-n", type=int, default=5)
    rc.add_argument("--hours", type=float, default=3.0)
    args = ap.parse_args(argv)
    if args.what == "time":
        args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
        return cmd_time(args)
    return {"compare": cmd_compare, "replays": cmd_replays, "replay-cpu": cmd_replay_cpu}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
