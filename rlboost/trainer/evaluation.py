"""Validation (`task.eval_every`): one response per held-out problem from a given weights version,
scored by the task's reward; reported as pass@1 (share of problems whose response scores >= 1.0,
i.e. is correct under a 0/1 verifier) and the mean reward.

It runs on the trainer, in a thread beside the next step, with its own torch engine: the rollout
engines (the reserved one and every spot worker) never stop for it, and the weights it scores are a
copy taken when the version was published, so training on does not change what is evaluated.
Greedy by default (eval_temperature 0); a sampled evaluation uses the job's per-request seeding, so
it is reproducible too. The cost: a second copy of the weights on the trainer, in the engine dtype.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from rlboost.contracts.engine import GenRequest
from rlboost.contracts.sampling import request_seed
from rlboost.contracts.spec import JobSpec
from rlboost.contracts.stop import StopCollector, stop_rule
from rlboost.trainer.tasks import Problem, Task

PASS_AT = 1.0  # a response passes when its reward reaches this


class Evaluator:
    def __init__(self, spec: JobSpec, task: Task) -> None:
        self.spec, self.task = spec, task
        t = spec.task
        self.problems: list[Problem] = task.eval_problems(spec.algorithm.seed, t.eval_size)
        if not self.problems:
            raise ValueError("task.eval_every is set but the task has no held-out problems")
        self.stop = stop_rule(spec.algorithm.stop, task.decode_response)
        self._engine = None  # built on first use (an hf model loads its config and tokenizer)

    def _engine_for(self):
        if self._engine is None:
            from rlboost.models.torch_engine import TorchEngine

            ro, m = self.spec.rollout, self.spec.model
            dtype = ro.engine_dtype
            if dtype == "auto" or ro.engine != "torch":  # a vLLM job: evaluate in the model's own dtype
                dtype = m.dtype if m.kind == "hf" else "float32"
            self._engine = TorchEngine(m, dtype=dtype, max_batch=ro.engine_batch, eos_id=self.task.eos_id)
        return self._engine

    def run(self, version: int, tensors: Mapping[str, object]) -> dict:
        """Evaluate weights `version` (blocking; the trainer calls it in a thread)."""
        t0 = time.monotonic()
        engine = self._engine_for()
        engine.load_weights(version, tensors)
        algo, temp = self.spec.algorithm, self.spec.task.eval_temperature
        requests = []
        for i, p in enumerate(self.problems):
            rid = f"eval-v{version}-p{i}"
            requests.append(GenRequest(rid, list(p.prompt_ids), algo.max_new_tokens, request_seed(algo.seed, rid)))
        # algorithm.stop ends held-out responses as it ends rollouts (contracts/stop.py)
        got = StopCollector([r.rid for r in requests], self.stop)
        engine.generate(requests, got.on_tokens, got.should_abort, temp)
        out = got.tokens
        rewards = [self.task.reward(p, out[r.rid]) for p, r in zip(self.problems, requests, strict=True)]
        return {
            "version": version,
            "pass@1": sum(r >= PASS_AT for r in rewards) / len(rewards),
            "mean_reward": sum(rewards) / len(rewards),
            "problems": len(rewards),
            "temperature": temp,
            "tokens": sum(len(v) for v in out.values()),
            "seconds": round(time.monotonic() - t0, 3),
        }


def describe(ev: dict) -> str:
    """The log line of one evaluation."""
    how = "greedy" if ev["temperature"] == 0 else f"temperature {ev['temperature']:g}"
    return (
        f"eval  version {ev['version']:>3}  pass@1 {ev['pass@1']:.3f}  mean reward {ev['mean_reward']:.3f}"
        f"  ({ev['problems']} held-out problems, {how}, {ev['seconds']:.2f}s)"
    )
