"""The streamed GRPO update (Learner.begin_step / add_groups / finish_step): whole groups fed as they
complete, in any order and any chunks, make the same update as the whole batch (train_step).

The comparison runs in float64, where the only differences are summation order (~1e-16 for tiny-gpt),
and in float32 at a float tolerance; the normaliser given to begin_step is deliberately not the step's token
count, so a missing or wrong end-of-step rescale fails these tests."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, TaskSpec
from rlboost.trainer.grpo import Sample
from rlboost.trainer.learner import Learner
from tests.test_distributed import _samples
from tests.torch_threads import one_thread  # noqa: F401  (autouse: single-threaded torch)

TINY = (ModelSpec(n_layer=2, n_embd=32, n_head=2), TaskSpec())
# group arrival order and chunking of a 5-group step: completion order is not prompt order
CHUNKS = [[3], [0, 4], [2], [1]]


# DAPO's knobs: the overlong buffer reaches the longest responses (1..7 tokens of max_new_tokens 12), and
# dynamic sampling drops the groups _check makes constant, so the loss's normaliser is not the step's
DAPO = {"overlong_buffer": {"length": 6, "penalty": 0.5}, "dynamic_sampling": True}


def _learner(
    model: ModelSpec, task: TaskSpec, dtype: torch.dtype, sgd: bool, micro: int | None, knobs: dict | None = None
) -> Learner:
    algo = AlgorithmSpec.model_validate({"learning_rate": 1e-2, "seed": 0, **(knobs or {})})
    learner = Learner(model, algo, task, seed=0, device="cpu")
    learner.warm_start(2)  # moves the weights off their init (and warms Adam's moments)
    learner.algo = learner.algo.model_copy(update={"micro_batch_size": micro})
    learner.model.to(dtype)
    if sgd:  # float32: Adam turns float noise in a near-zero gradient into a full-size step
        learner.optimizer = torch.optim.SGD(learner.model.parameters(), lr=0.5)
    else:  # float64: the real optimizer, its state carried over from the warm start
        state = learner.optimizer.state_dict()
        learner.optimizer = torch.optim.AdamW(learner.model.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.0)
        learner.optimizer.load_state_dict(state)  # casts the moments to the parameters' dtype
    return learner


def _updated(
    model: ModelSpec,
    task: TaskSpec,
    samples: Sequence[Sample],
    chunks: list[list[int]] | None,
    dtype: torch.dtype,
    sgd: bool = False,
    micro: int | None = None,
    knobs: dict | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    learner = _learner(model, task, dtype, sgd, micro, knobs)
    if chunks is None:
        metrics = learner.train_step(samples)
    else:
        learner.begin_step(token_budget=len(samples) * 16)  # the budget, not the true token count
        for groups in chunks:
            learner.add_groups([s for s in samples if s.group in groups])
        metrics = learner.finish_step()
    return {k: v.detach().clone() for k, v in learner.model.state_dict().items()}, metrics


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _check(
    model: ModelSpec, task: TaskSpec, dtype: torch.dtype, atol: float, sgd: bool, knobs: dict | None = None
) -> None:
    samples = _samples(model, task, n_groups=5)
    keys = ["loss", "reward_mean", "adv_abs_mean", "tokens", "grad_norm"]
    if knobs:  # groups 0 and 2 (in different chunks) get equal rewards: dynamic sampling drops them
        samples = [Sample(s.prompt_ids, s.response_ids, 1.0, s.group) if s.group in (0, 2) else s for s in samples]
        keys += ["overlong_penalty_mean", "groups_dropped", "update_skipped"]
    whole, m_whole = _updated(model, task, samples, None, dtype, sgd, knobs=knobs)
    before = _learner(model, task, dtype, sgd, None).model.state_dict()
    assert _max_diff(whole, before) > 100 * atol  # the update is not a no-op at this tolerance
    if knobs:
        assert m_whole["groups_dropped"] == 2 and m_whole["overlong_penalty_mean"] < 0
    for micro in (None, 3):  # one pass per chunk, and micro-batches of 3 rows
        streamed, m_streamed = _updated(model, task, samples, CHUNKS, dtype, sgd, micro, knobs)
        err = _max_diff(whole, streamed)
        print(f"{model.kind} {dtype} micro={micro}: max |param diff| {err:.3g}")
        assert err <= atol
        for k in keys:
            assert m_streamed[k] == pytest.approx(m_whole[k], rel=1e-5), k


def test_tiny_gpt_streamed_update_equals_whole_batch_float64() -> None:
    _check(*TINY, torch.float64, atol=1e-12, sgd=False)


def test_tiny_gpt_streamed_update_equals_whole_batch_float32() -> None:
    _check(*TINY, torch.float32, atol=1e-6, sgd=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tiny_gpt_streamed_update_equals_whole_batch_with_dapo_knobs(dtype: torch.dtype) -> None:
    _check(*TINY, dtype, atol=1e-12 if dtype == torch.float64 else 1e-6, sgd=dtype == torch.float32, knobs=DAPO)


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> tuple[ModelSpec, TaskSpec]:
    pytest.importorskip("transformers")
    from testkit.hf_fixtures import make_tiny_model, write_math_jsonl

    tmp = tmp_path_factory.mktemp("hf")
    model = ModelSpec(kind="hf", path=str(make_tiny_model(tmp / "m", layers=2)), dtype="float32")
    return model, TaskSpec(name="jsonl", path=write_math_jsonl(tmp / "d.jsonl"), reward="math_boxed")


def test_hf_qwen2_streamed_update_equals_whole_batch_float64(tiny_hf) -> None:
    # Part of the HF forward stays in float32 whatever the model dtype (rotary tables), so rows padded
    # to different widths differ at float32 rounding (~1e-9 after this SGD step); Adam would blow
    # that up in near-zero gradients, hence SGD here.
    _check(*tiny_hf, torch.float64, atol=1e-8, sgd=True)


def test_hf_qwen2_streamed_update_equals_whole_batch_float32(tiny_hf) -> None:
    _check(*tiny_hf, torch.float32, atol=1e-6, sgd=True)


def test_a_group_split_over_calls_is_refused() -> None:
    learner = Learner(*TINY[:1], AlgorithmSpec(seed=0), TINY[1], seed=0, device="cpu")
    samples = _samples(*TINY, n_groups=2)
    learner.begin_step()
    learner.add_groups([s for s in samples if s.group == 0][:2])
    with pytest.raises(ValueError, match="already added"):
        learner.add_groups([s for s in samples if s.group == 0][2:])
    with pytest.raises(RuntimeError):
        Learner(*TINY[:1], AlgorithmSpec(seed=0), TINY[1], seed=0, device="cpu").add_groups(samples)
