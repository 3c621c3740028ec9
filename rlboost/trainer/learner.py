"""The learner: the policy (TinyGPT or a Hugging Face causal LM) + AdamW, a supervised warm start,
and one GRPO update per step; data-parallel or FSDP across torch.distributed ranks when given a
DistContext (rlboost/trainer/collectives.py; launched by rlboost/trainer/distributed.py).

Deterministic given the seed: weights are initialised from a forked, seeded torch RNG (the global RNG
is left alone), warm-start problems come from a seeded numpy Generator, and the model has no dropout
and uses no nondeterministic kernels. (Pinning torch's thread count is the caller's job.)

A GRPO update is streamed: `begin_step`, then `add_groups` with whole groups as they complete (the
trainer calls it while the tail of the step still generates remotely), then `finish_step` when the
step's last group is in, which takes the optimizer step. `train_step` is the same three calls with
every group at once, so there is one training path. Each `add_groups` runs forward/backward in
micro-batches (activation memory: one micro-batch) and gradients accumulate across calls. The loss is
the token mean (or, by algorithm.loss_agg_mode, the response mean) over the whole step, whose token
and response counts are known only at the end; gradients are linear in the loss, so each micro-batch's
weighted token-loss sum is divided by a provisional normaliser fixed at begin_step (from the step's
token budget, which keeps gradient magnitudes near their final size under fp16/bf16) and finish_step
multiplies the gradients by normaliser / true total before clipping and the optimizer step: the update
equals the whole-batch one up to float summation order.

The loss terms are trainer.grpo's: the PPO-clipped policy term, a KL penalty against a reference
model (a frozen copy of the weights GRPO started from, held only when algorithm.kl_coef > 0: one more
copy of the weights in memory, sharded like the policy under FSDP, and one more forward per
micro-batch) and an entropy bonus. With model.lora (rlboost/models/lora.py) only the adapters train and
publish, and the reference is the base: the policy with its adapters disabled, no copy.

With algorithm.ppo_mini_batch_size or ppo_epochs (several optimizer updates per step, as veRL), a step
is no longer one streamed update: add_groups computes each response's old log-probs (no grad, the
weights that generated it) and keeps the samples, and finish_step makes the updates, mini-batches of
whole groups in group-id order (not arrival order, so the result does not depend on it), each its own
normalised loss; from the second update on the ratio pi / pi_old differs from 1 and the clip acts.

DAPO's knobs (arXiv 2503.14476) act on whole groups as they are added: algorithm.overlong_buffer adds
the soft overlong punishment to each response's reward before its group's advantages (the metrics'
reward_mean stays the task reward; overlong_penalty_mean is the mean added), and with
algorithm.dynamic_sampling the groups whose rewards are all equal are left out of the update, so the
loss is normalised over the remaining groups' tokens (or responses) only, streamed or whole-batch
alike; the batch is not refilled (groups_dropped counts them), and a step with no group left makes
no update (update_skipped).

With algorithm.rollout_correction (level token or sequence) each token's policy term is weighted by
the truncated ratio of pi_old to the engine's behaviour log-prob that came with the sample
(rlboost/trainer/rollout_correction.py); a sample without them is refused.

Across ranks every rank is given the same groups (the same samples); each takes every world-th sample
of each `add_groups` call, and gradients are summed over ranks (all-reduce, or FSDP's reduce-scatter),
so the update equals the single-process one up to float summation order.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, TaskSpec
from rlboost.models import lora
from rlboost.models.tiny_gpt import TinyGPT, from_spec, left_pad
from rlboost.trainer import learner_state
from rlboost.trainer.grpo import (
    Sample,
    agg_units,
    clipped_ratio,
    entropy,
    informative_groups,
    kl_penalty,
    overlong_penalty,
    sample_advantages,
    token_weights,
)
from rlboost.trainer.learner_state import local_shard, materialize, meta_frozen_copy
from rlboost.trainer.lr_schedule import LrSchedule, lr_at
from rlboost.trainer.rollout_correction import WeightSums, check_behaviour, is_weights, right_aligned
from rlboost.trainer.tasks import Task, make_task

if TYPE_CHECKING:
    from rlboost.trainer.collectives import DistContext

WARM_START_BATCH = 32

__all__ = ["Learner", "Sample", "make_learner"]


@dataclass
class _StepSums:
    """What a streamed update accumulates besides gradients (finish_step turns it into metrics)."""

    norm: float  # the provisional loss normaliser of begin_step
    loss: float = 0.0  # this rank's loss share, divided by norm
    pg: float = 0.0  # of which the policy-gradient (PPO-clipped) term's
    # this rank's token sums of the loss terms, for the step's metrics
    kl: float = 0.0
    entropy: float = 0.0
    clipped: float = 0.0
    tokens: int = 0
    samples: int = 0
    reward_sum: float = 0.0
    adv_abs_sum: float = 0.0
    groups: set[int] = field(default_factory=set)
    # what trains, after DAPO's dynamic sampling (algorithm.dynamic_sampling) drops the groups whose
    # rewards are all equal; without it, every sample: the loss is normalised by these
    trained_tokens: int = 0
    trained_samples: int = 0
    trained_groups: set[int] = field(default_factory=set)
    groups_dropped: int = 0
    overlong_sum: float = 0.0  # the overlong penalties added to the rewards (algorithm.overlong_buffer)
    weights: WeightSums = field(default_factory=WeightSums)  # algorithm.rollout_correction's weights
    # several updates per step: the samples, their advantages and old log-probs, kept for finish_step
    kept: list[tuple[Sample, float, Tensor]] = field(default_factory=list)


class Learner:
    def __init__(
        self,
        model_spec: ModelSpec,
        algo_spec: AlgorithmSpec,
        task_spec: TaskSpec,
        seed: int | None = None,
        task: Task | None = None,
        dist: DistContext | None = None,
        device: str | None = None,
    ) -> None:
        self.seed = algo_spec.seed if seed is None else seed
        self.algo = algo_spec
        self.task: Task = task if task is not None else make_task(task_spec, model_spec)
        self.dist = dist
        self.rank, self.world = (dist.rank, dist.world_size) if dist else (0, 1)
        self.hf = model_spec.kind == "hf"
        self.lora = model_spec.lora if self.hf else None  # adapters only train (rlboost/models/lora.py)
        if device is None:
            device = dist.device if dist else ("cuda" if self.hf and torch.cuda.is_available() else "cpu")
        self.device = torch.device(device)
        if self.hf:
            from rlboost.models import hf

            # float32 master weights; bfloat16/float16 models compute under autocast on a GPU and are
            # published in model.dtype (what the engines run)
            self.publish_dtype = hf.TORCH_DTYPES[model_spec.dtype]
            self.model: nn.Module = hf.from_pretrained(model_spec, torch.float32, self.device)
            if self.lora is not None:
                with torch.random.fork_rng(devices=[]):  # the adapters' init, seeded
                    torch.manual_seed(self.seed)
                    self.model = lora.wrap(self.model, self.lora)
            self.model.train()
            limit = hf.max_model_len(model_spec, self.model.config)
            longest = getattr(self.task, "max_prompt_len", 0) + algo_spec.max_new_tokens
            if longest > limit:  # found here, not as an engine error in every worker
                raise ValueError(
                    f"the longest prompt + algorithm.max_new_tokens is {longest} tokens, over the model's "
                    f"max_model_len {limit}: raise model.max_model_len, lower max_new_tokens, or shorten prompts"
                )
        else:
            self.publish_dtype = torch.float32
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                self.model = TinyGPT(from_spec(model_spec)).to(torch.float32).to(self.device)
        # the ids the model can take: a worker's token id at or past this is refused at the coordinator
        # (rollout/book.py), before the embedding lookup here would fail on it (read before FSDP shards)
        self.vocab_size = learner_state.vocab_size(self.model)
        low = self.device.type == "cuda" and self.publish_dtype != torch.float32
        self.autocast = self.publish_dtype if low else None
        self.fsdp = dist is not None and dist.strategy == "fsdp"
        # Under FSDP, the KL reference's sharded module, made here (as veRL's ref worker holds its own
        # sharded copy): a structural copy of the policy sharded the same way, so each rank's local
        # shards line up with its policy shards; its weights are the policy's at the first GRPO step
        # (_frozen_copy copies the local shards, no gather) or a checkpoint's (load_checkpoint_state).
        self._sharded_reference: nn.Module | None = None
        if dist is not None and self.fsdp:
            from rlboost.trainer.collectives import shard_model

            if algo_spec.kl_coef > 0:
                self._sharded_reference = meta_frozen_copy(self.model)
                shard_model(self._sharded_reference, dist)
                materialize(self._sharded_reference, self.device)
            shard_model(self.model, dist)
        # One AdamW for the warm start and RL (see warm_start). algorithm.betas / weight_decay /
        # grad_clip default to the values fixed before they were knobs: (0.9, 0.99), 0 (no weight decay
        # on a tiny model), 1.0.
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],  # with LoRA: the adapters only
            lr=algo_spec.learning_rate,
            betas=tuple(algo_spec.betas),
            weight_decay=algo_spec.weight_decay,
        )
        self.schedule = LrSchedule.of(algo_spec)
        self.steps_done = 0  # GRPO updates so far
        self._acc: _StepSums | None = None  # the streamed update in progress (begin_step .. finish_step)
        # the KL penalty's frozen reference: the weights at the first GRPO step (after the warm start)
        self.reference: nn.Module | None = None
        self._demo_rng = np.random.default_rng([self.seed, 1])  # warm-start problems

    # ---- supervised warm start ----------------------------------------------------------------

    def warm_start(self, steps: int) -> dict[str, float]:
        """`steps` supervised updates on task demonstrations (loss on answer + EOS only).

        Brief on purpose: it teaches the answer format and part of the task, and leaves the rest to
        RL. The optimizer carries over into RL: fresh Adam moments would make the first RL updates
        full-size sign steps on a noisy gradient, which measurably undoes part of the warm start."""
        loss = float("nan")
        if steps and self._scheduled():
            self._set_lr(self.algo.learning_rate)  # the warm start is not on the RL schedule
        for _ in range(steps):
            problems = self.task.sample(self._demo_rng, WARM_START_BATCH)  # the same on every rank
            prompts = [p.prompt_ids for p in problems]
            answers = [self.task.demo_ids(p)[len(p.prompt_ids) :] for p in problems]  # answer + EOS
            loss = self._accumulate(prompts, answers, torch.ones(len(problems)), temperature=1.0)
            self._update()
        return {"loss": loss, "steps": float(steps)}

    # ---- GRPO ---------------------------------------------------------------------------------

    def train_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One on-policy GRPO update from a step's samples (all groups of the step): the streamed
        update fed every group at once, normalised by the exact token count from the start."""
        if not samples:
            raise ValueError("train_step needs at least one sample")
        kept, _, _ = self._trainable(samples)
        self._begin(agg_units([len(s.response_ids) for s in kept], self.algo.loss_agg_mode))
        self.add_groups(samples)
        return self.finish_step()

    def begin_step(self, token_budget: int | None = None) -> None:
        """Start a streamed GRPO update. token_budget: a provisional loss normaliser (e.g. the step's
        responses x max_new_tokens); any positive value gives the same update, a close one keeps the
        accumulated gradients at their final scale."""
        budget = float(token_budget or 1)
        if self.algo.loss_agg_mode != "token-mean":  # normalised by responses: the budget's response count
            budget /= self.algo.max_new_tokens
        self._begin(budget)

    def _begin(self, norm: float) -> None:
        if self.algo.kl_coef > 0 and self.reference is None:
            if self.steps_done > 0:  # resumed from a checkpoint written without one
                raise ValueError(
                    "algorithm.kl_coef > 0 but the checkpoint resumed from has no reference model (it was "
                    "written with kl_coef 0); keep kl_coef 0 for this run or start it afresh"
                )
            self.reference = self._frozen_copy()
        self.optimizer.zero_grad(set_to_none=True)
        self._acc = _StepSums(norm=max(1.0, norm))

    def _frozen_copy(self) -> nn.Module:
        if self._sharded_reference is not None:  # FSDP: this rank's shards of the policy, copied
            ref = self._sharded_reference
            with torch.no_grad():
                for r, p in zip(ref.parameters(), self.model.parameters(), strict=True):
                    local_shard(r).copy_(local_shard(p))
            return ref
        if self.lora is not None:  # the base: the policy with its adapters disabled, no copy
            return lora.AdapterFree(self.model)
        ref = copy.deepcopy(self.model)
        ref.requires_grad_(False)
        return ref.eval()

    def _trainable(self, samples: Sequence[Sample]) -> tuple[list[Sample], float, int]:
        """DAPO's knobs on whole groups: (the samples that train, rewards shaped; the sum of the overlong
        penalties added; the number of groups dropped). algorithm.overlong_buffer adds the soft overlong
        punishment to each reward (copies: the caller's samples keep the task reward); with
        algorithm.dynamic_sampling the groups whose (shaped) rewards are all equal, which have zero
        advantage, are left out, KL and entropy terms included (as DAPO and veRL filter the batch)."""
        a = self.algo
        out, penalties = list(samples), 0.0
        if a.overlong_buffer is not None:
            b = a.overlong_buffer
            pens = [overlong_penalty(len(s.response_ids), a.max_new_tokens, b.length, b.penalty) for s in out]
            out = [dataclasses.replace(s, reward=s.reward + p) if p else s for s, p in zip(out, pens, strict=True)]
            penalties = float(sum(pens))
        dropped = 0
        if a.dynamic_sampling:
            keep = informative_groups(out)
            dropped = len({s.group for s in out} - keep)
            out = [s for s in out if s.group in keep]
        return out, penalties, dropped

    def add_groups(self, samples: Sequence[Sample]) -> None:
        """Forward/backward on whole groups (every response of each group present, as they complete):
        advantages are normalised within each `Sample.group`, log-probs are taken at the sampling
        temperature (logits / T), i.e. of the distribution the responses were drawn from, and the
        gradient of -sum A * log pi / normaliser is added to the step's (trainer.grpo loss, unscaled)."""
        acc = self._acc
        if acc is None:
            raise RuntimeError("add_groups before begin_step")
        groups = {s.group for s in samples}
        if groups & acc.groups:  # a group split over calls would get advantages from half its rewards
            raise ValueError(f"groups {sorted(groups & acc.groups)} were already added this step")
        if not samples:
            return
        check_behaviour(samples, self.algo.rollout_correction.level)
        acc.groups |= groups
        acc.tokens += sum(len(s.response_ids) for s in samples)
        acc.samples += len(samples)
        acc.reward_sum += float(sum(s.reward for s in samples))  # the task reward, before any shaping
        trained, penalties, dropped = self._trainable(samples)
        acc.overlong_sum += penalties
        acc.groups_dropped += dropped
        if not trained:  # dynamic sampling dropped every group of this call
            return
        acc.trained_groups |= {s.group for s in trained}
        acc.trained_tokens += sum(len(s.response_ids) for s in trained)
        acc.trained_samples += len(trained)
        adv = sample_advantages(trained)
        prompts, responses = [s.prompt_ids for s in trained], [s.response_ids for s in trained]
        if self._updates_per_step_vary():
            olds = self._old_logprobs(prompts, responses)
            acc.kept += [(s, float(a), o) for s, a, o in zip(trained, adv, olds, strict=True)]
        else:
            behaviour = [s.behaviour_logprobs for s in trained]
            acc.loss += self._backward(prompts, responses, self._grpo_loss(prompts, responses, adv, acc, behaviour))
        acc.adv_abs_sum += float(adv.abs().sum())

    def _updates_per_step_vary(self) -> bool:
        """Several optimizer updates per step (PPO mini-batches or epochs) rather than one."""
        return self.algo.ppo_epochs > 1 or self.algo.ppo_mini_batch_size is not None

    def _old_logprobs(self, prompts: Sequence[list[int]], responses: Sequence[list[int]]) -> list[Tensor]:
        """Each response's log-probs under the current weights (those that generated it; newer ones under
        algorithm.max_staleness, where rollout correction weighs the difference), no grad.

        Every rank computes every row, in the same passes (FSDP pairs its collectives across ranks):
        the mini-batches of finish_step split the rows over ranks differently."""
        mb = self.algo.micro_batch_size or max(1, len(prompts))
        out: list[Tensor] = []
        with torch.no_grad():
            for k in range(0, len(prompts), mb):
                rs = responses[k : k + mb]
                logp, _, _ = self._response_logp(prompts[k : k + mb], rs, self.algo.temperature)
                out += [logp[j, logp.shape[1] - len(r) :].clone() for j, r in enumerate(rs)]
        return out

    def _grpo_loss(
        self,
        prompts: Sequence[list[int]],
        responses: Sequence[list[int]],
        adv: Tensor,
        acc: _StepSums,
        behaviour: Sequence[list[float] | None],
        old: Sequence[Tensor] | None = None,
    ) -> Callable[[list[int]], Tensor]:
        """The loss of some rows (trainer.grpo's terms), over acc.norm; behaviour: each row's engine
        log-probs (algorithm.rollout_correction); old: each row's log-probs under the weights that
        generated it (None: the current weights)."""
        a, rc = self.algo, self.algo.rollout_correction

        def loss_of(rows: list[int]) -> Tensor:
            p, r = [prompts[i] for i in rows], [responses[i] for i in rows]
            logp, mask, ent = self._response_logp(p, r, a.temperature, with_entropy=a.entropy_coeff > 0)
            c = adv[rows].to(logp.device, logp.dtype)
            w = token_weights(mask, a.loss_agg_mode, logp.dtype)
            if old is None:
                # Strictly on-policy: every response was generated by these weights, so pi_old is the
                # learner's own log-prob (not the engine's, which differs numerically): ratio == 1
                # exactly and the gradient is the plain policy gradient, bit for bit.
                old_logp = logp.detach()
            else:  # the rows' log-probs from before this step's first update, placed like logp's
                old_logp = right_aligned([old[i] for i in rows], logp)
            surrogate, clipped = clipped_ratio(logp, old_logp, c, a.clip_ratio_low, a.clip_ratio_high)
            pg = c[:, None] * surrogate
            if rc.level != "none":  # truncated importance sampling: pi_old / the engine's pi, detached
                beh = right_aligned([behaviour[i] or [] for i in rows], logp, torch.float64)
                correction = is_weights(old_logp, beh, mask, rc.level, rc.threshold)
                pg = pg * correction.weights
                acc.weights.add(correction, mask)
            loss = -(pg * w).sum() / acc.norm
            acc.clipped += float((clipped & mask).sum())
            acc.pg += float(loss.detach())
            if a.kl_coef > 0:
                assert self.reference is not None
                with torch.no_grad():
                    ref_logp, _, _ = self._response_logp(p, r, a.temperature, model=self.reference)
                kl = kl_penalty(logp, ref_logp, a.kl_estimator)
                loss = loss + a.kl_coef * (kl * w).sum() / acc.norm
                acc.kl += float((kl.detach() * mask).sum())
            if ent is not None:
                loss = loss - a.entropy_coeff * (ent * w).sum() / acc.norm
                acc.entropy += float((ent.detach() * mask).sum())
            return loss

        return loss_of

    def finish_step(self) -> dict[str, float]:
        """The step's last group is in: rescale the accumulated gradients to the token mean (or
        response mean) over the whole step, clip, take the optimizer step (or, with PPO mini-batches
        or epochs, make the step's updates)."""
        acc = self._acc
        if acc is None or acc.samples == 0:
            raise ValueError("finish_step needs at least one sample added since begin_step")
        self._acc = None
        if acc.trained_samples == 0:  # dynamic sampling dropped every group: no update at all
            return self._no_update(acc)
        if acc.kept:
            return self._ppo_updates(acc)
        total = max(1, acc.trained_tokens if self.algo.loss_agg_mode == "token-mean" else acc.trained_samples)
        rescale = acc.norm / total
        if rescale != 1.0:  # exactly 1 on the whole-batch path: its numbers are unchanged
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(rescale)
        loss, pg, kl, ent, clipped = self._sum_over_ranks(acc.loss, acc.pg, acc.kl, acc.entropy, acc.clipped)
        self._schedule_lr()
        grad_norm = self._update()
        self.steps_done += 1
        tokens = max(1, acc.trained_tokens)
        metrics = {
            "loss": loss * rescale,
            "pg_loss": pg * rescale,  # the policy-gradient term of loss (loss less the KL and entropy terms)
            "reward_mean": acc.reward_sum / acc.samples,
            "adv_abs_mean": acc.adv_abs_sum / acc.samples,
            "tokens": float(acc.tokens),
            "grad_norm": grad_norm,  # the global L2 norm before clipping
            "lr": self._lr(),  # the rate of the update
            "updates": 1.0,  # optimizer updates in the step
            "clip_frac": clipped / tokens,  # share of tokens whose ratio was clipped (0 while on-policy)
        }
        if self.algo.kl_coef > 0:
            metrics["kl"] = kl / tokens  # token mean of the estimate
        if self.algo.entropy_coeff > 0:
            metrics["entropy"] = ent / tokens
        return {**metrics, **self._dapo_metrics(acc), **self._correction_metrics(acc.weights)}

    def _dapo_metrics(self, acc: _StepSums, skipped: bool = False) -> dict[str, float]:
        """The DAPO knobs' step metrics, only where the knob is on (the default's metrics are unchanged)."""
        out: dict[str, float] = {}
        if self.algo.overlong_buffer is not None:  # mean added reward (<= 0); reward_mean stays the task's
            out["overlong_penalty_mean"] = acc.overlong_sum / acc.samples
        if self.algo.dynamic_sampling:
            out["groups_dropped"] = float(acc.groups_dropped)
            out["update_skipped"] = float(skipped)
        return out

    def _correction_metrics(self, sums: WeightSums) -> dict[str, float]:
        """algorithm.rollout_correction's step metrics over every rank's tokens (none while it is off)."""
        if self.algo.rollout_correction.level == "none":
            return {}
        if self.world > 1:
            import torch.distributed as tdist

            sums.total, sums.clipped, sums.tokens = self._sum_over_ranks(sums.total, sums.clipped, sums.tokens)
            peak = torch.tensor([sums.peak], dtype=torch.float64, device=self.device)
            tdist.all_reduce(peak, op=tdist.ReduceOp.MAX)
            sums.peak = float(peak)
        return sums.metrics()

    def _no_update(self, acc: _StepSums) -> dict[str, float]:
        """Every group of the step was dropped (dynamic sampling): nothing to train on, so the weights
        and the optimizer's state stay as they are (no division by zero, no Adam step on a zero
        gradient); the step still counts."""
        self.optimizer.zero_grad(set_to_none=True)
        self._schedule_lr()  # the rate this step would have used: metrics.jsonl's lr column stays whole
        self.steps_done += 1
        metrics = {
            "loss": 0.0,
            "pg_loss": 0.0,
            "reward_mean": acc.reward_sum / acc.samples,
            "adv_abs_mean": 0.0,
            "tokens": float(acc.tokens),
            "grad_norm": 0.0,
            "lr": self._lr(),
            "updates": 0.0,
            "clip_frac": 0.0,
        }
        return {**metrics, **self._dapo_metrics(acc, skipped=True)}

    def _ppo_updates(self, acc: _StepSums) -> dict[str, float]:
        """ppo_epochs passes over the step's samples, one optimizer update per mini-batch of
        ppo_mini_batch_size groups; the metrics are means over the updates."""
        a = self.algo
        groups = sorted(acc.trained_groups)
        size = a.ppo_mini_batch_size or len(groups)
        loss = pg = kl = ent = clipped = grad_norm = 0.0
        updates = 0
        self._schedule_lr()  # every update of a step at the step's rate
        for _ in range(a.ppo_epochs):
            for k in range(0, len(groups), size):
                chunk = set(groups[k : k + size])
                rows = [(s, adv, old) for s, adv, old in acc.kept if s.group in chunk]
                prompts, responses = [s.prompt_ids for s, _, _ in rows], [s.response_ids for s, _, _ in rows]
                self.optimizer.zero_grad(set_to_none=True)
                sums = _StepSums(norm=float(max(1, agg_units([len(r) for r in responses], a.loss_agg_mode))))
                advs = torch.tensor([adv for _, adv, _ in rows])
                olds = [old for _, _, old in rows]
                behaviour = [s.behaviour_logprobs for s, _, _ in rows]
                loss_of = self._grpo_loss(prompts, responses, advs, sums, behaviour, olds)
                part = self._backward(prompts, responses, loss_of)
                acc.weights.merge(sums.weights)
                totals = self._sum_over_ranks(part, sums.pg, sums.kl, sums.entropy, sums.clipped)
                loss, pg, kl, ent, clipped = (
                    x + y for x, y in zip((loss, pg, kl, ent, clipped), totals, strict=True)
                )
                grad_norm += self._update()
                updates += 1
        self.steps_done += 1
        token_updates = max(1, acc.trained_tokens) * a.ppo_epochs  # every token is seen once per epoch
        metrics = {
            "loss": loss / updates,
            "pg_loss": pg / updates,
            "reward_mean": acc.reward_sum / acc.samples,
            "adv_abs_mean": acc.adv_abs_sum / acc.samples,
            "tokens": float(acc.tokens),
            "grad_norm": grad_norm / updates,  # the mean over the updates, each before clipping
            "lr": self._lr(),
            "clip_frac": clipped / token_updates,
            "updates": float(updates),
        }
        if a.kl_coef > 0:
            metrics["kl"] = kl / token_updates
        if a.entropy_coeff > 0:
            metrics["entropy"] = ent / token_updates
        return {**metrics, **self._dapo_metrics(acc), **self._correction_metrics(acc.weights)}

    def _accumulate(
        self, prompts: Sequence[list[int]], responses: Sequence[list[int]], coef: Tensor, temperature: float
    ) -> float:
        """Backward of -sum_i coef_i * sum_t log pi(response_it) / (all response tokens); the loss
        summed over ranks (the warm start's whole-batch path)."""
        norm = float(max(1, sum(len(r) for r in responses)))

        def loss_of(rows: list[int]) -> Tensor:
            logp, mask, _ = self._response_logp([prompts[i] for i in rows], [responses[i] for i in rows], temperature)
            c = coef[rows].to(logp.device, logp.dtype)
            return -(c[:, None] * logp * mask).sum() / norm

        return self._sum_over_ranks(self._backward(prompts, responses, loss_of))[0]

    def _backward(
        self, prompts: Sequence[list[int]], responses: Sequence[list[int]], loss_of: Callable[[list[int]], Tensor]
    ) -> float:
        """Backward of loss_of(rows) over this rank's share of the rows, in micro-batches; returns this
        rank's part of that loss."""
        mine = list(range(self.rank, len(prompts), self.world))
        mb = self.algo.micro_batch_size or max(1, math.ceil(len(prompts) / self.world))
        # every rank runs the same number of passes (FSDP's collectives pair up across ranks)
        passes = max(1, math.ceil(math.ceil(len(prompts) / self.world) / mb))
        # FSDP averages gradients over ranks; the loss here is already a share of a global sum
        scale = float(self.world) if self.dist is not None and self.dist.strategy == "fsdp" else 1.0
        loss_sum = 0.0
        for k in range(passes):
            rows = mine[k * mb : (k + 1) * mb]
            if rows:
                loss = loss_of(rows)
            else:  # a rank with no rows left still takes part: a zero-weight pass over a dummy row
                dummy = [prompts[0]], [responses[0] or [0]]
                logp, _, _ = self._response_logp(*dummy, 1.0)
                loss = (logp * 0.0).sum()
                if self.fsdp and self.reference is not None:  # the others' reference forwards gather too
                    with torch.no_grad():
                        self._response_logp(*dummy, 1.0, model=self.reference)
            (loss * scale).backward()
            loss_sum += float(loss.detach())
        return loss_sum

    def _sum_over_ranks(self, *xs: float) -> list[float]:
        if self.world == 1:
            return list(xs)
        import torch.distributed as tdist

        t = torch.tensor(xs, dtype=torch.float64, device=self.device)
        tdist.all_reduce(t)  # one collective for all of them
        return t.tolist()

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def _schedule_lr(self) -> None:
        """The rate of the step about to update (algorithm.lr_schedule, by steps_done, so a resumed
        run picks up where it was). A constant rate with no warm-up leaves the optimizer's rate as it
        was built (algorithm.learning_rate), as before the schedule existed."""
        if self._scheduled():
            self._set_lr(lr_at(self.steps_done, self.schedule))

    def _scheduled(self) -> bool:
        return self.schedule.kind != "constant" or self.schedule.warmup_steps > 0

    def _update(self) -> float:
        """All-reduce (ddp), clip to algorithm.grad_clip, take the optimizer step; returns the
        gradient's global L2 norm before clipping."""
        if self.dist is not None and self.dist.strategy == "ddp":
            from rlboost.trainer.collectives import all_reduce_grads

            all_reduce_grads(self.model)
        clip = self.algo.grad_clip if self.algo.grad_clip is not None else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(grad_norm)

    def _logits(self, model: nn.Module, idx: Tensor, positions: Tensor, mask: Tensor) -> Tensor:
        if self.hf:
            from rlboost.models import hf

            with torch.autocast(self.device.type, dtype=self.autocast, enabled=self.autocast is not None):
                logits, _ = hf.forward(model, idx, positions, mask)
            return logits
        logits, _ = model(idx, positions, mask)
        return logits

    def _response_logp(
        self,
        prompts: Sequence[list[int]],
        responses: Sequence[list[int]],
        temperature: float,
        model: nn.Module | None = None,
        with_entropy: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Log-probs of each response token given prompt + earlier tokens under `model` (default: the
        policy): ([N, L-1], mask [N, L-1], entropy [N, L-1] of each position's distribution if asked).

        Rows are left padded, so row i's response occupies the last len(response_i) target columns."""
        idx, positions, mask = left_pad([[*p, *r] for p, r in zip(prompts, responses, strict=True)], self.device)
        logits = self._logits(model if model is not None else self.model, idx[:, :-1], positions[:, :-1], mask[:, :-1])
        if logits.element_size() < 4:  # half precision: log-softmax in float32 (float64 stays)
            logits = logits.float()
        log_probs = F.log_softmax(logits / temperature, dim=-1)
        logp = log_probs.gather(2, idx[:, 1:, None]).squeeze(2)
        width = idx.shape[1] - 1
        lens = torch.tensor([len(r) for r in responses], device=self.device)
        resp_mask = torch.arange(width, device=self.device)[None, :] >= (width - lens)[:, None]
        # where(), not a product: a padding row's logits may be anything (even NaN) and must not leak
        zeros = torch.zeros_like(logp)
        ent = torch.where(resp_mask, entropy(log_probs), zeros) if with_entropy else None
        return torch.where(resp_mask, logp, zeros), resp_mask, ent

    # ---- weights and scoring ------------------------------------------------------------------

    def logprobs(self, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
        """Per-token log-probs of `response_ids` after `prompt_ids`, current weights, temperature 1."""
        if not response_ids:
            return []
        with torch.no_grad():
            logp, _, _ = self._response_logp([prompt_ids], [response_ids], temperature=1.0)
        return logp[0, -len(response_ids) :].tolist()

    def state_dict(self) -> dict[str, Tensor]:
        """Detached, contiguous CPU copies in the publish dtype (float32 for tiny-gpt; model.dtype for
        hf). Names are the model's parameter names (an hf model's checkpoint names, tied weights once).
        Under FSDP every rank must call this (it gathers the shards)."""
        params = dict(self.model.named_parameters())
        if self.lora is not None:  # the adapters only: engines merge them into the base they hold
            params = lora.adapter_tensors(self.model)
        elif not self.hf:
            params = dict(self.model.state_dict())
        out = {}
        for k, v in params.items():
            v = v.detach()
            if hasattr(v, "full_tensor"):
                v = v.full_tensor()
            # cast where the weights live, then copy: on an H200, casting on the way to the host took
            # 1.61 s for a 0.5 B model in bf16, this 0.76 s (BENCHMARKS.md, "The CUDA paths")
            out[k] = v.to(self.publish_dtype).to("cpu", copy=True).contiguous()
        return out

    def checkpoint_state(self) -> dict:
        """Everything a resumed run needs to continue bit for bit (rlboost/trainer/learner_state.py);
        under FSDP every rank must call this (it gathers the shards)."""
        return learner_state.checkpoint_state(self)

    def load_checkpoint_state(self, state: Mapping) -> None:
        """Restore checkpoint_state's dict; under FSDP every rank must call this with the same state."""
        learner_state.load_checkpoint_state(self, state)

    def load_state_dict(self, tensors: Mapping[str, Tensor]) -> None:
        """Restore weights (e.g. from a checkpoint); optimizer state is not part of it."""
        if self.lora is not None:
            lora.load_adapters(self.model, tensors)
            return
        if self.hf:
            own = dict(self.model.named_parameters())
            with torch.no_grad():
                for k, v in tensors.items():
                    own[k].copy_(torch.as_tensor(v))
            return
        self.model.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()})


def make_learner(spec, dist: DistContext | None = None):
    """The learner for a job (JobSpec); under torchrun, rank 0's handle that drives every rank."""
    learner = Learner(spec.model, spec.algorithm, spec.task, seed=spec.algorithm.seed, dist=dist)
    if dist is None or dist.world_size == 1:
        return learner
    from rlboost.trainer.collectives import LeaderLearner

    return LeaderLearner(learner)
