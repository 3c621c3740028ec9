"""algorithm.rollout_correction: truncated importance sampling against the engines' behaviour log-probs
(rlboost/trainer/rollout_correction.py), its weights by hand, in the learner's update, and the job-file
rules. Two ranks == one process is in tests/test_distributed.py (ddp-tis, fsdp-tis-ppo); the metrics of
a real local job in tests/test_knobs_job.py."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, RolloutCorrection, SpecError, TaskSpec, parse_spec
from rlboost.trainer.grpo import Sample
from rlboost.trainer.learner import Learner
from rlboost.trainer.rollout_correction import WeightSums, is_weights, right_aligned
from tests.test_distributed import _samples
from tests.torch_threads import one_thread  # noqa: F401  (autouse: single-threaded torch)

TINY = (ModelSpec(n_layer=1, n_embd=32, n_head=2), TaskSpec())
D = torch.float64

# ---- the weights ----------------------------------------------------------------------------------


def _case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two responses left padded in [2, 4]: 3 tokens and 2 tokens (padding holds junk that must not count)."""
    old = torch.tensor([[9.0, -1.0, -2.0, -0.5], [9.0, 9.0, -3.0, -1.0]], dtype=D)
    beh = torch.tensor([[-9.0, -1.5, -1.0, -0.5], [-9.0, -9.0, -4.5, -1.2]], dtype=D)
    mask = torch.tensor([[False, True, True, True], [False, False, True, True]])
    return old, beh, mask


def test_token_weights_are_the_truncated_ratio_of_each_token() -> None:
    old, beh, mask = _case()
    c = is_weights(old, beh, mask, "token", threshold=2.0)
    # ratios exp(0.5), exp(-1), exp(0); exp(1.5) = 4.48 -> 2 (truncated), exp(0.2)
    want = torch.tensor([[0.0, math.exp(0.5), math.exp(-1.0), 1.0], [0.0, 0.0, 2.0, math.exp(0.2)]], dtype=D)
    torch.testing.assert_close(c.weights, want, rtol=1e-15, atol=0)
    assert c.clipped.tolist() == [[False, False, False, False], [False, False, True, False]]
    sums = WeightSums()
    sums.add(c, mask)
    m = sums.metrics()
    assert m["is_weight_max"] == 2.0 and m["is_clipped_share"] == pytest.approx(1 / 5)
    assert m["is_weight_mean"] == pytest.approx(float(want.sum()) / 5, rel=1e-12)


def test_sequence_weight_is_the_truncated_product_over_the_response() -> None:
    old, beh, mask = _case()
    c = is_weights(old, beh, mask, "sequence", threshold=3.0)
    first = math.exp(0.5 - 1.0 + 0.0)  # 0.61: kept
    assert c.weights[0].tolist() == pytest.approx([0.0, first, first, first], rel=1e-15)
    assert c.weights[1].tolist() == [0.0, 0.0, 3.0, 3.0]  # exp(1.7) = 5.47 -> 3
    assert c.clipped.tolist() == [[False] * 4, [False, False, True, True]]  # every token of the response


def test_a_long_response_saturates_at_the_threshold_without_overflow() -> None:
    n = 5000  # a product of 5000 ratios of e^2 is e^10000: inf in any float, were it formed
    old, beh, mask = torch.zeros(1, n, dtype=D), torch.full((1, n), -2.0, dtype=D), torch.ones(1, n, dtype=torch.bool)
    for level in ("token", "sequence"):
        c = is_weights(old.float(), beh, mask, level, threshold=5.0)  # type: ignore[arg-type]
        assert c.weights.dtype == torch.float32 and torch.isfinite(c.weights).all()
        assert float(c.weights.max()) == 5.0 and bool(c.clipped.all())  # each ratio e^2 = 7.4 > 5
    # and far below: tiny weights, not NaN
    c = is_weights(-old - 800.0, beh, mask, "sequence", threshold=2.0)
    assert torch.isfinite(c.weights).all() and float(c.weights.max()) == 0.0 and not c.clipped.any()


def test_bad_level_or_threshold_is_refused() -> None:
    old, beh, mask = _case()
    with pytest.raises(ValueError, match="level"):
        is_weights(old, beh, mask, "none", 2.0)
    with pytest.raises(ValueError, match="threshold"):
        is_weights(old, beh, mask, "token", 1.0)


def test_right_aligned_places_rows_as_the_learner_does() -> None:
    like = torch.zeros(2, 4, dtype=D)
    got = right_aligned([[1.0, 2.0], torch.tensor([3.0, 4.0, 5.0]), []][:2], like)
    assert got.tolist() == [[0.0, 0.0, 1.0, 2.0], [0.0, 3.0, 4.0, 5.0]]


# ---- in the learner ------------------------------------------------------------------------------


def _learner(**knobs: object) -> Learner:
    algo = AlgorithmSpec(learning_rate=1e-2, seed=0, grad_clip=None, **knobs)  # type: ignore[arg-type]
    learner = Learner(TINY[0], algo, TINY[1], seed=0, device="cpu")
    learner.model.to(torch.float64)
    learner.optimizer = torch.optim.SGD(learner.model.parameters(), lr=1.0)  # update = -gradient
    return learner


def _weights(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.model.state_dict().items()}


def _own_logprobs(samples: list[Sample], shift: float = 0.0) -> list[Sample]:
    """The samples with the learner's own log-probs (its initial weights, the step's whole batch as
    train_step computes it) as their behaviour log-probs, minus `shift`: every ratio is exp(shift)."""
    ref = _learner()
    with torch.no_grad():
        logp, _, _ = ref._response_logp([s.prompt_ids for s in samples], [s.response_ids for s in samples], 1.0)
    out = []
    for j, s in enumerate(samples):
        own = logp[j, logp.shape[1] - len(s.response_ids) :]
        out.append(dataclasses.replace(s, behaviour_logprobs=(own - shift).tolist()))
    return out


def _delta(learner: Learner, samples: list[Sample]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    before = _weights(learner)
    metrics = learner.train_step(samples)
    return {k: v - before[k] for k, v in _weights(learner).items()}, metrics


def test_level_none_is_the_loss_without_it_bit_for_bit() -> None:
    """Off (the default, or level none with any threshold), behaviour log-probs change nothing: the same
    update, exactly, as samples without them, and no is_* metrics."""
    samples = _samples(*TINY, n_groups=3)
    bare = [dataclasses.replace(s, behaviour_logprobs=None) for s in samples]
    default, explicit = _learner(), _learner(rollout_correction=RolloutCorrection(level="none", threshold=7.0))
    m_default, m_explicit = default.train_step(bare), explicit.train_step(samples)
    a, b = _weights(default), _weights(explicit)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert m_default == m_explicit and not any(k.startswith("is_") for k in m_default)


def test_weights_of_one_give_the_uncorrected_update_bit_for_bit() -> None:
    """Behaviour log-probs equal to the trainer's: every weight is exactly 1, the update is none's."""
    samples = _own_logprobs(_samples(*TINY, n_groups=3))
    d_none, _ = _delta(_learner(), samples)
    for level in ("token", "sequence"):
        d_tis, m = _delta(_learner(rollout_correction=RolloutCorrection(level=level)), samples)
        assert all(torch.equal(d_none[k], d_tis[k]) for k in d_none), level
        assert (m["is_weight_mean"], m["is_weight_max"], m["is_clipped_share"]) == (1.0, 1.0, 0.0)


def test_weights_scale_the_policy_gradient_and_truncation_caps_them() -> None:
    """Every ratio 1/2: half the uncorrected update; every ratio 4 over a threshold of 2: twice it, with
    every token counted clipped (grad_clip off, SGD at lr 1: the update is minus the gradient)."""
    base = _samples(*TINY, n_groups=3)
    d_none, _ = _delta(_learner(), _own_logprobs(base))
    for shift, factor, share in ((-math.log(2.0), 0.5, 0.0), (math.log(4.0), 2.0, 1.0)):
        d, m = _delta(_learner(rollout_correction=RolloutCorrection(level="token")), _own_logprobs(base, shift))
        for k in d_none:
            torch.testing.assert_close(d[k], factor * d_none[k], rtol=1e-9, atol=1e-13, msg=k)
        assert m["is_weight_mean"] == pytest.approx(factor, rel=1e-12) and m["is_clipped_share"] == share
        assert m["is_weight_max"] == pytest.approx(factor, rel=1e-12)


def test_streamed_and_several_updates_carry_the_metrics() -> None:
    samples = _samples(*TINY, n_groups=3)
    rc = RolloutCorrection(level="token", threshold=1.5)
    streamed = _learner(rollout_correction=rc, micro_batch_size=2)
    streamed.begin_step(token_budget=100)
    for groups in ([2], [0, 1]):
        streamed.add_groups([s for s in samples if s.group in groups])
    m_stream = streamed.finish_step()
    m_whole = _learner(rollout_correction=rc).train_step(samples)
    for k in ("is_weight_mean", "is_weight_max", "is_clipped_share"):
        assert m_stream[k] == pytest.approx(m_whole[k], rel=1e-9), k
    assert 0 < m_whole["is_clipped_share"] < 1 and m_whole["is_weight_max"] == 1.5
    m_ppo = _learner(rollout_correction=rc, ppo_mini_batch_size=1).train_step(samples)
    assert m_ppo["updates"] == 3 and m_ppo["is_weight_mean"] == pytest.approx(m_whole["is_weight_mean"], rel=1e-9)


def test_a_sample_without_behaviour_log_probs_is_refused() -> None:
    samples = [dataclasses.replace(s, behaviour_logprobs=None) for s in _samples(*TINY, n_groups=2)]
    learner = _learner(rollout_correction=RolloutCorrection(level="token"))
    with pytest.raises(ValueError, match=r"algorithm\.rollout_correction\.level is 'token'.*behaviour log-probs"):
        learner.train_step(samples)
    short = [dataclasses.replace(s, behaviour_logprobs=[-1.0]) for s in _samples(*TINY, n_groups=2)]
    with pytest.raises(ValueError, match="behaviour log-probs"):
        _learner(rollout_correction=RolloutCorrection(level="sequence")).train_step(short)


# ---- the job file -----------------------------------------------------------------------------------

BASE = {"name": "tis", "rollout": {"max_workers": 0}}


def test_off_by_default_and_parsed_when_set() -> None:
    a = parse_spec(BASE).algorithm
    assert a.rollout_correction == RolloutCorrection(level="none", threshold=2.0) and a.loss_knobs_set() == []
    a = parse_spec({**BASE, "algorithm": {"rollout_correction": {"level": "sequence", "threshold": 5}}}).algorithm
    assert a.rollout_correction == RolloutCorrection(level="sequence", threshold=5.0)
    assert a.loss_knobs_set() == ["rollout_correction"]


@pytest.mark.parametrize(
    ("rc", "needle"),
    [
        ({"level": "token", "threshold": 1.0}, "algorithm.rollout_correction.threshold: 1.0 is out of range"),
        ({"threshold": 0.5}, "(allowed: 1 < threshold <= 1000000)"),
        ({"level": "tok"}, "algorithm.rollout_correction.level: invalid value 'tok'"),
        ({"level": "token", "cap": 2}, "algorithm.rollout_correction.cap"),
    ],
)
def test_wrong_values_name_the_field(rc: dict, needle: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec({**BASE, "algorithm": {"rollout_correction": rc}})
    assert needle in str(e.value)


def test_a_synthetic_model_refuses_it_at_launch() -> None:
    """model.kind synthetic trains no loss and its engines' log-probs are made up: nothing to correct."""
    raw = {
        "name": "tis",
        "model": {"kind": "synthetic"},
        "rollout": {"engine": "synthetic", "max_workers": 0},
        "algorithm": {"rollout_correction": {"level": "token"}},
    }
    with pytest.raises(SpecError, match=r"algorithm\.rollout_correction: model.kind synthetic has no loss"):
        parse_spec(raw)
