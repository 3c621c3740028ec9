"""Sibling-aware scheduling (rollout.sibling_scheduling) on the paper's setting, at 1-4 constant spot workers.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_siblings.py [--job FILE ...] [--steps 12] [--workers 1 2 3 4]

For each job file (default: examples/simulate/paper-h100.yaml and the held-out
benchmarks/variants/paper-h100-heavy.yaml) it replays `on-demand` (rlboost's trainer alone) and `sync`
(a synchronous colocated step) once, and `rlboost` at each worker count with the job's
`sibling_scheduling` off and on (the same replay otherwise: `rlboost simulate` of the job file with the
key set), and prints a markdown table: tokens/s, throughput and tokens/$ against `sync` and
`on-demand`, and on ÷ off.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlboost.contracts.spec import JobSpec, load_spec
from rlboost.providers.pricing import spot_offers, trainer_offer
from rlboost.providers.spot_market import constant_trace
from rlboost.simulator import PRESETS
from rlboost.simulator.core import Simulation
from rlboost.simulator.result import SimResult

ROOT = Path(__file__).resolve().parents[1]
JOBS = (ROOT / "examples/simulate/paper-h100.yaml", ROOT / "benchmarks/variants/paper-h100-heavy.yaml")


def run(spec: JobSpec, policy: str, workers: int, steps: int, siblings: bool) -> SimResult:
    rollout = spec.rollout.model_copy(update={"max_workers": workers, "sibling_scheduling": siblings})
    spec = spec.model_copy(update={"rollout": rollout})
    sim = Simulation(
        spec, constant_trace(workers), PRESETS[policy], trainer_offer(spec), spot_offers(spec), max_steps=steps
    )
    return sim.run()


def row(name: str, workers: int, label: str, r: SimResult, ref: dict[str, SimResult], ratio: str = "") -> str:
    sync, alone = ref["sync"], ref["on-demand"]
    return (
        f"| {name} | {workers} | {label} | {r.tokens_per_s:,.0f} | {r.tokens_per_s / sync.tokens_per_s:.3f}x "
        f"| {r.tokens_per_dollar / sync.tokens_per_dollar:.3f}x | {r.tokens_per_s / alone.tokens_per_s:.3f}x "
        f"| {r.tokens_per_dollar / alone.tokens_per_dollar:.3f}x | {ratio} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", type=Path, nargs="*", default=list(JOBS))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2, 3, 4])
    args = ap.parse_args()
    print(
        "| job | spot workers | siblings | tokens/s | thr vs sync | tok/$ vs sync | thr vs on-demand "
        "| tok/$ vs on-demand | on ÷ off (thr, tok/$) |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---|")
    for path in args.job:
        t0 = time.monotonic()
        base = load_spec(path)
        ref = {p: run(base, p, 0, args.steps, False) for p in ("on-demand", "sync")}
        for p, r in ref.items():
            print(row(base.name, 0, f"- ({p})", r, ref))
        for n in args.workers:
            off, on = (run(base, "rlboost", n, args.steps, s) for s in (False, True))
            print(row(base.name, n, "off", off, ref))
            ratio = f"{on.tokens_per_s / off.tokens_per_s:.3f}x, {on.tokens_per_dollar / off.tokens_per_dollar:.3f}x"
            print(row(base.name, n, "on", on, ref, ratio), flush=True)
        print(f"<!-- {base.name}: {time.monotonic() - t0:.0f} s -->", file=sys.stderr)


if __name__ == "__main__":
    main()
