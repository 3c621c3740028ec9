"""The simulator predicts a live run: the local provider in real time on a short, compressed spot trace
(preemptions with and without notice), against `rlboost simulate` of the same job file and trace.
Throughput (trained tokens per second of stepping) and cost must agree within 10% with synthetic engines,
and within 20% with tiny-gpt (real torch engines and learner on this CPU, where the calibration's own
noise is ~10%: BENCHMARKS.md, section 3, has the runs).

With synthetic engines, the platform timings the simulator cannot know - how long a local process
takes to start (python + imports + dial-in) and to pull a weight version; seconds to minutes on a
loaded, shared 2-core machine - are read from this very run's logs and given to the simulator as `simulate.*` (boot_s,
trainer_boot_s, reserved_boot_s, pull_s, reserved_pull_s). Everything else - steps, offload
decisions, dispatch, preemptions, migrations, relaunches, billing - is the simulator's own prediction.
A tiny-gpt job's rates and platform timings come from `simulate`'s own calibration
(rlboost/simulator/local_calibration.py), measured after the live run, as `rlboost simulate` does; what it takes
from the run is its response lengths (what a real model generates is its own) and the cores other work
left it (CoresLeft: this machine is shared). A tiny-gpt run that misses gets one more live run and
calibration: the host of this VM can slow a whole run unseen from inside it (see the test).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from rlboost.cli.ledger import summarize
from rlboost.cli.state import StateStore
from rlboost.contracts.spec import load_spec
from rlboost.simulator import cli as sim_cli
from tests.conftest import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # whole jobs over a minute: .ci/run's slow tier

STEPS = 12
# trace minutes; time_scale 60 -> one wall second each. Capacity drops from 3 to 1 for 4 s every 26 s,
# so the stepping meets preemptions whether this machine starts a Python process in 2 s or in 60.
TRACE = {"metadata": {"gap_seconds": 60}, "data": ([3] * 22 + [1] * 4) * 40}


def job_dict() -> dict:
    return {
        "name": "simlive",
        "model": {"kind": "synthetic", "train_tokens_per_s": 1500},
        "algorithm": {
            "prompts_per_step": 16,
            "group_size": 8,
            "max_new_tokens": 150,
            "steps": STEPS,
            "seed": 5,
            "warm_start_steps": 0,
        },
        "trainer": {"accelerators": "A100:1", "hourly_price": 4.1},
        "rollout": {
            "engine": "synthetic",
            "engine_batch": 32,
            "max_workers": 3,
            # a fixed fleet: this compares the simulator's model of the platform (market, offload,
            # migration, billing). Over 12 steps the cost objective's threshold decisions (is a step on
            # the trainer's floor, within 2 %?) turn a few % of step-length difference into another
            # fleet; the fleet policy itself is the same code in both (tests/test_fleet_policy.py)
            "min_workers": 3,
            "heartbeat_timeout_s": 4,
            "candidates": [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.44, "on_demand_price": 3.67}],
            "synthetic": {"lengths": {"median_tokens": 30, "sigma": 0.8, "prompt_sigma": 0.5}},
        },
        # light on purpose: a few thousand tokens/s keep the live run's Python far from the CPU's limit
        "perf": {
            "A100": {
                "tokens_per_s": 400,
                "seq_tokens_per_s": 25,
                "prefill_tokens_per_s": 50000,
                "train_tokens_per_s": 1500,
                "ref_batch": 32,
            }
        },
        "local": {"trace": "trace.json", "time_scale": 60.0, "notice_seconds": 1.0, "notice_fraction": 0.5},
        "simulate": {"boot_s": 5.0, "pull_s": 0.1, "reserved_pull_s": 0.1, "step_overhead_s": 0.05},
    }


# tiny-gpt: real torch engines and learner on this machine's CPU; steps of a fraction of a second, so
# more of them. Two workers all along: the market's part is the synthetic run's; this one checks the
# model of engines and trainer sharing this machine's cores (a preemption's relaunch would add the
# start of a process, which the trace's timing decides, to a run of a few seconds).
TINY_STEPS = 40
BUSY_CORES = 0.5  # other processes' use of the cores beyond which a live run of a real model is not compared
TINY_TRACE = {"metadata": {"gap_seconds": 60}, "data": [2] * 600}


def tiny_job_dict() -> dict:
    return {
        "name": "simlive-tiny",
        "model": {"kind": "tiny-gpt"},
        "algorithm": {"prompts_per_step": 32, "group_size": 8, "max_new_tokens": 12, "steps": TINY_STEPS, "seed": 3},
        "task": {"name": "reverse", "reward": "exact_match"},
        "trainer": {"accelerators": "A100:1", "hourly_price": 4.1},
        "rollout": {
            "engine": "torch",
            "max_workers": 2,
            "min_workers": 2,  # a fixed fleet, as above
            "heartbeat_timeout_s": 4,
            "candidates": [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.44, "on_demand_price": 3.67}],
        },
        "local": {"trace": "trace.json", "time_scale": 60.0, "notice_seconds": 1.0, "notice_fraction": 0.5},
        "simulate": {},
    }


class CoresLeft:
    """The cores the job had over a block: this process's cores less what other processes on the
    machine used meanwhile - all busy CPU time (/proc/stat) less this process's and the job's (every
    process whose environment names the job's RLBOOST_HOME, sampled every 20 ms)."""

    def __init__(self, home: Path) -> None:
        self.mark = f"RLBOOST_HOME={home}".encode()
        # pid -> (its CPU s before the block: 0 unless it was there at the start, its CPU s last seen)
        self.seen: dict[int, tuple[float, float]] = {}
        self.stop = threading.Event()

    def __enter__(self) -> CoresLeft:
        self.t0, self.busy0, self.self0 = time.monotonic(), _machine_busy_s(), time.process_time()
        self.seen = {pid: (cpu, cpu) for pid, cpu in _cpu_by_pid(self.mark).items()}
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        wall = time.monotonic() - self.t0
        ours = sum(last - before for before, last in self.seen.values())
        others = (_machine_busy_s() - self.busy0) - ours - (time.process_time() - self.self0)
        cores = len(os.sched_getaffinity(0))
        self.cores = round(min(cores, max(0.5, cores - max(0.0, others) / wall)), 2)

    def _sample(self) -> None:
        while not self.stop.wait(0.02):
            for pid, cpu in _cpu_by_pid(self.mark).items():
                self.seen[pid] = (self.seen.get(pid, (0.0, 0.0))[0], cpu)


def _cpu_by_pid(mark: bytes) -> dict[int, float]:
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if mark not in (d / "environ").read_bytes():
                continue
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(d.name)] = (int(f[11]) + int(f[12])) / tick
    return out


def _machine_busy_s() -> float:
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _stamp(line: str) -> float:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def observed_timings(home: Path, job) -> dict[str, float]:
    """Platform timings of this run (store + logs): process start-up and weight pulls."""
    store = StateStore(home / "state.db")
    insts = {i.id: i for i in store.instances(job.id)}
    jdir = home / "jobs" / f"{job.name}-{job.id}" / "instances"
    tdir = jdir / f"{job.name}-{job.id}-trainer"
    serving = (tdir / "endpoint").stat().st_mtime
    connected: dict[str, float] = {}
    for line in (tdir / "log").read_text().splitlines():
        m = re.search(r"engine (\S+) \((spot|reserved), \w+\) connected", line)
        if m:
            connected.setdefault(m.group(1), _stamp(line))
    boots = [t - insts[w].created_at for w, t in connected.items() if w in insts]
    reserved = [t for w, t in connected.items() if w not in insts]
    pulls: dict[str, list[float]] = {"spot": [], "reserved": []}
    for log in [*jdir.glob("*-w*/log"), tdir / "reserved-engine.log"]:
        kind = "reserved" if log.name.startswith("reserved") else "spot"
        for v, secs in re.findall(r"loaded version (\d+) in ([0-9.]+)s", log.read_text()):
            if int(v) > 0:  # version 0 comes with the boot
                pulls[kind].append(float(secs))
    assert boots and reserved, "an engine never connected"
    return {
        "boot_s": round(statistics.median(boots), 2),
        "trainer_boot_s": round(serving - insts[f"{job.name}-{job.id}-trainer"].created_at, 2),
        "reserved_boot_s": round(reserved[0] - serving, 2),
        "pull_s": round(statistics.median(pulls["spot"] or [0.1]), 3),
        "reserved_pull_s": round(statistics.median(pulls["reserved"] or [0.1]), 3),
    }


@pytest.mark.parametrize(
    "name, make_job, trace, within",
    [("synthetic", job_dict, TRACE, 0.10), ("tiny-gpt", tiny_job_dict, TINY_TRACE, 0.20)],
)
def test_simulator_predicts_the_live_run(tmp_path, name, make_job, trace, within):
    # A real model's live run has a second try, each with its own calibration: on this shared VM the host
    # can slow a run by 25-30 % without any process of the machine using the cores (CoresLeft saw all
    # 2.0 cores free in a CI run where live steps took 0.15-0.30 s against the calibrated 0.165 s, sim ÷
    # live 1.27), and nothing inside the VM can tell that run apart. A simulator that is wrong misses twice.
    # Other work on the machine (another test run, a build) that comes and goes during a live run is
    # measured (CoresLeft), but its timing within the run is not: where it took more than half a core on
    # every try, a miss says nothing about the simulator, and the comparison is skipped as such.
    tries = 2 if name != "synthetic" else 1
    busy: list[float] = []
    for n in range(tries):
        r = _live_and_replayed(tmp_path / f"try{n + 1}", name, make_job, trace)
        if all(r["sim"][k] == pytest.approx(r["live"][k], rel=within) for k in ("tokens_per_s", "dollars")):
            break
        if "cpu_cores" in r["platform"]:
            busy.append(len(os.sched_getaffinity(0)) - r["platform"]["cpu_cores"])
    else:
        if len(busy) == tries and min(busy) > BUSY_CORES:
            pytest.skip(f"other processes used {min(busy):.2f}+ cores during every live run: {r}")
    assert r["sim"]["tokens_per_s"] == pytest.approx(r["live"]["tokens_per_s"], rel=within), r
    assert r["sim"]["dollars"] == pytest.approx(r["live"]["dollars"], rel=within), r


def _live_and_replayed(tmp_path: Path, name: str, make_job, trace: dict) -> dict:
    """One live run of the job and its replay, as a report (also written to .rlboost-test/)."""
    tmp_path.mkdir()
    (tmp_path / "trace.json").write_text(json.dumps(trace))
    jf = tmp_path / "job.yaml"
    raw = make_job()
    jf.write_text(yaml.safe_dump(raw))
    home = tmp_path / "home"
    real_model = name != "synthetic"  # calibrated as `rlboost simulate` does, on lengths it generated
    cores_left = CoresLeft(home)
    with cores_left if real_model else contextlib.nullcontext():
        proc = run_cli("launch", *(["--record-rollouts"] if real_model else []), str(jf), home=home, timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    store = StateStore(home / "state.db")
    job = store.get_job(raw["name"])
    steps = store.steps(job.id)
    n_steps = raw["algorithm"]["steps"]
    assert len(steps) == n_steps
    # throughput over the steps after the first: step 0 mostly waits for processes to start (platform)
    live_s = sum(s.step_s for s in steps[1:])
    live_tokens = sum(s.tokens for s in steps[1:])
    live_cost = summarize(store, job.id).total_dollars
    preempted = [i for i in store.instances(job.id) if i.state == "preempted"]
    assert preempted or real_model, "the trace's drops preempted nobody"

    timings = observed_timings(home, job)
    if real_model:  # what other work on this machine left the job's processes (this machine is shared)
        raw["simulate"]["cpu_cores"] = timings["cpu_cores"] = cores_left.cores
    else:  # a tiny-gpt job's platform timings are calibrated, as `rlboost simulate` does
        raw["simulate"].update(timings)
    jf.write_text(yaml.safe_dump(raw))
    # a tiny-gpt job is calibrated on this machine first (its rates, its cores); synthetic follows `perf`.
    # What a real model generates is its own: the replay samples the live run's recorded lengths.
    recorded = next(home.rglob("rollouts.jsonl")) if real_model else None
    replay = sim_cli.prepare(load_spec(jf), None, lengths=recorded)
    res = next(r for r in replay.simulate(sim_cli.pick_policies(["job"], replay.spec)) if r.policy.name == "job")
    assert res.steps == n_steps
    if not real_model:  # same prompts and lengths (a real model's lengths are its own)
        assert res.trained_tokens == sum(s.tokens for s in steps)
    sim_s = sum(x["step_s"] for x in res.step_log[1:])
    sim_tokens = sum(x["tokens"] for x in res.step_log[1:])
    sim_tps = sim_tokens / sim_s
    live_tps = live_tokens / live_s
    report = {
        "live": {
            "run_s": round(live_s, 2),
            "tokens": live_tokens,
            "tokens_per_s": live_tps,
            "dollars": live_cost,
            "preemptions": len(preempted),
            "step_s": [round(s.step_s, 3) for s in steps],
        },
        "sim": {
            "run_s": round(float(sim_s), 2),
            "tokens": sim_tokens,
            "tokens_per_s": float(sim_tps),
            "dollars": res.dollars,
            "preemptions": res.preemptions,
            "step_s": [x["step_s"] for x in res.step_log],
        },
        "platform": timings,
        "calibration": replay.calibration.as_json() if replay.calibration else None,
    }
    out = Path(__file__).parent / ".." / ".rlboost-test"
    out.mkdir(exist_ok=True)
    (out / f"sim_vs_live-{name}.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    return report
