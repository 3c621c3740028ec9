"""Learning curve of the default job, in process: warm start + GRPO steps with the torch engine.

    .venv/bin/python benchmarks/learning_curve.py                    # the default spec
    .venv/bin/python benchmarks/learning_curve.py --set algorithm.learning_rate=3e-3 --seeds 0 1 2

Prints the reward (fraction of exact-match responses) per step and the wall time per step. Single
threaded on purpose (torch.set_num_threads(1)), as a trainer process on a 2-core machine would be.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlboost, as the other scripts

from rlboost.contracts.spec import JobSpec
from rlboost.models.torch_engine import TorchEngine
from rlboost.trainer.learner import Learner
from rlboost.trainer.local_rollout import rollout_groups


def apply_overrides(spec: JobSpec, overrides: list[str]) -> JobSpec:
    """`section.field=value` overrides, e.g. `algorithm.learning_rate=3e-3` (validated by the spec)."""
    raw = spec.model_dump()
    for item in overrides:
        key, _, value = item.partition("=")
        section, _, field = key.partition(".")
        if section not in raw or field not in raw[section]:
            raise SystemExit(f"--set {item}: unknown key {key!r}")
        raw[section][field] = type(raw[section][field])(value)
    return JobSpec.model_validate(raw)


def run(spec: JobSpec, seed: int, steps: int | None = None, verbose: bool = True) -> list[float]:
    algo = spec.algorithm
    steps = algo.steps if steps is None else steps
    t0 = time.perf_counter()
    learner = Learner(spec.model, algo, spec.task, seed=seed)
    warm = learner.warm_start(algo.warm_start_steps)
    engine = TorchEngine(spec.model, spec.rollout.engine_dtype, spec.rollout.engine_batch)
    engine.load_weights(0, learner.state_dict())
    if verbose:
        print(
            f"seed {seed}: warm start {algo.warm_start_steps} steps, loss {warm['loss']:.3f}, "
            f"{time.perf_counter() - t0:.2f}s"
        )
    rng = np.random.default_rng(seed)  # RL prompts, drawn as rlboost/trainer/runtime.py draws them
    rewards = []
    for step in range(steps):
        t1 = time.perf_counter()
        problems = learner.task.sample(rng, algo.prompts_per_step)
        samples = rollout_groups(
            engine, learner.task, problems, algo.group_size, algo.max_new_tokens, seed, step, algo.temperature
        )
        t2 = time.perf_counter()
        metrics = learner.train_step(samples)
        engine.load_weights(step + 1, learner.state_dict())
        rewards.append(metrics["reward_mean"])
        if verbose:
            print(
                f"step {step:3d}  reward {metrics['reward_mean']:.3f}  "
                f"gen {t2 - t1:.3f}s  train {time.perf_counter() - t2:.3f}s"
            )
    return rewards


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default: algorithm.seed")
    ap.add_argument("--steps", type=int, default=None, help="default: algorithm.steps")
    ap.add_argument("--quiet", action="store_true", help="only the per-seed summary")
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec = apply_overrides(JobSpec(name="learning-curve", rollout={"max_workers": 0}), args.overrides)
    for seed in args.seeds or [spec.algorithm.seed]:
        t0 = time.perf_counter()
        r = run(spec, seed, args.steps, verbose=not args.quiet)
        k = max(1, len(r) // 5)
        print(
            f"seed {seed}: reward first {k} steps {np.mean(r[:k]):.3f}, last {k} steps {np.mean(r[-k:]):.3f}, "
            f"total {time.perf_counter() - t0:.1f}s  curve {' '.join(f'{x:.2f}' for x in r)}"
        )


if __name__ == "__main__":
    main()
