"""The long-response tail (issue 38): the paper's setting with and without speculative decoding.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_tail.py [--steps 20] [--out tail.json]
    PYTHONPATH=. .venv/bin/python benchmarks/bench_tail.py --smoke      # 2 steps, 1 worker, one job

For examples/simulate/paper-h100.yaml and the held-out heavier-tail variant
(benchmarks/variants/paper-h100-heavy.yaml), at 1-4 constant spot workers, it replays `sync` (veRL's
default: no speculation), `on-demand` (the trainer alone), RLBoost's published rule (`rlboost-rule`)
`rlboost` (its fleet sized by the job's `objective: cost`, so it may hold fewer than the workers offered)
and `rlboost-throughput` (`objective: throughput`: it holds every worker that shortens the step, the same
fleet as the rule's), each with `rollout.speculative.method` none and group (`sync` only without), and prints
markdown tables: trained tokens/s, throughput and tokens/$ against `sync` and the trainer alone,
tokens per verification pass and acceptance, where a step's time goes, and the step's critical
path: the longest response at the fastest one sequence can decode with the cited acceptance. The
issue's targets are checked, not tuned to: engine speeds come from rlboost/contracts/perf.py and the
acceptance model from rlboost/contracts/speculation_perf.py (sources cited there). As in
benchmarks/bench_paper.py the hf job replays a stand-in dataset of 4,096 distinct prompts (the
shipped 8-record sample would give the replay only 8 per-prompt length factors).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlboost.contracts.spec import JobSpec, load_spec
from rlboost.contracts.speculation import draft_length, expected_yield
from rlboost.contracts.speculation_perf import ACCEPTANCE
from rlboost.rollout import scheduling
from rlboost.simulator import PRESETS
from rlboost.simulator import cli as sim_cli
from rlboost.simulator.result import SimResult

ROOT = Path(__file__).resolve().parents[1]
JOBS = {
    "paper": ROOT / "examples/simulate/paper-h100.yaml",
    "heavy": ROOT / "benchmarks/variants/paper-h100-heavy.yaml",
}
# the targets for rlboost with speculation: throughput vs sync at 1-4 workers (and 2.0x at 4)
TARGET_THR = {1: 1.2, 2: 1.4, 3: 1.6, 4: 2.0}
HEAVY_TARGET_AT_4 = 1.8
# rlboost-throughput is the one the throughput targets are judged on: at "N workers" it holds the N the
# rule holds, where `rlboost` (objective cost) trades speed for tokens/$ and holds ~3 of 4
POLICIES = ("rlboost-rule", "rlboost", "rlboost-throughput")


def with_method(spec: JobSpec, method: str, prompts: Path) -> JobSpec:
    doc = spec.model_dump(mode="json")
    doc["task"]["path"] = str(prompts)
    doc["rollout"]["speculative"]["method"] = method
    return JobSpec.model_validate(doc)


def replay(spec: JobSpec, policy: str, workers: int, steps: int) -> SimResult:
    rp = sim_cli.prepare(spec, None, constant_workers=workers, steps=steps, calibrated=False)
    return rp.replay(PRESETS[policy])


def mean_step(r: SimResult, skip: int = 2) -> dict:
    log = r.step_log[skip:] or r.step_log
    n = len(log)
    step, gen = sum(x["step_s"] for x in log) / n, sum(x["gen_s"] for x in log) / n
    box = [x["box_s"] for x in log if x["box_s"] is not None]
    return {
        "step_s": round(step, 1),
        "gen_s": round(gen, 1),
        "after_gen_s": round(step - gen, 1),
        "box_s": round(sum(box) / len(box), 1) if box else None,  # when the trainer's engine handed over
    }


def critical_path(spec: JobSpec) -> dict:
    """The fastest a step's longest response can be decoded: alone on a worker's engine, every sibling
    done (the highest cited acceptance), K from the shared rule."""
    model = scheduling.engine_model_for(spec, spec.rollout.candidates[0].accelerator)
    a = ACCEPTANCE.rate("group", 1.0)
    k = draft_length(a, 1, spec.rollout.speculative.max_tokens, lambda n: model.pass_time(n, 1))
    alone = 1 / model.step_time(1)
    spec_rate = expected_yield(a, k) / model.pass_time(k + 1, 1)
    longest = spec.algorithm.max_new_tokens
    return {
        "longest_tokens": longest,
        "k": k,
        "plain_tok_s": round(alone, 1),
        "spec_tok_s": round(spec_rate, 1),
        "plain_floor_s": round(longest / alone, 1),
        "spec_floor_s": round(longest / spec_rate, 1),
    }


def run_job(name: str, path: Path, workers: list[int], steps: int, prompts: Path) -> list[dict]:
    base = load_spec(path)
    specs = {m: with_method(base, m, prompts) for m in ("none", "group")}
    rows: list[dict] = []

    def add(policy: str, method: str, n: int) -> None:
        r = replay(specs[method], policy, n, steps)
        rows.append({"job": name, "workers": n, "policy": policy, "method": method, "r": r})

    add("sync", "none", 0)
    add("on-demand", "none", 0)
    add("on-demand", "group", 0)
    for n in workers:
        for p in POLICIES:
            for m in ("none", "group"):
                add(p, m, n)
    ref = {(x["policy"], x["method"]): x["r"] for x in rows if x["workers"] == 0}
    sync, od = ref[("sync", "none")], ref[("on-demand", "none")]
    for x in rows:
        r = x.pop("r")
        sp = r.speculation
        x.update(
            tps=r.tokens_per_s,
            tpd=r.tokens_per_dollar,
            thr_sync=r.tokens_per_s / sync.tokens_per_s,
            tpd_sync=r.tokens_per_dollar / sync.tokens_per_dollar,
            thr_od=r.tokens_per_s / od.tokens_per_s,
            tpd_od=r.tokens_per_dollar / od.tokens_per_dollar,
            tokens_per_pass=sp["tokens_per_pass"] if sp else 1.0,
            acceptance=sp["acceptance"] if sp else None,
            steps=r.steps,
            dollars=r.dollars,
            **mean_step(r),
        )
    return rows


def verdicts(name: str, rows: list[dict], workers: list[int]) -> list[str]:
    out = []
    by = {(x["workers"], x["policy"], x["method"]): x for x in rows}
    alone_spec = by[(0, "on-demand", "group")]
    for n in workers:
        for policy in ("rlboost-throughput", "rlboost"):
            me = by[(n, policy, "group")]
            target = TARGET_THR[n] if name == "paper" else (HEAVY_TARGET_AT_4 if n == 4 else None)
            parts = [f"{name}, {n} worker(s): {policy}+group {me['thr_sync']:.2f}x sync"]
            if target is not None:
                parts.append(f"target {target}x {'met' if me['thr_sync'] >= target else 'NOT met'}")
            parts.append(
                f"tok/$ {me['tpd_od']:.2f}x the trainer alone ({'ok' if me['tpd_od'] >= 1.0 else 'BELOW'}), "
                f"{me['tpd'] / alone_spec['tpd']:.2f}x the trainer alone with group speculation"
            )
            parts.append(
                f"throughput {me['tps'] / by[(n, 'rlboost-rule', 'none')]['tps']:.3f}x RLBoost's rule as published "
                f"(no speculation), {me['tps'] / by[(n, 'rlboost-rule', 'group')]['tps']:.3f}x the rule with it"
            )
            out.append("; ".join(parts))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2, 3, 4])
    ap.add_argument("--jobs", nargs="*", default=list(JOBS), choices=list(JOBS))
    ap.add_argument("--smoke", action="store_true", help="2 steps, 1 worker, the paper job only")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.workers, args.jobs = 2, [1], ["paper"]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"question": f"problem {i}", "answer": "0"}) + "\n" for i in range(4096)))
        rows = [row for j in args.jobs for row in run_job(j, JOBS[j], args.workers, args.steps, prompts)]
    took = time.monotonic() - t0
    print(f"## The long-response tail: {args.steps} steps per replay, {len(rows)} replays in {took:.0f} s\n")
    print(
        "| job | spot workers | policy | speculation | tokens/s | thr vs sync | tok/$ vs sync | thr vs trainer alone "
        "| tok/$ vs trainer alone | tok/pass | accepted | step s | generation s | offload at s "
        "| after last response s |"
    )
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for x in rows:
        acc = f"{x['acceptance']:.0%}" if x["acceptance"] is not None else "-"
        print(
            f"| {x['job']} | {x['workers']} | {x['policy']} | {x['method']} | {x['tps']:,.0f} | {x['thr_sync']:.2f}x "
            f"| {x['tpd_sync']:.2f}x | {x['thr_od']:.2f}x | {x['tpd_od']:.2f}x | {x['tokens_per_pass']:.2f} | {acc} "
            f"| {x['step_s']} | {x['gen_s']} | {x['box_s'] if x['box_s'] is not None else '-'} | {x['after_gen_s']} |"
        )
    print("\n### Against the issue's targets\n")
    for j in args.jobs:
        for line in verdicts(j, [x for x in rows if x["job"] == j], args.workers):
            print(f"- {line}")
    print("\n### The critical path: the longest response alone, every sibling done\n")
    for j in args.jobs:
        c = critical_path(load_spec(JOBS[j]))
        print(
            f"- {j}: {c['longest_tokens']:,} tokens at {c['plain_tok_s']} tok/s plain = {c['plain_floor_s']} s; "
            f"with group speculation (K={c['k']}) {c['spec_tok_s']} tok/s = {c['spec_floor_s']} s"
        )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
