"""Policy comparison on the shipped spot traces and prices (`rlboost simulate` on each example job).

    .venv/bin/python benchmarks/bench_policies.py [--jobs examples/simulate/*.yaml] [--out results.json]

For every job file (each names its trace and price catalog) it replays the whole trace under
on-demand only, spot with restart, RLBoost's published offload rule, rlboost's policies, and rlboost's
policies with tail batching, and prints one markdown table per trace (ratios against on-demand only,
which runs in the same invocation). The replay is deterministic: one run per policy; the wall time of
each replay is reported too.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlboost.cli.sim_report import results_json
from rlboost.contracts.spec import load_spec
from rlboost.providers.pricing import spot_offers, trainer_offer
from rlboost.providers.spot_market import load_trace
from rlboost.simulator import PRESETS
from rlboost.simulator.core import Simulation

POLICIES = ("on-demand", "spot-restart", "rlboost-rule", "rlboost", "rlboost-tail")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", nargs="*", default=sorted(glob.glob("examples/simulate/*.yaml")))
    ap.add_argument("--policies", nargs="*", default=list(POLICIES))
    ap.add_argument("--hours", type=float, default=None, help="replay only this much of each trace")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = []
    for jf in args.jobs:
        spec = load_spec(jf)
        trace = load_trace(spec.local.trace)
        t_offer, s_offers = trainer_offer(spec), spot_offers(spec)
        results, walls = [], {}
        for name in args.policies:
            t0 = time.process_time()
            horizon = args.hours * 3600 if args.hours else None
            r = Simulation(spec, trace, PRESETS[name], t_offer, s_offers, max_steps=10**9, horizon_s=horizon).run()
            walls[name] = round(time.process_time() - t0, 1)
            results.append(r)
            print(
                f"{Path(jf).name} {name}: {r.steps} steps, {r.tokens_per_s:,.0f} tok/s, ${r.dollars:,.2f}, "
                f"{walls[name]}s CPU",
                file=sys.stderr,
                flush=True,
            )
        rows = results_json(results)
        for row in rows:
            row["sim_cpu_s"] = walls[row["policy"]]
        out.append(
            {
                "job": jf,
                "trace": str(spec.local.trace),
                "trace_hours": round(results[0].job_s * results[0].time_scale / 3600, 2),
                "trainer": t_offer.describe(),
                "spot": [o.describe() for o in s_offers],
                "max_workers": spec.rollout.max_workers,
                "results": rows,
            }
        )
        print(markdown(out[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))


def markdown(block: dict) -> str:
    lines = [
        f"**{Path(block['trace']).name}** ({block['trace_hours']} h; trainer {block['trainer']}; "
        f"spot {', '.join(block['spot'])}, up to {block['max_workers']})",
        "",
        "| policy | steps/h | trained tok/s | $ | tokens/$ | throughput vs OD | tokens/$ vs OD | preemptions "
        "| sim CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in block["results"]:
        lines.append(
            f"| {r['policy']} | {r['steps_per_hour']:.1f} | {r['tokens_per_s']:,.0f} | {r['dollars']:,.0f} | "
            f"{r['tokens_per_dollar']:,.0f} | {r['throughput_vs_on_demand']:.2f}x | "
            f"{r['tokens_per_dollar_vs_on_demand']:.2f}x | {r['preemptions']} | {r['sim_cpu_s']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
