"""Weights swapped in flight (issue 39): `algorithm.weight_swap` step against in_flight at max_staleness 1.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_weight_swap.py [--steps 12 40] [--out swap.json]
    PYTHONPATH=. .venv/bin/python benchmarks/bench_weight_swap.py --smoke   # 3 steps, the paper job only

Part 1, the paper's setting: examples/simulate/paper-h100.yaml and the held-out heavier-tail variant
(benchmarks/variants/paper-h100-heavy.yaml) at 4 constant spot workers with grouped speculation, for each
`--steps`: `sync` (veRL's default, no speculation), the trainer alone given the same speculation
(`on-demand`, the fair baseline) and `rlboost-throughput` (every worker held, as the rule's fleet) at
max_staleness 1 with each weight_swap. As in benchmarks/bench_tail.py the hf jobs replay a stand-in
dataset of 4,096 distinct prompts (the shipped 8-record sample gives the replay only 8 per-prompt length
factors).

Part 2, the shipped traces: every examples/simulate job on its own trace (the whole trace, no
`--steps`), `rlboost` (the job's objective, cost where it says so) at max_staleness 1 with each
weight_swap, against the trainer alone on the same trace; with spot's price as a share of on-demand.

`--perturb-order clear|regrow` replays with another iteration order of the engines' sets of live
responses, their members unchanged (perturb_order). The replay reads those sets in iteration order
(floating-point sums, ties), so this shows how far a figure moves from numerical accident alone;
BENCHMARKS.md reports the spread.

Nothing is tuned here: engine and trainer speeds come from rlboost/contracts/perf.py, acceptance from
rlboost/contracts/speculation_perf.py, weight pulls and boots from each job's `simulate:` section.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlboost.contracts.spec import JobSpec, load_spec
from rlboost.simulator import PRESETS
from rlboost.simulator import cli as sim_cli
from rlboost.simulator.modelled_pool import ModelledPool
from rlboost.simulator.result import SimResult

ROOT = Path(__file__).resolve().parents[1]
PAPER = {
    "paper": ROOT / "examples/simulate/paper-h100.yaml",
    "heavy": ROOT / "benchmarks/variants/paper-h100-heavy.yaml",
}
SHIPPED = sorted((ROOT / "examples/simulate").glob("*.yaml"))
MODES = ("step", "in_flight")
WORKERS = 4


def variant(spec: JobSpec, mode: str, method: str | None = None, prompts: Path | None = None) -> JobSpec:
    doc = spec.model_dump(mode="json")
    doc["algorithm"].update(max_staleness=1, weight_swap=mode)
    if method is not None:
        doc["rollout"]["speculative"]["method"] = method
    if prompts is not None:
        doc["task"]["path"] = str(prompts)
    return JobSpec.model_validate(doc)


def perturb_order(how: str) -> None:
    """Another iteration order of the engines' live sets, members unchanged (see --perturb-order): after
    every hand-over and in-flight swap, each set the call emptied gets a fresh table (`clear`), or a table
    grown back to what it held before the call (`regrow`, as a set emptied by removals keeps)."""

    def held(pool: ModelledPool) -> list[int]:
        return [len(e.live) for e in pool.fleet.engines]

    def reorder(pool: ModelledPool, before: list[int]) -> None:
        for e, n in zip(pool.fleet.engines, before):
            if n and not e.live:  # in place: callers up the stack may hold the set
                e.live.clear()
                if how == "regrow":  # negative: no response's index
                    e.live.update(range(-n, 0))
                    e.live.difference_update(range(-n, 0))

    hand_over, swap = ModelledPool.hand_over, ModelledPool._swap

    def hand_over_reordered(self: ModelledPool, engines: Sequence[str], now: float) -> int:
        before = held(self)
        moved = hand_over(self, engines, now)
        reorder(self, before)
        return moved

    def swap_reordered(self: ModelledPool) -> None:
        before = held(self)
        swap(self)
        reorder(self, before)

    ModelledPool.hand_over = hand_over_reordered  # type: ignore[method-assign]
    ModelledPool._swap = swap_reordered  # type: ignore[method-assign]


def steady_busy(r: SimResult, skip: int = 2) -> float:
    """The trainer's training seconds over the seconds its steps add to the run, after the first `skip`
    steps (the billed share above also counts the boot, the warm start and the first steps' wait)."""
    log = r.step_log[skip:] or r.step_log
    return sum(x["train_s"] for x in log) / sum(x["step_s"] for x in log)


def figures(r: SimResult, sync: SimResult | None, alone: SimResult) -> dict:
    out = {
        "steps": r.steps,
        "tokens_per_s": r.tokens_per_s,
        "busy": r.trainer_busy_share,
        "busy_steady": steady_busy(r),
        "thr_alone": r.tokens_per_s / alone.tokens_per_s,
        "tpd_alone": r.tokens_per_dollar / alone.tokens_per_dollar,
        "swapped": sum(x.get("swapped", 0) for x in r.step_log),
    }
    if sync is not None:
        out["thr_sync"] = r.tokens_per_s / sync.tokens_per_s
    return out


def paper_rows(name: str, path: Path, steps: int, prompts: Path) -> list[dict]:
    base = load_spec(path)

    def prepared(mode: str, method: str) -> sim_cli.Replay:
        spec = variant(base, mode, method, prompts)
        return sim_cli.prepare(spec, None, constant_workers=WORKERS, steps=steps, calibrated=False)

    sync = prepared("step", "none").replay(PRESETS["sync"])
    alone = prepared("step", "group").replay(PRESETS["on-demand"])  # alone, nothing generates while it trains
    rows = []
    for mode in MODES:
        r = prepared(mode, "group").replay(PRESETS["rlboost-throughput"])
        rows.append({"job": name, "steps": steps, "mode": mode, **figures(r, sync, alone)})
    return rows


def shipped_rows(path: Path) -> list[dict]:
    base = load_spec(path)
    c = base.rollout.candidates[0]
    share = c.spot_price / c.on_demand_price if c.spot_price and c.on_demand_price else None
    rows = []
    alone = sim_cli.prepare(variant(base, "step"), None, calibrated=False).replay(PRESETS["on-demand"])
    for mode in MODES:
        r = sim_cli.prepare(variant(base, mode), None, calibrated=False).replay(PRESETS["rlboost"])
        rows.append({"job": path.stem, "mode": mode, "spot_share": share, **figures(r, None, alone)})
    return rows


def x(v: float) -> str:
    return f"{v:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[12, 40])
    ap.add_argument("--smoke", action="store_true", help="3 steps, the paper job only, no shipped traces")
    ap.add_argument("--paper-only", action="store_true", help="part 1 only (not the shipped traces)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--perturb-order", choices=("clear", "regrow"), help="another order of the engines' live sets")
    args = ap.parse_args()
    if args.perturb_order:
        perturb_order(args.perturb_order)
    jobs = ["paper"] if args.smoke else list(PAPER)
    steps = [3] if args.smoke else args.steps
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"question": f"problem {i}", "answer": "0"}) + "\n" for i in range(4096)))
        paper = [row for j in jobs for n in steps for row in paper_rows(j, PAPER[j], n, prompts)]
    shipped = [] if args.smoke or args.paper_only else [row for p in SHIPPED for row in shipped_rows(p)]
    replays = len(paper) // 2 * 4 + len(shipped) // 2 * 3
    order = f", live sets' order perturbed ({args.perturb_order})" if args.perturb_order else ""
    print(f"## Weights swapped in flight: {replays} replays in {time.monotonic() - t0:.0f} s{order}\n")
    print(f"max_staleness 1, {WORKERS} constant spot workers, rollout.speculative.method group; "
          "`rlboost-throughput` against `sync` and the trainer alone (speculating too)\n")
    print("| job | steps | weight_swap | tokens/s | vs sync | vs alone | tokens/$ vs alone | busy, billed | "
          "busy, from step 3 | swapped |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in paper:
        print(f"| {r['job']} | {r['steps']} | {r['mode']} | {r['tokens_per_s']:,.0f} | {x(r['thr_sync'])} | "
              f"{x(r['thr_alone'])} | {x(r['tpd_alone'])} | {r['busy']:.2f} | {r['busy_steady']:.2f} | "
              f"{r['swapped']:,} |")
    if shipped:
        print("\nThe shipped traces, whole trace, `rlboost` (the job's objective) against the trainer alone\n")
        print("| job | spot / on-demand | weight_swap | steps | vs alone | tokens/$ vs alone | busy, billed |")
        print("|---|---:|---|---:|---:|---:|---:|")
        for r in shipped:
            share = "-" if r["spot_share"] is None else f"{r['spot_share']:.2f}"
            print(f"| {r['job']} | {share} | {r['mode']} | {r['steps']} | {x(r['thr_alone'])} | "
                  f"{x(r['tpd_alone'])} | {r['busy']:.2f} |")
    if args.out:
        args.out.write_text(json.dumps({"paper": paper, "shipped": shipped}, indent=2))


if __name__ == "__main__":
    main()
