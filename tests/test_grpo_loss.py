"""The GRPO loss knobs (algorithm.kl_coef / kl_estimator, clip_ratio_low / clip_ratio_high,
entropy_coeff, loss_agg_mode): each term's effect on the loss, in trainer.grpo's math and in the
learner, and the job-file rules for them."""

from __future__ import annotations

import math

import pytest
import torch

from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, SpecError, TaskSpec, parse_spec
from rlboost.trainer.grpo import Sample, agg_loss, clipped_ratio, entropy, kl_penalty, policy_gradient_loss
from rlboost.trainer.learner import Learner
from tests.test_distributed import _samples
from tests.torch_threads import one_thread  # noqa: F401  (autouse: single-threaded torch)

TINY = (ModelSpec(n_layer=1, n_embd=32, n_head=2), TaskSpec())

# ---- trainer.grpo's terms -----------------------------------------------------------------------


def test_loss_aggregation_modes_follow_their_definitions() -> None:
    values = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])  # 9 = padding, must not count
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    assert agg_loss(values, mask, "token-mean").item() == pytest.approx((1 + 2 + 3) / 3)
    assert agg_loss(values, mask, "seq-mean-token-mean").item() == pytest.approx(((1 + 2) / 2 + 3) / 2)
    assert agg_loss(values, mask, "seq-mean-token-sum").item() == pytest.approx(((1 + 2) + 3) / 2)
    # equal lengths: token-mean and seq-mean-token-mean agree
    even = torch.ones(2, 2, dtype=torch.bool)
    assert agg_loss(values[:, :2], even, "token-mean") == pytest.approx(
        agg_loss(values[:, :2], even, "seq-mean-token-mean").item()
    )


def test_clip_bounds_the_gradient_outside_the_ratio_range() -> None:
    """Stale log-probs (ratio != 1): a token moved past 1 + high (A > 0) or below 1 - low (A < 0) gets
    no gradient; everything else gets -A * ratio; value and gradient equal PPO's max() form."""
    ratios = torch.tensor([[1.5, 0.7, 1.1], [1.5, 0.7, 0.9]], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.2]], dtype=torch.float64, requires_grad=True)
    old = logp.detach() - ratios.log()

    def grads(low: float, high: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logp.grad = None
        surrogate, clipped = clipped_ratio(logp, old, adv, low, high)
        (-(adv[:, None] * surrogate)).sum().backward()
        assert logp.grad is not None
        return surrogate.detach(), clipped, logp.grad.clone()

    surrogate, clipped, g = grads(0.2, 0.2)
    # A > 0: 1.5 is past 1.2 (clipped); 0.7 and 1.1 are not. A < 0: 0.7 is below 0.8 (clipped); 1.5, 0.9 not
    assert clipped.tolist() == [[True, False, False], [False, True, False]]
    expected = torch.where(clipped, torch.zeros_like(ratios), -adv[:, None] * ratios)  # d(-A r)/dlogp = -A r
    torch.testing.assert_close(g, expected)
    r = torch.exp(logp.detach() - old)  # PPO's form: max(-A r, -A clip(r))
    ppo = torch.maximum(-adv[:, None] * r, -adv[:, None] * r.clamp(0.8, 1.2))
    torch.testing.assert_close(-adv[:, None] * surrogate, ppo)

    # DAPO's clip-higher: a wider upper bound lets the A > 0 token at 1.5 keep its gradient
    _, clipped_hi, g_hi = grads(0.2, 0.6)
    assert clipped_hi.tolist() == [[False, False, False], [False, True, False]]
    assert g_hi[0, 0].item() == pytest.approx(-1.5) and g_hi[1, 1].item() == 0.0
    # and a wider lower bound frees the A < 0 token at 0.7 only
    _, clipped_lo, _ = grads(0.4, 0.2)
    assert clipped_lo.tolist() == [[True, False, False], [False, False, False]]


def test_on_policy_ratio_is_exactly_one_so_the_gradient_is_the_policy_gradient() -> None:
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([2.0, -1.0])
    surrogate, clipped = clipped_ratio(logp, logp.detach(), adv, 0.0, 0.0)  # even a zero-width clip
    assert not clipped.any() and torch.equal(surrogate, torch.ones_like(logp))
    (g_clip,) = torch.autograd.grad(agg_loss(-(adv[:, None] * surrogate), mask), logp)
    (g_pg,) = torch.autograd.grad(policy_gradient_loss(logp, adv, mask), logp)
    assert torch.equal(g_clip, g_pg)


def test_kl_estimators_are_zero_at_the_reference_and_grow_with_drift() -> None:
    ref = torch.tensor([-1.0, -2.0, -0.1])
    for est in ("low_var_kl", "kl", "mse"):
        assert torch.equal(kl_penalty(ref, ref, est), torch.zeros(3)), est
    logp = ref + torch.tensor([0.5, -0.5, 0.0])
    k3 = kl_penalty(logp, ref, "low_var_kl")
    d = torch.tensor([-0.5, 0.5, 0.0])  # ref - logp
    torch.testing.assert_close(k3, d.exp() - d - 1)
    assert (k3[:2] > 0).all()
    torch.testing.assert_close(kl_penalty(logp, ref, "kl"), -d)
    torch.testing.assert_close(kl_penalty(logp, ref, "mse"), d**2 / 2)


def test_entropy_of_a_distribution() -> None:
    uniform = torch.log_softmax(torch.zeros(2, 5), dim=-1)
    torch.testing.assert_close(entropy(uniform), torch.full((2,), math.log(5)))
    peaked = torch.log_softmax(torch.tensor([[50.0, 0.0, 0.0]]), dim=-1)
    assert entropy(peaked).item() < 1e-12


# ---- the learner --------------------------------------------------------------------------------


def _learner(**knobs: object) -> Learner:
    algo = AlgorithmSpec(learning_rate=1e-2, seed=0, **knobs)  # type: ignore[arg-type]
    learner = Learner(TINY[0], algo, TINY[1], seed=0, device="cpu")
    learner.model.to(torch.float64)  # exact comparisons: only summation order differs between paths
    learner.optimizer = torch.optim.SGD(learner.model.parameters(), lr=0.5)
    return learner


def _weights(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.model.state_dict().items()}


def test_kl_term_is_zero_at_the_reference_and_raises_the_loss_after_drift() -> None:
    samples = _samples(*TINY, n_groups=3)
    with_kl, plain = _learner(kl_coef=0.5), _learner()
    assert with_kl.reference is None  # held only once GRPO starts, and only when kl_coef > 0
    first, first_plain = with_kl.train_step(samples), plain.train_step(samples)
    assert first["kl"] == 0.0 and "kl" not in first_plain  # the reference is the weights of step 0
    assert first["loss"] == first_plain["loss"]
    w, w_plain = _weights(with_kl), _weights(plain)
    assert all(torch.equal(w[k], w_plain[k]) for k in w)  # k3's gradient is 0 at the reference too

    # the policy has drifted: from the same weights, the KL learner's loss is higher by kl_coef * KL
    state = with_kl.checkpoint_state()
    assert "reference" in state and "reference" not in plain.checkpoint_state()
    resumed = _learner(kl_coef=0.5)
    resumed.load_checkpoint_state(state)
    second, second_plain = with_kl.train_step(samples), plain.train_step(samples)
    assert second["kl"] > 0
    assert second["loss"] - second_plain["loss"] == pytest.approx(0.5 * second["kl"], rel=1e-9)
    w_kl, w_plain = _weights(with_kl), _weights(plain)
    assert not all(torch.equal(w_kl[k], w_plain[k]) for k in w_kl)
    # a resumed learner holds the same reference: the same update, bit for bit
    resumed.train_step(samples)
    w_res = _weights(resumed)
    assert all(torch.equal(w_res[k], w_kl[k]) for k in w_kl)


def test_kl_resume_from_a_checkpoint_without_reference_is_refused() -> None:
    plain = _learner()
    plain.train_step(_samples(*TINY, n_groups=2))
    learner = _learner(kl_coef=0.1)
    learner.load_checkpoint_state(plain.checkpoint_state())
    with pytest.raises(ValueError, match="no reference model"):
        learner.train_step(_samples(*TINY, n_groups=2))


def test_entropy_term_changes_the_loss_by_minus_coef_times_entropy() -> None:
    samples = _samples(*TINY, n_groups=3)
    bonus, plain = _learner(entropy_coeff=0.05), _learner()
    m, m_plain = bonus.train_step(samples), plain.train_step(samples)
    assert m["entropy"] > 0 and "entropy" not in m_plain
    assert m["loss"] - m_plain["loss"] == pytest.approx(-0.05 * m["entropy"], rel=1e-9)


def test_entropy_bonus_alone_raises_entropy() -> None:
    """All rewards equal: no policy signal, the step follows the entropy bonus only."""
    samples = [Sample(s.prompt_ids, s.response_ids, 1.0, s.group) for s in _samples(*TINY, n_groups=3)]
    learner = _learner(entropy_coeff=1.0)
    learner.warm_start(5)  # sharpen the distribution first, so there is entropy to gain
    learner.optimizer = torch.optim.SGD(learner.model.parameters(), lr=0.1)
    before = learner.train_step(samples)["entropy"]
    after = learner.train_step(samples)["entropy"]  # measured with the weights the first step made
    assert after > before


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_learner_update_is_the_aggregated_policy_gradient(mode: str) -> None:
    """The learner's update (plain SGD, lr 1: w - clipped gradient) equals one computed by autograd of
    trainer.grpo's loss under `mode` over the whole batch, though the learner's is streamed in two
    calls, micro-batched, and started with a provisional normaliser that is off."""
    from rlboost.trainer.grpo import sample_advantages

    samples = _samples(*TINY, n_groups=3)
    learner = _learner(loss_agg_mode=mode, micro_batch_size=5)
    learner.optimizer = torch.optim.SGD(learner.model.parameters(), lr=1.0)
    before = _weights(learner)
    learner.begin_step(token_budget=7 * learner.algo.max_new_tokens)  # not the step's size
    for groups in ([2], [0, 1]):
        learner.add_groups([s for s in samples if s.group in groups])
    learner.finish_step()
    got = _weights(learner)

    ref = _learner(loss_agg_mode=mode)  # the same initial weights
    logp, mask, _ = ref._response_logp([s.prompt_ids for s in samples], [s.response_ids for s in samples], 1.0)
    policy_gradient_loss(logp, sample_advantages(samples).to(logp.dtype), mask, mode).backward()
    torch.nn.utils.clip_grad_norm_(ref.model.parameters(), 1.0)
    for n, p in ref.model.named_parameters():
        assert p.grad is not None
        torch.testing.assert_close(got[n], before[n] - p.grad, rtol=1e-9, atol=1e-12, msg=n)
    assert any(not torch.equal(got[k], before[k]) for k in got)


def test_aggregation_modes_make_different_updates_on_unequal_lengths() -> None:
    samples = _samples(*TINY, n_groups=3)
    assert len({len(s.response_ids) for s in samples}) > 1
    updates = []
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        learner = _learner(loss_agg_mode=mode)
        learner.train_step(samples)
        updates.append(_weights(learner))
    for a, b in ((0, 1), (0, 2), (1, 2)):
        assert not all(torch.equal(updates[a][k], updates[b][k]) for k in updates[a])


def test_clip_is_a_no_op_on_policy_whatever_its_width() -> None:
    """Every response is from the current weights: ratio == 1, clip_frac 0, the same update bit for bit."""
    samples = _samples(*TINY, n_groups=3)
    updates = []
    for low, high in ((0.2, 0.2), (0.0, 0.0), (0.2, 0.28)):
        learner = _learner(clip_ratio_low=low, clip_ratio_high=high)
        assert learner.train_step(samples)["clip_frac"] == 0.0
        updates.append(_weights(learner))
    assert all(torch.equal(u[k], updates[0][k]) for u in updates[1:] for k in u)


def test_hf_model_takes_kl_and_entropy_terms(tmp_path) -> None:
    pytest.importorskip("transformers")
    from testkit.hf_fixtures import make_tiny_model, write_math_jsonl

    model = ModelSpec(kind="hf", path=str(make_tiny_model(tmp_path / "m", layers=1)), dtype="float32")
    task = TaskSpec(name="jsonl", path=write_math_jsonl(tmp_path / "d.jsonl"), reward="math_boxed")
    algo = AlgorithmSpec(learning_rate=1e-2, kl_coef=0.1, entropy_coeff=0.01, loss_agg_mode="seq-mean-token-mean")
    learner = Learner(model, algo, task, device="cpu")
    samples = _samples(model, task, n_groups=2)
    first = learner.train_step(samples)
    second = learner.train_step(samples)
    assert first["kl"] == 0.0 and second["kl"] > 0
    assert math.isfinite(second["loss"]) and second["entropy"] > 0


# ---- the job file -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, needle",
    [
        (
            {
                "model": {"kind": "synthetic"},
                "rollout": {"engine": "synthetic", "max_workers": 0},
                "algorithm": {"kl_coef": 0.1},
            },
            "algorithm.kl_coef: model.kind synthetic has no loss",
        ),
        (
            {"algorithm": {"loss_agg_mode": "seq-mean"}},
            "algorithm.loss_agg_mode: invalid value 'seq-mean'; input should be 'token-mean', 'seq-mean-token-mean'",
        ),
        (
            {"algorithm": {"kl_estimator": "k3"}},
            "algorithm.kl_estimator: invalid value 'k3'; input should be 'low_var_kl', 'kl' or 'mse'",
        ),
        (
            {"algorithm": {"clip_ratio_low": 1.0}},
            "algorithm.clip_ratio_low: 1.0 is out of range (allowed: 0 <= clip_ratio_low < 1)",
        ),
        ({"algorithm": {"kl_coef": -0.1}}, "algorithm.kl_coef: -0.1 is out of range (allowed: 0 <= kl_coef <= 100)"),
    ],
)
def test_wrong_loss_knobs_name_the_field(raw: dict, needle: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec({"name": "knobs", "rollout": {"max_workers": 0}, **raw})
    assert needle in str(e.value)


def test_kl_parses_under_fsdp() -> None:
    """The KL reference is sharded like the policy under fsdp (tests/test_distributed.py's fsdp-kl)."""
    raw = {"name": "knobs", "rollout": {"max_workers": 0}, "algorithm": {"kl_coef": 0.1}}
    spec = parse_spec({**raw, "trainer": {"strategy": "fsdp"}})
    assert (spec.algorithm.kl_coef, spec.trainer.strategy) == (0.1, "fsdp")


def test_loss_knobs_parse_with_their_defaults() -> None:
    a = parse_spec({"name": "knobs", "rollout": {"max_workers": 0}}).algorithm
    assert (a.kl_coef, a.kl_estimator, a.clip_ratio_low, a.clip_ratio_high, a.entropy_coeff, a.loss_agg_mode) == (
        0.0,
        "low_var_kl",
        0.2,
        0.2,
        0.0,
        "token-mean",
    )
    raw = {"name": "knobs", "rollout": {"max_workers": 0}, "algorithm": {"clip_ratio_high": 0.28, "kl_coef": 0}}
    dapo = parse_spec(raw).algorithm
    assert dapo.clip_ratio_high == 0.28 and dapo.loss_knobs_set() == ["clip_ratio_high"]


def test_metrics_rows_carry_the_loss_terms(tmp_path) -> None:
    import json

    from rlboost.cli.metrics_log import MetricsLog
    from tests.test_metrics_log import rec

    log = MetricsLog(tmp_path / "m.jsonl")
    log.write(rec(1, kl=0.01, clip_frac=0.0), clock=1.0, dollars=0.0, preemptions=0)
    (row,) = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert (row["kl"], row["entropy"], row["clip_frac"]) == (0.01, None, 0.0)


# ---- several updates per step (ppo_mini_batch_size, ppo_epochs) ----------------------------------


def test_ppo_epochs_make_the_clip_act() -> None:
    """The second epoch sees the weights the first one made: ratio != 1, and a narrow clip cuts in."""
    samples = _samples(*TINY, n_groups=3)
    narrow = _learner(ppo_epochs=2, clip_ratio_low=0.001, clip_ratio_high=0.001)
    wide = _learner(ppo_epochs=2, clip_ratio_low=0.99, clip_ratio_high=100.0)
    m_narrow, m_wide = narrow.train_step(samples), wide.train_step(samples)
    assert m_narrow["updates"] == m_wide["updates"] == 2
    assert m_narrow["clip_frac"] > 0 and m_wide["clip_frac"] == 0.0
    a, b = _weights(narrow), _weights(wide)
    assert not all(torch.equal(a[k], b[k]) for k in a)


def test_mini_batch_updates_take_old_log_probs_from_before_the_first_update() -> None:
    """Two mini-batches of one group each: the learner's two updates equal ones computed by hand with
    trainer.grpo, the second with log-probs of the initial weights as pi_old (so its ratio is not 1)."""
    from rlboost.trainer.grpo import sample_advantages

    samples = _samples(*TINY, n_groups=2)
    knobs = {"clip_ratio_low": 0.05, "clip_ratio_high": 0.05}
    learner = _learner(ppo_mini_batch_size=1, **knobs)
    learner.optimizer = torch.optim.SGD(learner.model.parameters(), lr=1.0)
    learner.begin_step()
    learner.add_groups([s for s in samples if s.group == 1])  # arrival order is not update order
    learner.add_groups([s for s in samples if s.group == 0])
    assert learner.finish_step()["updates"] == 2

    hand = _learner()
    params = list(hand.model.parameters())
    with torch.no_grad():
        old_all, _, _ = hand._response_logp([s.prompt_ids for s in samples], [s.response_ids for s in samples], 1.0)
    ratios_off_one = 0
    for g in (0, 1):
        idx = [i for i, s in enumerate(samples) if s.group == g]
        rows = [samples[i] for i in idx]
        logp, mask, _ = hand._response_logp([s.prompt_ids for s in rows], [s.response_ids for s in rows], 1.0)
        old = torch.zeros_like(logp)
        for j, i in enumerate(idx):
            n = len(samples[i].response_ids)
            old[j, -n:] = old_all[i, -n:]
        adv = sample_advantages(rows).to(logp.dtype)
        surrogate, _ = clipped_ratio(logp, old, adv, 0.05, 0.05)
        ratios_off_one += int(((surrogate.detach() - 1).abs() > 1e-6).sum())
        for p in params:
            p.grad = None
        agg_loss(-(adv[:, None] * surrogate), mask).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p -= p.grad
    assert ratios_off_one > 0  # the second update really was off-policy
    got, want = _weights(learner), _weights(hand)
    for k in got:
        torch.testing.assert_close(got[k], want[k], rtol=1e-9, atol=1e-12, msg=k)


def test_one_ppo_mini_batch_of_the_whole_step_is_the_default_update() -> None:
    samples = _samples(*TINY, n_groups=3)
    default, one = _learner(), _learner(ppo_mini_batch_size=3)
    m_default, m_one = default.train_step(samples), one.train_step(samples)
    assert m_one["updates"] == 1 and m_one["clip_frac"] == 0.0
    assert m_one["loss"] == pytest.approx(m_default["loss"], rel=1e-9)
    a, b = _weights(default), _weights(one)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-10, atol=1e-13, msg=k)


def test_ppo_mini_batch_size_must_divide_the_step() -> None:
    raw = {
        "name": "knobs",
        "rollout": {"max_workers": 0},
        "algorithm": {"prompts_per_step": 32, "ppo_mini_batch_size": 5},
    }
    with pytest.raises(SpecError, match=r"algorithm.ppo_mini_batch_size \(5\) must divide algorithm.prompts_per_step"):
        parse_spec(raw)
