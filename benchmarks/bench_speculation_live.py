"""Live speculative decoding with tiny-gpt on the local provider: a job where generation dominates (long
responses, the trainer's own engine alone, offload `none`) with `rollout.speculative.method` group, ngram
and none, on the reverse and the add task.

    .venv/bin/python benchmarks/bench_speculation_live.py [--runs 3] [--steps 4] [--max-new-tokens 64]
    .venv/bin/python benchmarks/bench_speculation_live.py --smoke    # the smallest size, for CI

Each run is a real `rlboost launch --record-rollouts`, the methods taking turns. Per run: the median
step time (and generation time) over steps 2.. (step 1 includes the engine's start), and from
metrics.jsonl the drafted and accepted tokens and the mean tokens a response gained per forward pass
that verified a draft for it (spec_tokens_per_pass); per method: the median of the runs' step times,
and (unless --no-predict) `rlboost simulate`'s prediction of the same median step: the method's first
run's job file, `--lengths` its rollouts.jsonl (lengths and measured acceptance), calibrated here.
Prints, per task, the ratio step(none) / step(method) (> 1: speculation pays) and checks that every
method recorded the same responses as `none` (lossless; the engines run in float64). CPU-bound: the
step times mean something only on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlboost.contracts.spec import load_spec  # noqa: E402
from rlboost.simulator import PRESETS  # noqa: E402
from rlboost.simulator import cli as sim_cli  # noqa: E402
from rlboost.simulator.local_calibration import Calibration  # noqa: E402

METHODS = ("none", "group", "ngram")


def job_dict(name: str, task: str, method: str, args: argparse.Namespace) -> dict:
    # long answers: reverse a string of max_new_tokens/2.. letters; add two numbers of 8..18 digits (the
    # task's operands are int64)
    lo, hi = args.max_new_tokens // 2, min(64, args.max_new_tokens - 2)
    if task == "add":
        lo, hi = min(8, lo), min(18, hi)
    task_spec = {"name": task, "min_len": lo, "max_len": hi}
    return {
        "name": name,
        "algorithm": {
            "prompts_per_step": args.prompts,
            "group_size": args.group_size,
            "max_new_tokens": args.max_new_tokens,
            "steps": args.steps,
            "seed": 7,
            "warm_start_steps": args.warm_start_steps,
            "temperature": args.temperature,
        },
        "task": task_spec,
        "model": {"block_size": 4 * args.max_new_tokens},
        "rollout": {
            "max_workers": 0,  # the trainer's own engine: no fleet, the same engine as a worker's
            "engine_batch": args.engine_batch,
            "engine_dtype": "float64",  # bit-identical responses with and without speculation
            "offload_policy": "none",
            "speculative": {"method": method, "max_tokens": args.max_tokens},
        },
    }


def one_run(task: str, method: str, i: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-spec-") as d:
        tmp, name = Path(d), f"bs-{task}-{method}-{i}"
        home = tmp / "home"
        job = tmp / f"{name}.yaml"
        job.write_text(yaml.safe_dump(job_dict(name, task, method, args)))
        env = {**os.environ, "RLBOOST_HOME": str(home)}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        proc = subprocess.run(
            [sys.executable, "-m", "rlboost.cli.main", "launch", "--record-rollouts", str(job)],
            env=env, capture_output=True, text=True, timeout=args.timeout,
        )
        if proc.returncode != 0:
            raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        [metrics] = list(home.rglob("metrics.jsonl"))
        [rollouts] = list(home.rglob("rollouts.jsonl"))
        recorded = rollouts.read_text()
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if '"step_s"' in line]
        responses = {r["rid"]: r["tokens"] for r in (json.loads(line) for line in recorded.splitlines())}
    later = [r for r in rows if r["step"] >= 2] or rows
    drafted = sum(r["spec_drafted"] or 0 for r in rows)
    accepted = sum(r["spec_accepted"] or 0 for r in rows)
    per_pass = [r["spec_tokens_per_pass"] for r in rows if r["spec_tokens_per_pass"] is not None]
    return {
        "step_s": statistics.median(r["step_s"] for r in later),
        "gen_s": statistics.median(r["gen_s"] for r in later),
        "tokens": sum(r["tokens"] for r in rows),
        "drafted": drafted,
        "accepted": accepted,
        "tokens_per_pass": round(statistics.mean(per_pass), 3) if per_pass else None,
        "responses": responses,
        "job": job_dict(name, task, method, args),
        "rollouts": recorded,
    }


def predicted_step_s(run: dict, steps: int, cal: Calibration | None) -> tuple[float, Calibration | None]:
    """`rlboost simulate`'s median step (steps 2..) for a run's job file, with `--lengths` its recorded
    rollouts (their lengths, and the acceptance its drafts measured), calibrated on this machine once
    (`cal`, reused for the other runs of a task)."""
    with tempfile.TemporaryDirectory(prefix="bench-spec-sim-") as d:
        job, rollouts = Path(d) / "job.yaml", Path(d) / "rollouts.jsonl"
        job.write_text(yaml.safe_dump(run["job"]))
        rollouts.write_text(run["rollouts"])
        rp = sim_cli.prepare(load_spec(job), None, lengths=rollouts, steps=steps, calibrated=cal or True)
        [res] = rp.simulate([PRESETS["on-demand"]])  # the trainer's own engine alone, as the live job
    log = [x for x in res.step_log if x["step"] >= 2] or res.step_log[1:] or res.step_log  # as the live runs
    return statistics.median(x["step_s"] for x in log), rp.calibration


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=4, help="rollout.speculative.max_tokens")
    ap.add_argument("--engine-batch", type=int, default=64)
    ap.add_argument("--warm-start-steps", type=int, default=60)
    ap.add_argument("--tasks", default="reverse,add")
    ap.add_argument("--temperature", type=float, default=1.0, help="algorithm.temperature (sampling)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--smoke", action="store_true", help="the smallest size: 1 run, 2 steps, short responses, one task")
    ap.add_argument("--no-predict", action="store_true", help="skip the simulator's prediction of the ratios")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.steps, args.prompts, args.group_size, args.max_new_tokens = 1, 2, 2, 4, 16
        args.warm_start_steps = 5
        args.tasks = args.tasks.split(",")[0]  # every method and the replays: a second task adds only time
    summary: dict = {}
    for task in args.tasks.split(","):
        runs: dict[str, list[dict]] = {m: [] for m in METHODS}
        for i in range(args.runs):  # round-robin: a drift in the machine's load falls on every method alike
            for m in METHODS:
                runs[m].append(one_run(task, m, i, args))
        base = runs["none"][0]["responses"]
        for m, rs in runs.items():
            if any(r["responses"] != base for r in rs):
                raise SystemExit(f"{task}: method {m} recorded other responses than none: not lossless")
        med = {m: statistics.median(r["step_s"] for r in rs) for m, rs in runs.items()}
        pred: dict[str, float] = {}
        cal = None
        for m, rs in ([] if args.no_predict else runs.items()):  # from each method's first run
            pred[m], cal = predicted_step_s(rs[0], args.steps, cal)
        summary[task] = {}
        for m, rs in runs.items():
            r0 = rs[0]
            line = {
                "step_s": [round(r["step_s"], 3) for r in rs],
                "median_step_s": round(med[m], 3),
                "median_gen_s": round(statistics.median(r["gen_s"] for r in rs), 3),
                "speedup_vs_none": round(med["none"] / med[m], 3),
                "drafted": r0["drafted"],
                "accepted": r0["accepted"],
                "tokens_per_pass": r0["tokens_per_pass"],
            }
            if pred:
                line["simulated_step_s"] = round(pred[m], 3)
                line["simulated_speedup_vs_none"] = round(pred["none"] / pred[m], 3)
            summary[task][m] = line
            print(f"{task:>8} {m:>6}: step {line['step_s']} s, median {med[m]:.2f}s "
                  f"({line['speedup_vs_none']:.2f}x none), generation {line['median_gen_s']:.2f}s, "
                  f"drafted {r0['drafted']}, accepted {r0['accepted']}, tokens/pass {r0['tokens_per_pass']}"
                  + (f"; simulated {pred[m]:.2f}s ({line['simulated_speedup_vs_none']:.2f}x none)" if pred else ""),
                  flush=True)
    print("responses identical with and without speculation: yes")
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "results": summary}, indent=1))


if __name__ == "__main__":
    main()
