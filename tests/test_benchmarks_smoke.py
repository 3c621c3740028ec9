"""The benchmark smoke tier (`pytest -m bench_smoke`, .ci/run's tier after `faults`): every script in
benchmarks/ runs at its smallest size as a subprocess, as BENCHMARKS.md runs it, and its output must hold
the figures it reports, so a benchmark that stops reproducing fails CI instead of BENCHMARKS.md going
stale. test_every_script_has_a_smoke_run (default tier) fails on a script without a line in SMOKE.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
NUM = r"[0-9][0-9,.]*"  # a figure as the scripts print it (1,234.5)
GPU_SKIPPED = r"no CUDA GPU here .*: skipped"  # bench_gpu.py without a GPU


class Smoke(NamedTuple):
    script: str  # under benchmarks/
    args: str  # shell words; {tmp}: a fresh temporary directory, {python}: this interpreter
    expect: tuple[str, ...]  # regexes the output (stdout + stderr) must each match
    gpu: bool = False  # needs CUDA: without it the script must skip cleanly (exit 0, GPU_SKIPPED)


# One line per smoke run (a script may have several). A new benchmark script: add a line
#     Smoke("bench_x.py", "--smallest --args", (r"the figure it prints " + NUM,)),
# with arguments that finish in seconds on 2 cores and regexes for the figures BENCHMARKS.md quotes.
SMOKE = [
    Smoke("bench_chunk_client.py", "--mib 8 --runs 1", (rf"raw +{NUM} +1\.00", rf"httpx +{NUM} +{NUM}")),
    Smoke("bench_coordinator.py", "--engines 8 --procs 1 --steps 1 --per-engine 8 --migrate 8 --max-new 64",
          (rf'"tokens_per_s": {NUM}', rf'"migrate_redispatched_s": {NUM}')),
    Smoke("bench_gpu.py", "parts --smoke", (r'"tokens_per_s"', r'"streamed_tokens_per_s"'), gpu=True),
    Smoke("bench_gpu.py", "spec --smoke", (r'"tail-group"', r'"identical_to_none"'), gpu=True),
    Smoke("bench_offload_live.py", "--smoke", (rf"live, median step time: .* ratio none/offload {NUM}",
                                               rf"simulated, median step time: .* ratio none/offload {NUM}")),
    Smoke("bench_paper.py", "--steps 3", (rf"\| hf \| 2 \| rlboost \| {NUM} \|", r"largest spread: .*% \(within 5%\)")),
    Smoke("bench_policies.py", "--jobs examples/simulate/gcp-a100.yaml --hours 1 --policies on-demand rlboost",
          (rf"\| rlboost \| {NUM} \| {NUM} \|",)),
    Smoke("bench_siblings.py", "--steps 1 --workers 1", (rf"\| paper-h100 \| 1 \| on \| {NUM} \| {NUM}x",)),
    Smoke("bench_sim_local.py", "--runs 1 --workers 1 --steps 3", (rf"tokens_per_s +{NUM} +{NUM} +{NUM}",)),
    Smoke("bench_sim_speed.py", "replay-cpu -n 1 --hours 0.25", (rf"median of 1: {NUM} CPU s",)),
    Smoke("bench_sim_speed.py", "time -n 1 -- {python} -m rlboost.cli.main simulate examples/simulate/gcp-a100.yaml "
          "--hours 0.25 --json", (rf"median of 1: wall {NUM} s, CPU {NUM} s",)),
    Smoke("bench_speculation_live.py", "--smoke",
          (rf"reverse +group: step .* \({NUM}x none\).*simulated {NUM}s \({NUM}x none\)",
           r"responses identical with and without speculation: yes")),
    Smoke("bench_staleness_live.py", "--smoke --plot {tmp}/curves.svg",
          (rf" 1 +{NUM} +{NUM} +{NUM} +{NUM}x +{NUM}% +{NUM}% +1",)),
    Smoke("bench_tail.py", "--smoke", (rf"\| paper \| 1 \| rlboost \| group \| {NUM} \| {NUM}x", r"The critical path")),
    Smoke("bench_weight_swap.py", "--smoke", (rf"\| paper \| 3 \| in_flight \| {NUM} \| {NUM}x \| {NUM}x",)),
    Smoke("bench_weight_broadcast.py", "--mib 8 --members 2 --runs 1", (rf"ratio broadcast/HTTP {NUM}",)),
    Smoke("bench_weights.py", "fanout --mib 2 --workers 2 --runs 1", (rf'"bench": "fanout".*"time_ratio": {NUM}',)),
    Smoke("bench_weights.py", "delta --mlp-params 1048576 --runs 1",
          (rf'"model": "mlp-bfloat16".*"wire_ratio": {NUM}',)),
    Smoke("learning_curve.py", "--steps 2 --set algorithm.prompts_per_step=4 --quiet",
          (rf"seed 0: reward first 1 steps {NUM}, last 1 steps {NUM}",)),
]


def test_every_script_has_a_smoke_run() -> None:
    """A benchmark without a smoke run goes stale unnoticed: every benchmarks/*.py needs a line in SMOKE."""
    scripts = {p.name for p in BENCH.glob("*.py")}
    missing = sorted(scripts - {s.script for s in SMOKE})
    assert not missing, f"add a Smoke(...) line for {missing} to SMOKE in {Path(__file__).name}"
    assert not {s.script for s in SMOKE} - scripts, "SMOKE names a script benchmarks/ no longer has"


def cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def case_id(case: Smoke) -> str:
    """bench_x.py, or bench_x.py:sub for a script's subcommand."""
    first = case.args.split()[0] if case.args else "-"
    return case.script if first.startswith("-") else f"{case.script}:{first}"


@pytest.mark.bench_smoke
@pytest.mark.parametrize("case", SMOKE, ids=[case_id(s) for s in SMOKE])
def test_benchmark_smoke(case: Smoke, tmp_path: Path) -> None:
    words = shlex.split(case.args.format(tmp=tmp_path, python=sys.executable))
    argv = [sys.executable, str(BENCH / case.script), *words]
    t0 = time.monotonic()
    # a hang guard, not a measurement: the longest script takes ~140 s idle on 2 cores and several times
    # that on a busy machine; under pytest-timeout's 600 s, so a hang fails here with the script named
    proc = subprocess.run(argv, cwd=ROOT, env={**os.environ, "COLUMNS": "200"}, capture_output=True, text=True,
                          timeout=570)
    out = proc.stdout + proc.stderr
    took = time.monotonic() - t0
    assert proc.returncode == 0, f"{shlex.join(argv[1:])} exited {proc.returncode} after {took:.0f} s:\n{out[-4000:]}"
    expect = case.expect if not case.gpu or cuda() else (GPU_SKIPPED,)
    missing = [e for e in expect if not re.search(e, out)]
    assert not missing, f"{shlex.join(argv[1:])}: no match for {missing} in its output:\n{out[-4000:]}"
