"""What `rlboost simulate` needs to know about this machine to replay a `provider: local` job.

A local job's trainer and "spot workers" are processes on this CPU, so the cloud figures (the perf
table's A100 rows, `simulate:`'s 7B-on-a-cloud timings) describe some other job. `calibrate` measures
them here, on the model the job file describes, in one single-threaded process (as the trainer and
the workers run: torch.set_num_threads(1)):

  rates     decode tokens/s of one sequence and of a full engine batch, prefill tokens/s, GRPO
            training tokens/s, the optimizer step (-> step_overhead_s), a supervised warm-start
            step (-> warm_start_s = warm_start_steps x it)
  platform  start-up of a fresh Python process importing what a worker imports (-> boot_s and the
            trainer's); with a torch engine, the dispatch round trip between batches (-> dispatch_s)
            and a new version's pull into the engine (-> pull_s), both through the real coordinator,
            worker agent and weight pull (round_trip.py), and the trainer's CPU per response it serves
            a worker in another process (-> serve_s); this machine's cores (-> cpu_cores)
  workload  response lengths: what the job's model generates at its first step (after the job's
            warm start, at its temperature / top_k / top_p, ended at its stop strings, on its first
            prompts and request seeds), or the replay's recorded ones; the training rate is measured at
            them, a fresh draw of a step's lengths per timed step (the learner pads a batch to its
            longest sequence, so the few responses that never stop set the cost of the steps they fall in)

Nothing here is fitted to an end-to-end run. A job file's own `perf:` entries and `simulate:` values
win over what is measured (`apply`).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from rlboost.contracts.perf import split_accelerator
from rlboost.contracts.provider_kinds import provider_kind
from rlboost.contracts.spec import JobSpec, PerfSpec
from rlboost.rollout.scheduling import machine_cores

if TYPE_CHECKING:
    from rlboost.trainer.learner import Learner
    from rlboost.trainer.tasks import Task

_WORKER_IMPORTS = "import torch, rlboost.worker.agent, rlboost.models.torch_engine"
# responses generated for the lengths: the few that never stop set the padding of the steps they fall in
# (examples/local.yaml: ~1.6 in 1,000, so a step of 512 has one about half the time); 2,048 held 1-7 of
# them depending on the prompts drawn, too few to say how often (16,384 generated to check: 34)
LENGTH_SAMPLES = 8192


def timed(fn: Callable[[], object], repeats: int = 3, warm_up: bool = True) -> float:
    """Median seconds of fn() over `repeats` calls, after one warm-up call unless told not to."""
    if warm_up:
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclass(frozen=True)
class Calibration:
    """One local process on this machine running the job's model."""

    seq_tokens_per_s: float
    tokens_per_s: float  # decode, a full engine batch
    prefill_tokens_per_s: float
    train_tokens_per_s: float
    ref_batch: int
    step_overhead_s: float  # optimizer step after the last group + publishing the version
    warm_start_s: float
    process_start_s: float  # python + torch + the worker's imports
    pull_s: float  # a new weight version published -> in the engine (a torch engine: the real pull)
    cores: int  # CPU cores this process may run on: the job's processes share them
    dispatch_s: float  # a batch's end -> the next batch's start on the same engine (round_trip.py)
    serve_s: float  # the trainer's CPU per response served (round_trip.py)
    lengths: tuple[int, ...]  # response lengths the warm-started model generates (its first step)
    took_s: float

    def perf(self) -> PerfSpec:
        return PerfSpec(
            tokens_per_s=self.tokens_per_s,
            seq_tokens_per_s=self.seq_tokens_per_s,
            prefill_tokens_per_s=self.prefill_tokens_per_s,
            train_tokens_per_s=self.train_tokens_per_s,
            ref_batch=self.ref_batch,
        )

    def platform(self) -> dict[str, float]:
        return {
            "boot_s": self.process_start_s,
            "trainer_boot_s": self.process_start_s,
            "reserved_boot_s": self.process_start_s,
            "pull_s": self.pull_s,
            "reserved_pull_s": self.pull_s,
            "step_overhead_s": self.step_overhead_s,
            "warm_start_s": self.warm_start_s,
            "cpu_cores": self.cores,
            "dispatch_s": self.dispatch_s,
            "serve_s": self.serve_s,
        }

    def describe(self) -> str:
        return (
            f"calibrated on this machine in {self.took_s:.1f}s (one process, 1 thread): decode "
            f"{self.seq_tokens_per_s:,.0f} tok/s alone, {self.tokens_per_s:,.0f} tok/s at batch {self.ref_batch}; "
            f"prefill {self.prefill_tokens_per_s:,.0f} tok/s; train {self.train_tokens_per_s:,.0f} tok/s; "
            f"optimizer step + publish {self.step_overhead_s * 1000:.0f} ms; warm start {self.warm_start_s:.2f}s; "
            f"process start {self.process_start_s:.2f}s; weight pull {self.pull_s * 1000:.0f} ms; "
            f"dispatch round trip {self.dispatch_s * 1000:.1f} ms; "
            f"serving {self.serve_s * 1e6:.0f} us of the trainer's CPU a response; "
            f"{self.cores} cores shared by the job's processes; "
            f"response median {statistics.median(self.lengths):g} tokens"
        )

    def as_json(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "lengths"}
        out["median_response_tokens"] = statistics.median(self.lengths)
        return out

    def apply(self, spec: JobSpec) -> JobSpec:
        """The job as simulated here: every node is one local process at the measured rates (the
        accelerator counts, e.g. A100:8, still price it), unless the job file says otherwise."""
        perf = dict(spec.perf)
        for acc in [spec.trainer.accelerators, *(c.accelerator for c in spec.rollout.candidates)]:
            name, _ = split_accelerator(acc)
            if not any(k.lower() == name.lower() for k in perf):
                perf[name] = self.perf()
        given = spec.simulate.model_fields_set
        sim = spec.simulate.model_copy(update={k: v for k, v in self.platform().items() if k not in given})
        trainer = spec.trainer.model_copy(update={"accelerators": one_process(spec.trainer.accelerators), "nodes": 1})
        cands = [c.model_copy(update={"accelerator": one_process(c.accelerator)}) for c in spec.rollout.candidates]
        return spec.model_copy(
            update={
                "perf": perf,
                "simulate": sim,
                "trainer": trainer,
                "rollout": spec.rollout.model_copy(update={"candidates": cands}),
            }
        )


def one_process(acc: str | None) -> str:
    """'A100:8' -> 'A100': a local node is one process whatever its accelerator count."""
    return split_accelerator(acc)[0]


def needs_calibration(spec: JobSpec) -> bool:
    """Local jobs whose model really runs here (synthetic engines follow the perf table by design)."""
    return provider_kind(spec.provider).runs_here and spec.model.kind == "tiny-gpt"


def _drop(*_: object) -> None:
    """An engine's token callback that keeps nothing (timing runs)."""


def _never(_: str) -> bool:
    return False


def first_step_lengths(spec: JobSpec, task: Task, learner: Learner) -> tuple[int, ...]:
    """Response lengths as the job's first steps would generate them: `learner` warm-started as the job's
    trainer does, its weights in a torch engine, the job's prompts (its seed), request seeds and
    temperature, at least LENGTH_SAMPLES responses (the first steps' prompts, all at these weights). A
    real model's lengths are its own: after a short warm start most stop where the task's answers end,
    and a few never do."""
    from rlboost.contracts.engine import GenRequest
    from rlboost.contracts.sampling import request_id, request_seed
    from rlboost.contracts.stop import StopCollector, stop_rule
    from rlboost.models.torch_engine import TorchEngine

    algo, batch = spec.algorithm, spec.rollout.engine_batch
    if algo.warm_start_steps:
        learner.warm_start(algo.warm_start_steps)
    engine = TorchEngine(spec.model, dtype="float32", max_batch=batch, eos_id=task.eos_id)
    engine.load_weights(0, learner.state_dict())
    prompt_rng = np.random.default_rng(algo.seed)  # the trainer's prompt sampler
    got: dict[str, int] = {}  # request id -> tokens generated
    stop = stop_rule(algo.stop, task.decode_response)  # algorithm.stop ends them too

    out: list[int] = []
    step = 0
    while len(out) < LENGTH_SAMPLES:
        problems = task.sample(prompt_rng, algo.prompts_per_step)
        reqs = [
            GenRequest(rid, list(p.prompt_ids), algo.max_new_tokens, request_seed(algo.seed, rid))
            for i, p in enumerate(problems)
            for rid in (request_id(step, i, g) for g in range(algo.group_size))
        ]
        for k in range(0, len(reqs), batch):
            col = StopCollector([r.rid for r in reqs[k : k + batch]], stop)
            engine.generate(reqs[k : k + batch], col.on_tokens, col.should_abort, temperature=algo.temperature,
                            top_k=algo.top_k, top_p=algo.top_p)
            got.update((rid, len(t)) for rid, t in col.tokens.items())
        out += [max(1, got.get(r.rid, 0)) for r in reqs]
        step += 1
    return tuple(out)


def process_start_s(repeats: int = 1) -> float:
    """Seconds for a fresh interpreter to import what a worker imports (its start-up to dial-in)."""

    def start() -> None:
        subprocess.run([sys.executable, "-c", _WORKER_IMPORTS], check=True, capture_output=True)

    # no warm-up: a worker's first start-up is the one that counts
    return timed(start, repeats, warm_up=False)


def calibrate(
    spec: JobSpec, *, measure_start: bool = True, replay_lengths: Sequence[int] | None = None
) -> Calibration:
    """Measure the job's model on this machine (a few seconds; see the module docstring). replay_lengths:
    the response lengths the replay will use, when they are not the model's own (recorded ones)."""
    import io

    import torch
    from safetensors.torch import load, save

    from rlboost.contracts.engine import STATIC_BATCH_ENGINES, GenRequest
    from rlboost.models.torch_engine import TorchEngine
    from rlboost.simulator.round_trip import PlatformProbe, measure_platform, measure_serving
    from rlboost.trainer.grpo import Sample
    from rlboost.trainer.learner import Learner
    from rlboost.trainer.tasks import make_task
    from rlboost.weights.publisher import PublishOptions, WeightPublisher

    t_start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the trainer and the workers run
    try:
        algo, batch = spec.algorithm, spec.rollout.engine_batch
        rng = np.random.default_rng(0)
        task = make_task(spec.task, spec.model)
        problems = task.sample(np.random.default_rng(algo.seed), LENGTH_SAMPLES)
        prompt_len = round(statistics.mean(len(p.prompt_ids) for p in problems))
        new = algo.max_new_tokens
        learner = Learner(spec.model, algo, spec.task, seed=0)
        lengths = first_step_lengths(spec, task, learner)
        warm = {k: v.clone() for k, v in learner.state_dict().items()}  # the timing below trains on noise
        # eos_id -1: no sequence stops early, so every decode step runs the whole batch
        engine = TorchEngine(spec.model, dtype="float32", max_batch=batch, eos_id=-1)

        def generate(n: int, max_new: int) -> None:
            ids = [[int(x) for x in rng.integers(4, 20, prompt_len)] for _ in range(n)]
            engine.generate([GenRequest(f"r{i}", p, max_new, i) for i, p in enumerate(ids)], _drop, _never)

        one = timed(lambda: generate(1, new))
        full = timed(lambda: generate(batch, new), repeats=5)
        prefill = max(timed(lambda: generate(batch, 1), repeats=5), 1e-6)

        n = algo.prompts_per_step * algo.group_size
        # a step's prompts and responses at the replay's lengths (recorded ones if given, else the model's
        # own): the learner pads a batch to its longest sequence, so uneven lengths cost more than their
        # mean would, and each step is a new draw: a rare response that runs to max_new_tokens makes the
        # step it falls in ~1.3x as long (tiny-gpt, reverse). The rate is over 10 draws (after a warm-up),
        # total tokens / total time: the steps' mean, as a run of steps pays it
        pool = np.asarray(replay_lengths or lengths)
        adds, finishes, tokens = [], [], []
        for _ in range(11):
            resp = rng.choice(pool, n)
            shapes = [(len(problems[i // algo.group_size].prompt_ids), max(1, int(resp[i]))) for i in range(n)]
            samples = [
                Sample(
                    [int(x) for x in rng.integers(4, 20, p_len)],
                    [int(x) for x in rng.integers(4, 20, r_len)],
                    float(rng.random()),
                    group=i // algo.group_size,
                    # an engine's log-probs, for algorithm.rollout_correction's weights (timed too)
                    behaviour_logprobs=[-1.0] * r_len,
                )
                for i, (p_len, r_len) in enumerate(shapes)
            ]
            tokens.append(sum(r_len for _, r_len in shapes))
            t0 = time.perf_counter()
            learner.begin_step(tokens[-1])
            learner.add_groups(samples)
            t1 = time.perf_counter()
            learner.finish_step()
            adds.append(t1 - t0)
            finishes.append(time.perf_counter() - t1)
        warm_step = timed(lambda: learner.warm_start(1), repeats=4) if algo.warm_start_steps else 0.0

        publisher = WeightPublisher(PublishOptions(prepare_next=False))
        versions = iter(range(10**6))
        # the trainer publishes every version: host copy, hashes, the delta to the last one
        publish = timed(lambda: publisher.publish(next(versions), learner.state_dict()))
        if spec.rollout.engine in STATIC_BATCH_ENGINES:  # the real coordinator, agent and weight pull
            def train_step() -> dict:
                learner.warm_start(1)
                return learner.state_dict()

            first = problems[: algo.prompts_per_step]
            step_prompts = [list(p.prompt_ids) for p in first for _ in range(algo.group_size)]
            # the worker generates with the warm-started weights, as the job's first steps do
            probe = PlatformProbe(warm, train_step, engine, problems[0].prompt_ids, task.eos_id, step_prompts)
            serve = measure_serving(spec, probe)
            platform = measure_platform(spec, probe)
            dispatch, pull = platform.dispatch_s, platform.pull_s
        else:  # the load alone
            blob = save(learner.state_dict())
            dispatch, serve = 0.0, 0.0
            pull = timed(lambda: engine.load_weights(1, load(io.BytesIO(blob).getvalue())))
    finally:
        torch.set_num_threads(threads)
    start = process_start_s() if measure_start else 0.0
    return Calibration(
        seq_tokens_per_s=round(new / one, 1),
        tokens_per_s=round(max(batch * new / full, new / one), 1),
        prefill_tokens_per_s=round(batch * prompt_len / prefill, 1),
        train_tokens_per_s=round(sum(tokens[1:]) / sum(adds[1:]), 1),
        ref_batch=batch,
        step_overhead_s=round(statistics.median(finishes[1:]) + publish, 4),
        warm_start_s=round(warm_step * algo.warm_start_steps, 3),
        process_start_s=round(start, 3),
        pull_s=round(pull, 4),
        dispatch_s=round(dispatch, 5),
        serve_s=round(serve, 7),
        cores=machine_cores(),
        lengths=lengths,
        took_s=time.perf_counter() - t_start,
    )
