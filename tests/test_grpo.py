"""GRPO math, the learner, and an end-to-end check that the default job learns."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, TaskSpec
from rlboost.models.torch_engine import TorchEngine
from rlboost.models.vocab import EOS
from rlboost.trainer.grpo import Sample, group_advantages, policy_gradient_loss, sample_advantages
from rlboost.trainer.learner import Learner
from rlboost.trainer.local_rollout import rollout_groups
from tests.torch_threads import one_thread  # noqa: F401  (autouse: single-threaded torch)

# ---- advantages and loss ------------------------------------------------------------------------


def test_group_advantages_values() -> None:
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    adv = group_advantages(r)
    std1 = np.std([1, 0, 0, 0], ddof=1)
    expected = torch.tensor(
        [
            [0.75 / std1, -0.25 / std1, -0.25 / std1, -0.25 / std1],
            [0.5 / np.std([1, 1, 0, 0], ddof=1)] * 2 + [-0.5 / np.std([1, 1, 0, 0], ddof=1)] * 2,
            [0.0] * 4,  # all equal: no signal, exactly zero
        ],
        dtype=torch.float32,
    )
    torch.testing.assert_close(adv, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(adv[2], torch.zeros(4))
    torch.testing.assert_close(adv.sum(dim=1), torch.zeros(3), rtol=0, atol=1e-6)


def test_group_advantages_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(8))
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(3, 1))


def _s(reward: float, group: int, n: int = 2) -> Sample:
    return Sample(prompt_ids=[1, 5, 3], response_ids=[5] * (n - 1) + [EOS], reward=reward, group=group)


def test_sample_advantages_group_by_id_in_any_order() -> None:
    samples = [_s(1, 7), _s(0, 3), _s(0, 7), _s(1, 3), _s(1, 3), _s(0.0, 9)]
    adv = sample_advantages(samples)
    g7 = group_advantages(torch.tensor([[1.0, 0.0]]))[0]
    g3 = group_advantages(torch.tensor([[0.0, 1.0, 1.0]]))[0]
    torch.testing.assert_close(adv, torch.cat([g7[:1], g3[:1], g7[1:], g3[1:], torch.zeros(1)]))


def test_policy_gradient_loss_is_token_mean() -> None:
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([2.0, -1.0])
    loss = policy_gradient_loss(logp, adv, mask)
    assert loss.item() == pytest.approx(-(2 * -1 + 2 * -2 + -1 * -3) / 3)
    loss.backward()
    # Descent raises log-probs of positive-advantage tokens and lowers the others; padding untouched.
    torch.testing.assert_close(logp.grad, torch.tensor([[-2 / 3, -2 / 3, 0.0], [1 / 3, 0.0, 0.0]]))


# ---- learner ------------------------------------------------------------------------------------

SPECS = (ModelSpec(), AlgorithmSpec(), TaskSpec())


def test_learner_is_deterministic_given_seed() -> None:
    def trained(seed: int) -> dict[str, torch.Tensor]:
        learner = Learner(*SPECS, seed=seed)
        learner.warm_start(3)
        learner.train_step([_s(1, 0, 3), _s(0, 0, 2), _s(0, 1, 4), _s(1, 1, 1)])
        return learner.state_dict()

    a, b, c = trained(0), trained(0), trained(1)
    assert list(a) == list(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_state_dict_is_detached_cpu_fp32_copy() -> None:
    learner = Learner(*SPECS, seed=0)
    sd = learner.state_dict()
    assert set(sd) == {name for name, _ in learner.model.named_parameters()}
    for t in sd.values():
        assert t.dtype == torch.float32 and t.device.type == "cpu"
        assert t.is_contiguous() and not t.requires_grad
    sd["wte.weight"].zero_()
    assert learner.model.wte.weight.abs().sum() > 0  # a copy, not a view


def test_warm_start_lowers_demo_loss() -> None:
    learner = Learner(*SPECS, seed=0)
    first = learner.warm_start(1)["loss"]
    later = learner.warm_start(30)["loss"]
    assert first > 3.0  # about ln(41) for an untrained model
    assert later < first - 1.0


def test_train_step_moves_probability_toward_rewarded_response() -> None:
    learner = Learner(*SPECS, seed=0)
    prompt, good, bad = [1, 14, 15, 3], [15, 14, EOS], [16, 17, EOS]
    before = sum(learner.logprobs(prompt, good)), sum(learner.logprobs(prompt, bad))
    metrics = learner.train_step([Sample(prompt, good, 1.0, group=0), Sample(prompt, bad, 0.0, group=0)])
    after = sum(learner.logprobs(prompt, good)), sum(learner.logprobs(prompt, bad))
    assert after[0] > before[0] and after[1] < before[1]
    assert metrics["reward_mean"] == 0.5 and metrics["tokens"] == 6
    assert metrics["adv_abs_mean"] == pytest.approx(0.5 / np.std([1, 0], ddof=1), rel=1e-4)
    assert {"loss", "grad_norm"} <= metrics.keys()


# ---- the learning check -------------------------------------------------------------------------


def test_default_job_learns_in_process() -> None:
    """Warm start + 30 GRPO steps of the default spec, rolled out on the torch engine."""
    model, algo, task = SPECS
    t0 = time.perf_counter()
    learner = Learner(model, algo, task, seed=0)
    learner.warm_start(algo.warm_start_steps)
    engine = TorchEngine(model)
    engine.load_weights(0, learner.state_dict())
    rng = np.random.default_rng(0)
    rewards = []
    for step in range(30):
        problems = learner.task.sample(rng, algo.prompts_per_step)
        samples = rollout_groups(
            engine, learner.task, problems, algo.group_size, algo.max_new_tokens, 0, step, algo.temperature
        )
        assert len(samples) == algo.prompts_per_step * algo.group_size
        rewards.append(learner.train_step(samples)["reward_mean"])
        engine.load_weights(step + 1, learner.state_dict())
    first, last = np.mean(rewards[:5]), np.mean(rewards[-5:])
    assert 0.05 < first < 0.45, f"warm start should help but not solve the task: {rewards}"
    assert last > first + 0.15, f"reward did not improve: {rewards}"
    assert time.perf_counter() - t0 < 60  # ~5 s on 2 idle cores
