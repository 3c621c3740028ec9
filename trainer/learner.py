"""The learner: TinyGPT in float32 + AdamW, a supervised warm start, and one GRPO update per step.

Deterministic given the seed: weights are initialised from a forked, seeded torch RNG (the global RNG
is left alone), warm-start problems come from a seeded numpy Generator, and the model has no dropout
and uses no nondeterministic kernels. (Pinning torch's thread count is the caller's job.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rlboost_cli.spec import AlgorithmSpec, ModelSpec, TaskSpec
from trainer.grpo import Sample, policy_gradient_loss, sample_advantages
from trainer.model import TinyGPT, from_spec, left_pad
from trainer.sampling import request_seed
from trainer.tasks import Problem, Task, make_task
from worker.engines.base import Engine, GenRequest

WARM_START_BATCH = 32
GRAD_CLIP = 1.0


class Learner:
    def __init__(
        self, model_spec: ModelSpec, algo_spec: AlgorithmSpec, task_spec: TaskSpec, seed: int | None = None
    ) -> None:
        self.seed = algo_spec.seed if seed is None else seed
        self.algo = algo_spec
        self.task: Task = make_task(task_spec)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.model = TinyGPT(from_spec(model_spec)).to(torch.float32)
        # One AdamW for the warm start and RL (see warm_start); no weight decay on a tiny model.
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=algo_spec.learning_rate, betas=(0.9, 0.99), weight_decay=0.0
        )
        self.steps_done = 0  # GRPO updates so far
        self._demo_rng = np.random.default_rng([self.seed, 1])  # warm-start problems

    # ---- supervised warm start ----------------------------------------------------------------

    def warm_start(self, steps: int) -> dict[str, float]:
        """`steps` supervised updates on task demonstrations (loss on answer + EOS only).

        Brief on purpose: it teaches the answer format and part of the task, and leaves the rest to
        RL. The optimizer carries over into RL: fresh Adam moments would make the first RL updates
        full-size sign steps on a noisy gradient, which measurably undoes part of the warm start."""
        loss = torch.tensor(float("nan"))
        for _ in range(steps):
            problems = self.task.sample(self._demo_rng, WARM_START_BATCH)
            prompts = [p.prompt_ids for p in problems]
            answers = [self.task.demo_ids(p)[len(p.prompt_ids) :] for p in problems]  # answer + EOS
            logp, mask = self._response_logp(prompts, answers, temperature=1.0)
            loss = -(logp * mask).sum() / mask.sum()
            self._update(loss)
        return {"loss": loss.item(), "steps": float(steps)}

    # ---- GRPO ---------------------------------------------------------------------------------

    def train_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One on-policy GRPO update from a step's samples (all groups of the step).

        Log-probs are taken at the sampling temperature (logits / T), i.e. of the distribution the
        responses were drawn from; advantages are normalised within each `Sample.group`."""
        if not samples:
            raise ValueError("train_step needs at least one sample")
        adv = sample_advantages(samples)
        logp, mask = self._response_logp(
            [s.prompt_ids for s in samples], [s.response_ids for s in samples], self.algo.temperature
        )
        loss = policy_gradient_loss(logp, adv, mask)
        grad_norm = self._update(loss)
        self.steps_done += 1
        return {
            "loss": loss.item(),
            "reward_mean": float(np.mean([s.reward for s in samples])),
            "adv_abs_mean": float(adv.abs().mean()),
            "tokens": float(mask.sum()),
            "grad_norm": grad_norm,
        }

    def _update(self, loss: Tensor) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
        return float(grad_norm)

    def _response_logp(
        self, prompts: Sequence[list[int]], responses: Sequence[list[int]], temperature: float
    ) -> tuple[Tensor, Tensor]:
        """Log-probs of each response token given prompt + earlier tokens: ([N, L-1], mask [N, L-1]).

        Rows are left padded, so row i's response occupies the last len(response_i) target columns."""
        idx, positions, mask = left_pad([[*p, *r] for p, r in zip(prompts, responses, strict=True)])
        logits, _ = self.model(idx[:, :-1], positions[:, :-1], mask[:, :-1])
        logp = F.log_softmax(logits.float() / temperature, dim=-1)
        logp = logp.gather(2, idx[:, 1:, None]).squeeze(2)
        width = idx.shape[1] - 1
        lens = torch.tensor([len(r) for r in responses])
        resp_mask = torch.arange(width)[None, :] >= (width - lens)[:, None]
        return logp * resp_mask, resp_mask

    # ---- weights and scoring ------------------------------------------------------------------

    def logprobs(self, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
        """Per-token log-probs of `response_ids` after `prompt_ids`, current weights, temperature 1."""
        if not response_ids:
            return []
        with torch.no_grad():
            logp, _ = self._response_logp([prompt_ids], [response_ids], temperature=1.0)
        return logp[0, -len(response_ids) :].tolist()

    def state_dict(self) -> dict[str, Tensor]:
        """Detached, contiguous CPU float32 copies; names are TinyGPT's parameter names."""
        return {k: v.detach().to("cpu", torch.float32).clone().contiguous() for k, v in self.model.state_dict().items()}

    def load_state_dict(self, tensors: Mapping[str, Tensor]) -> None:
        """Restore weights (e.g. from a checkpoint); optimizer state is not part of it."""
        self.model.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()})


def rollout_groups(
    engine: Engine,
    task: Task,
    problems: Sequence[Problem],
    group_size: int,
    max_new_tokens: int,
    job_seed: int,
    step: int,
    temperature: float = 1.0,
) -> list[Sample]:
    """Generate `group_size` responses per problem on one engine, in process, and score them.

    The path used when no coordinator is involved (tests, benchmarks/learning_curve.py). Request ids
    are `s{step}-p{i}-g{j}`, as trainer/runtime.py names them, and each request's sampling seed is
    request_seed(job_seed, rid), so with the same prompts the curves of the two paths agree."""
    requests, meta = [], {}
    for i, p in enumerate(problems):
        for j in range(group_size):
            rid = f"s{step}-p{i}-g{j}"
            requests.append(GenRequest(rid, p.prompt_ids, max_new_tokens, request_seed(job_seed, rid)))
            meta[rid] = (i, p)
    out: dict[str, list[int]] = {r.rid: [] for r in requests}

    def on_tokens(rid: str, offset: int, ids: list[int], logprobs: list[float]) -> None:
        assert offset == len(out[rid]), "tokens must arrive in order"
        out[rid].extend(ids)

    engine.generate(requests, on_tokens, lambda rid: False, temperature)
    return [Sample(p.prompt_ids, out[rid], task.reward(p, out[rid]), group=i) for rid, (i, p) in meta.items()]
