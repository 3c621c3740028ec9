"""Live offload benefit with tiny-gpt on the local provider: a job where generation dominates (long
responses, 2 spot workers, constant capacity) with the adaptive offload on (`predictive`: the
trainer's engine hands its tail to the spot workers and the trainer trains finished groups meanwhile)
and off (`none`: the trainer's engine generates until the step's last response, then it trains).

    .venv/bin/python benchmarks/bench_offload_live.py [--runs 3] [--steps 6] [--max-new-tokens 48]

Each run is a real `rlboost launch` (trainer, reserved engine and workers as local processes). Every
step starts only once both workers and the reserved engine hold its weights (RLBOOST_WAIT_ENGINES),
so boot time is not measured. Per run: the median step time over steps 2.. (step 1 runs on the offload
policy's prior for the training rate; from step 2 on, on the measured rate); per policy: the median
of the runs. Prints both and the ratio none / predictive (> 1: the offload pays). CPU-bound: the
numbers mean something only on an otherwise idle machine.
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

from rlboost_cli.state import StateStore  # noqa: E402


def job_file(tmp: Path, name: str, policy: str, args: argparse.Namespace) -> Path:
    (tmp / "trace.json").write_text(json.dumps({"metadata": {"gap_seconds": 1}, "data": [args.workers] * 86400}))
    job = {
        "name": name,
        "algorithm": {
            "prompts_per_step": args.prompts,
            "group_size": args.group_size,
            "max_new_tokens": args.max_new_tokens,
            "steps": args.steps,
            "seed": 7,
            "warm_start_steps": args.warm_start_steps,
        },
        # long answers: generation dominates the step
        "task": {"name": "reverse", "min_len": args.max_new_tokens // 2, "max_len": args.max_new_tokens - 1},
        "trainer": {"hourly_price": 10.0},
        "model": {"block_size": 4 * args.max_new_tokens},
        "rollout": {
            "max_workers": args.workers,
            "engine_batch": args.engine_batch,
            "offload_policy": policy,
            "candidates": [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.5, "on_demand_price": 3.5}],
        },
        "local": {"trace": "trace.json", "time_scale": 1.0, "notice_seconds": 0.5, "notice_fraction": 0.5},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def one_run(policy: str, i: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-offload-") as d:
        tmp = Path(d)
        home = tmp / "home"
        name = f"bo-{policy}-{i}"
        env = {**os.environ, "RLBOOST_HOME": str(home), "RLBOOST_WAIT_ENGINES": str(args.workers)}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        proc = subprocess.run(
            [sys.executable, "-m", "rlboost_cli.main", "launch", str(job_file(tmp, name, policy, args))],
            env=env,
            capture_output=True,
            text=True,
            timeout=args.timeout,
        )
        if proc.returncode != 0:
            raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        store = StateStore(home / "state.db")
        steps = store.steps(store.get_job(name).id)
        store.close()
    later = [s for s in steps if s.step >= 1] or steps
    return {
        "step_s": statistics.median(s.seconds for s in later),
        "offloaded_steps": sum(1 for s in steps if s.offload_s is not None),
        "tail_train_s": round(sum(s.tail_train_s or 0.0 for s in steps), 3),
        "idle_s": round(sum(s.idle_s or 0.0 for s in steps), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--engine-batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--warm-start-steps", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    results: dict[str, list[dict]] = {}
    for policy in ("predictive", "none"):
        results[policy] = []
        for i in range(args.runs):
            r = one_run(policy, i, args)
            results[policy].append(r)
            print(f"{policy:>10} run {i + 1}: median step {r['step_s']:.2f}s, {r['offloaded_steps']} offloaded, "
                  f"trained {r['tail_train_s']:.2f}s during tails, idle {r['idle_s']:.2f}s", flush=True)
    med = {p: statistics.median(r["step_s"] for r in rs) for p, rs in results.items()}
    print(f"median step time: offload {med['predictive']:.2f}s, no offload {med['none']:.2f}s, "
          f"ratio none/offload {med['none'] / med['predictive']:.2f}")
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "runs": results, "median": med},
                                       indent=2))


if __name__ == "__main__":
    main()
