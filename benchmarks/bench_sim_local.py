"""`rlboost simulate JOB` against `rlboost launch JOB` of a local job (default: examples/local.yaml),
each run several times, alternating: dollars and trained tokens/s (steps 2..N), medians and their ratio.

    .venv/bin/python benchmarks/bench_sim_local.py --runs 3 [--job examples/local.yaml] [--workers N] [--steps N]

(--json: the runs and medians as JSON.) --steps N overrides the job's algorithm.steps.
--workers N holds exactly N spot workers (min_workers = max_workers = N; 0: the trainer alone), to
take the job's fleet policy out of the comparison and see what each worker adds, live and simulated.

The replay calibrates this machine each time, as `rlboost simulate` does; nothing comes from the live
runs. Run it on a quiet machine: the live job's processes and the calibration share its cores.
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

from rlboost.cli.ledger import summarize
from rlboost.cli.state import StateStore
from rlboost.contracts.spec import load_spec
from rlboost.simulator import cli as sim_cli

ROOT = Path(__file__).resolve().parent.parent


def live(job: Path) -> dict:
    spec = load_spec(job)
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "RLBOOST_HOME": home}
        cmd = [sys.executable, "-m", "rlboost.cli.main", "launch", str(job)]
        subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=ROOT)
        store = StateStore(Path(home) / "state.db")
        rec = store.get_job(spec.name)
        steps = store.steps(rec.id)
        return {
            "dollars": summarize(store, rec.id).total_dollars,
            "tokens_per_s": sum(s.tokens for s in steps[1:]) / sum(s.step_s for s in steps[1:]),
            "steps": len(steps),
        }


def simulated(job: Path) -> dict:
    spec = load_spec(job)
    # exactly the live run's steps: left to bound_to_trace, a slow calibration (a busy machine) could end
    # the replay with the trace after one step, leaving no steps 2..N to compare
    replay = sim_cli.prepare(spec, None, steps=spec.algorithm.steps)
    res = next(r for r in replay.simulate(sim_cli.pick_policies(["job"], replay.spec)) if r.policy.name == "job")
    log = res.step_log[1:]
    return {
        "dollars": res.dollars,
        "tokens_per_s": sum(x["tokens"] for x in log) / sum(x["step_s"] for x in log),
        "steps": res.steps,
    }


def with_overrides(job: Path, workers: int | None, steps: int | None, out_dir: Path) -> Path:
    """The job file with exactly `workers` spot workers and `steps` steps, where given (its trace and
    other paths still resolve)."""
    raw = yaml.safe_load(job.read_text())
    if workers is not None:
        raw["rollout"].update({"min_workers": workers, "max_workers": workers})
    if steps is not None:
        raw["algorithm"]["steps"] = steps
    trace = raw.get("local", {}).get("trace")
    if trace:
        raw["local"]["trace"] = str((job.parent / trace).resolve())
    out = out_dir / job.name
    out.write_text(yaml.safe_dump(raw))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", type=Path, default=ROOT / "examples" / "local.yaml")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None, help="hold exactly N spot workers")
    ap.add_argument("--steps", type=int, default=None, help="algorithm.steps (default: the job file's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.workers is not None or args.steps is not None:
        args.job = with_overrides(args.job, args.workers, args.steps, Path(tempfile.mkdtemp()))
    runs: dict[str, list[dict]] = {"live": [], "simulated": []}
    for i in range(args.runs):
        runs["live"].append(live(args.job))
        runs["simulated"].append(simulated(args.job))
        print(f"run {i + 1}: live {runs['live'][-1]}, simulated {runs['simulated'][-1]}", file=sys.stderr)
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("dollars", "tokens_per_s")} for k, v in runs.items()}
    ratio = {m: med["simulated"][m] / med["live"][m] for m in ("dollars", "tokens_per_s")}
    if args.json:
        print(json.dumps({"runs": runs, "median": med, "sim_over_live": ratio}, indent=2))
        return
    print(f"{'':18}{'live':>12}{'simulated':>12}{'sim / live':>12}")
    for m, fmt in (("dollars", "{:,.2f}"), ("tokens_per_s", "{:,.0f}")):
        lv, sv = med["live"][m], med["simulated"][m]
        print(f"{m:18}{fmt.format(lv):>12}{fmt.format(sv):>12}{ratio[m]:>12.3f}")


if __name__ == "__main__":
    main()
