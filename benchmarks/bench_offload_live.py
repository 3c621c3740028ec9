"""Live offload benefit with tiny-gpt on the local provider: a job where generation dominates (long
responses, 2 spot workers, constant capacity) with the adaptive offload on (`predictive`: the
trainer's engine hands its tail to the spot workers and the trainer trains finished groups meanwhile)
and off (`none`: the trainer's engine generates until the step's last response, then it trains).

    .venv/bin/python benchmarks/bench_offload_live.py [--runs 3] [--steps 6] [--max-new-tokens 64]
    .venv/bin/python benchmarks/bench_offload_live.py --smoke   # the smallest job: checks it runs

Each run is a real `rlboost launch` (trainer, reserved engine and workers as local processes). The
fleet is fixed (min_workers = max_workers = --workers: on a machine with fewer free cores the fleet
would otherwise hold one worker per core the trainer leaves free). Every step starts only once all
workers and the reserved engine hold its weights (RLBOOST_WAIT_ENGINES), so boot time is not
measured; a step that started without them fails the run. Per run: the median step time over steps
2.. (step 1 runs on the offload policy's prior for the training rate; from step 2 on, on the measured
rate); per policy: the median of the runs, which alternate between the policies. Prints both and the
ratio none / predictive (> 1: the offload pays). CPU-bound: the numbers mean something only on an
otherwise idle machine.

The simulator's prediction of the same ratio, for the same job files: before the live runs, one
process on this machine measures tiny-gpt's component rates (decode tokens/s of one sequence and of a
full engine batch, prefill tokens/s, GRPO training tokens/s, the optimizer step) and writes them into
the job file's `perf:` and `simulate:` sections, which the live runs use as their priors too. After
them, `rlboost simulate` replays both job files with 2 constant workers and the response lengths the
live runs recorded (`--lengths`); as for any local tiny-gpt job it measures the rest of the platform
itself (the cores the processes share, the torch engine's dispatch round trip, the trainer's serving
cost; the job file's values stand). Nothing is fitted to the live step times.
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

from rlboost.cli.state import StateStore  # noqa: E402
from rlboost.contracts.spec import JobSpec, load_spec  # noqa: E402

ACCELERATOR = "cpu"  # the local job's engines and trainer, priced and modelled as one CPU "accelerator"


def job_dict(name: str, policy: str, args: argparse.Namespace, calibration: dict | None = None) -> dict:
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
        "task": {"name": "reverse", "min_len": args.max_new_tokens // 2, "max_len": min(64, args.max_new_tokens - 1)},
        "trainer": {"hourly_price": 10.0, "accelerators": ACCELERATOR},
        "model": {"block_size": 4 * args.max_new_tokens, "n_layer": args.n_layer, "n_embd": args.n_embd},
        "rollout": {
            # a fixed fleet: on a machine with fewer free cores than workers the fleet would hold fewer
            # (one per core the trainer leaves free) and every step would wait for the missing ones
            "min_workers": args.workers,
            "max_workers": args.workers,
            "engine_batch": args.engine_batch,
            "offload_policy": policy,
            "candidates": [
                {"accelerator": ACCELERATOR, "clouds": ["local"], "spot_price": 1.5, "on_demand_price": 3.5}
            ],
        },
        "local": {"trace": "trace.json", "time_scale": 1.0, "notice_seconds": 0.5, "notice_fraction": 0.5},
    }
    if calibration:
        job.update(calibration)
    return job


def write_job(tmp: Path, job: dict) -> Path:
    (tmp / "trace.json").write_text(
        json.dumps({"metadata": {"gap_seconds": 1}, "data": [job["rollout"]["max_workers"]] * 86400})
    )
    path = tmp / f"{job['name']}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def calibrate(args: argparse.Namespace) -> dict:
    """This machine's single-process rates for the benchmark's model (`rlboost simulate`'s own local
    calibration), as the job file's `perf` and `simulate` sections (what the simulator needs; the live
    trainer's priors)."""
    from rlboost.simulator.local_calibration import calibrate as measure

    cal = measure(JobSpec.model_validate(job_dict("calibrate", "none", args)), measure_start=False)
    return {
        "perf": {
            ACCELERATOR: {
                "seq_tokens_per_s": cal.seq_tokens_per_s,
                "tokens_per_s": cal.tokens_per_s,
                "prefill_tokens_per_s": cal.prefill_tokens_per_s,
                "train_tokens_per_s": cal.train_tokens_per_s,
                "ref_batch": cal.ref_batch,
            }
        },
        "simulate": {"boot_s": 0.0, "pull_s": 0.05, "reserved_pull_s": 0.0, "step_overhead_s": cal.step_overhead_s},
    }


def one_run(policy: str, i: int, args: argparse.Namespace, calibration: dict, lengths: Path) -> dict:
    """One live `rlboost launch`; appends the response lengths it recorded to `lengths`."""
    with tempfile.TemporaryDirectory(prefix="bench-offload-") as d:
        tmp = Path(d)
        home = tmp / "home"
        name = f"bo-{policy}-{i}"
        env = {
            **os.environ,
            "RLBOOST_HOME": str(home),
            "RLBOOST_WAIT_ENGINES": str(args.workers),
            "RLBOOST_WAIT_ENGINES_S": str(args.wait_engines_s),
        }
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        job = write_job(tmp, job_dict(name, policy, args, calibration))
        proc = subprocess.run(
            [sys.executable, "-m", "rlboost.cli.main", "launch", "--record-rollouts", str(job)],
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
        short = [s.step for s in steps if (s.spot_workers or 0) < args.workers]
        if short:  # a step that gave up waiting for its workers measures another job
            raise SystemExit(f"{name}: steps {short} started with fewer than {args.workers} spot workers")
        with lengths.open("a") as out:
            for rec in home.rglob("rollouts.jsonl"):
                out.write(rec.read_text())
    return {
        "step_s": median_step(s.step_s for s in steps if s.step >= 2),  # the store counts steps from 1
        "offloaded_steps": sum(1 for s in steps if s.offload_s is not None),
        "tail_train_s": round(sum(s.tail_train_s or 0.0 for s in steps), 3),
        "idle_s": round(sum(s.trainer_idle_s or 0.0 for s in steps), 3),
    }


def median_step(seconds) -> float:
    """Steps 2..: step 1 runs on the offload policy's prior for the training rate."""
    xs = list(seconds)
    if not xs:
        raise SystemExit("need --steps >= 2")
    return statistics.median(xs)


def predict(policy: str, args: argparse.Namespace, calibration: dict, lengths: Path) -> float:
    """The simulator's median step time (steps 2..) for the same job file."""
    from rlboost.simulator import cli as sim

    with tempfile.TemporaryDirectory(prefix="bench-offload-sim-") as d:
        spec = load_spec(write_job(Path(d), job_dict(f"bo-{policy}", policy, args, calibration)))
        _, results = sim.run(spec, None, ["job"], lengths=lengths, steps=args.steps, constant_workers=args.workers)
    (job,) = [r for r in results if r.policy.name == "job"]
    return median_step(s["step_s"] for s in job.step_log if s["step"] >= 1)  # the replay counts from 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--engine-batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--warm-start-steps", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--wait-engines-s", type=float, default=120, help="a step's wait for all workers before failing")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="the smallest job, one run each (the CI smoke tier)")
    args = ap.parse_args()
    if args.smoke:  # every part runs (calibration, both policies, the replays); the figures mean nothing
        args.runs, args.steps, args.prompts, args.group_size, args.max_new_tokens = 1, 2, 4, 2, 8
        args.n_layer, args.n_embd, args.engine_batch, args.warm_start_steps = 1, 32, 4, 2
    calibration = calibrate(args)
    print(f"calibration (one process, this machine): {json.dumps(calibration)}", flush=True)
    results: dict[str, list[dict]] = {"predictive": [], "none": []}
    with tempfile.TemporaryDirectory(prefix="bench-offload-lengths-") as d:
        lengths = Path(d) / "rollouts.jsonl"
        for i in range(args.runs):
            for policy in results:  # alternating: load from elsewhere on the shared cores hits both alike
                r = one_run(policy, i, args, calibration, lengths)
                results[policy].append(r)
                print(
                    f"{policy:>10} run {i + 1}: median step {r['step_s']:.2f}s, {r['offloaded_steps']} offloaded, "
                    f"trained {r['tail_train_s']:.2f}s during tails, idle {r['idle_s']:.2f}s",
                    flush=True,
                )
        predicted = {p: predict(p, args, calibration, lengths) for p in results}
    med = {p: statistics.median(r["step_s"] for r in rs) for p, rs in results.items()}
    print(
        f"live, median step time: offload {med['predictive']:.2f}s, no offload {med['none']:.2f}s, "
        f"ratio none/offload {med['none'] / med['predictive']:.2f}"
    )
    print(
        f"simulated, median step time: offload {predicted['predictive']:.2f}s, no offload {predicted['none']:.2f}s, "
        f"ratio none/offload {predicted['none'] / predicted['predictive']:.2f}"
    )
    if args.out:
        summary = {"live": med, "simulated": predicted, "calibration": calibration}
        args.out.write_text(
            json.dumps({"args": vars(args) | {"out": str(args.out)}, "runs": results} | summary, indent=2)
        )


if __name__ == "__main__":
    main()
