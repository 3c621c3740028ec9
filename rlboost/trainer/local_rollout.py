"""GRPO rollout on one engine, in process, with no coordinator: the path of tests and
benchmarks/learning_curve.py (the trainer's own goes through the rollout coordinator, runtime.py)."""

from __future__ import annotations

from collections.abc import Sequence

from rlboost.contracts.engine import Engine, GenRequest
from rlboost.contracts.sampling import request_id, request_seed
from rlboost.trainer.grpo import Sample
from rlboost.trainer.tasks import Problem, Task


def rollout_groups(
    engine: Engine,
    task: Task,
    problems: Sequence[Problem],
    group_size: int,
    max_new_tokens: int,
    job_seed: int,
    step: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> list[Sample]:
    """Generate `group_size` responses per problem on one engine, in process, and score them.

    The path used when no coordinator is involved (tests, benchmarks/learning_curve.py). Request ids
    are request_id(step, i, j), as rlboost/trainer/runtime.py names them, and each request's sampling seed is
    request_seed(job_seed, rid), so with the same prompts the curves of the two paths agree."""
    requests, meta = [], {}
    for i, p in enumerate(problems):
        for j in range(group_size):
            rid = request_id(step, i, j)
            requests.append(GenRequest(rid, p.prompt_ids, max_new_tokens, request_seed(job_seed, rid)))
            meta[rid] = (i, p)
    out: dict[str, list[int]] = {r.rid: [] for r in requests}
    lps: dict[str, list[float]] = {r.rid: [] for r in requests}

    def on_tokens(rid: str, offset: int, ids: list[int], logprobs: list[float]) -> None:
        assert offset == len(out[rid]), "tokens must arrive in order"
        out[rid].extend(ids)
        lps[rid].extend(logprobs)

    engine.generate(requests, on_tokens, lambda rid: False, temperature, top_k, top_p)
    return [
        Sample(p.prompt_ids, out[rid], task.reward(p, out[rid]), group=i, behaviour_logprobs=lps[rid])
        for rid, (i, p) in meta.items()
    ]
