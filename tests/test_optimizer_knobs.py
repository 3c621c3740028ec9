"""The optimizer knobs (algorithm.betas, weight_decay, grad_clip, lr_schedule, lr_warmup_steps) and the
learner's per-step optimizer metrics (pg_loss, grad_norm, lr, updates): each knob changes what the
learner does (a test per knob that fails if it were ignored), the defaults build exactly the optimizer
of the versions before the knobs, the schedule's values at its boundaries, and its position surviving
a resume."""

from __future__ import annotations

import math

import pytest
import torch

from rlboost.contracts import job_yaml
from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, SpecError, TaskSpec, parse_spec
from rlboost.trainer.learner import Learner
from rlboost.trainer.lr_schedule import LrSchedule, lr_at
from tests.test_distributed import _samples
from tests.torch_threads import one_thread  # noqa: F401  (autouse: single-threaded torch)

TINY = (ModelSpec(n_layer=1, n_embd=32, n_head=2), TaskSpec())


def _learner(**knobs) -> Learner:
    return Learner(TINY[0], AlgorithmSpec(learning_rate=1e-2, seed=0, **knobs), TINY[1], seed=0, device="cpu")


def _params(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.model.named_parameters()}


# ---- lr_at: a pure function of the RL step -------------------------------------------------------


def test_constant_schedule_is_exactly_the_learning_rate_at_every_step() -> None:
    s = LrSchedule(3e-3, "constant", 0, 10)
    assert [lr_at(k, s) for k in range(12)] == [3e-3] * 12  # exactly, not approximately


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
def test_warmup_rises_linearly_and_reaches_the_rate_at_its_last_step(kind: str) -> None:
    s = LrSchedule(1.0, kind, 4, 20)
    assert [lr_at(k, s) for k in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, s) == 1.0  # the first step after warm-up: the decay starts from the peak


def test_linear_and_cosine_decay_to_their_ends() -> None:
    lin, cos = LrSchedule(1.0, "linear", 2, 12), LrSchedule(1.0, "cosine", 2, 12)
    # after warm-up: progress (s - W) / (T - W) over the remaining 10 steps
    assert lr_at(7, lin) == pytest.approx(0.5)
    assert lr_at(11, lin) == pytest.approx(0.1)  # the last step: small, not 0
    assert lr_at(7, cos) == pytest.approx(0.5)  # the cosine's midpoint
    assert lr_at(11, cos) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.9)))
    assert lr_at(12, lin) == 0.0 and lr_at(12, cos) == pytest.approx(0.0)  # past the end: not negative
    assert all(lr_at(k, lin) > lr_at(k + 1, lin) for k in range(2, 11))
    assert all(lr_at(k, cos) > lr_at(k + 1, cos) for k in range(2, 11))
    with pytest.raises(ValueError):
        lr_at(-1, lin)


# ---- the job file ----------------------------------------------------------------------------------


def test_defaults_are_the_optimizer_fixed_before_the_knobs() -> None:
    a = AlgorithmSpec()
    assert (a.betas, a.weight_decay, a.grad_clip, a.lr_schedule, a.lr_warmup_steps) == (
        (0.9, 0.99), 0.0, 1.0, "constant", 0
    )


def _parse(text: str):
    """A job file's text, as `rlboost launch` reads it (YAML 1.2, then the spec)."""
    raw = job_yaml.load("name: knobs\nrollout:\n  max_workers: 0\n" + text)
    assert isinstance(raw, dict)
    return parse_spec(raw)


def _spec_error(algorithm: str) -> str:
    with pytest.raises(SpecError) as e:
        _parse(f"algorithm:\n{algorithm}\n")
    return str(e.value)


def test_a_job_file_sets_the_knobs_and_bad_values_name_their_field() -> None:
    spec = _parse(
        "algorithm:\n  betas: [0.9, 0.999]\n  weight_decay: 0.01\n  grad_clip: null\n"
        "  lr_schedule: cosine\n  lr_warmup_steps: 3\n  steps: 10\n"
    )
    a = spec.algorithm
    assert (a.betas, a.weight_decay, a.grad_clip, a.lr_schedule, a.lr_warmup_steps) == (
        (0.9, 0.999), 0.01, None, "cosine", 3
    )
    assert "betas" in _spec_error("  betas: [0.9, 1.0]")
    assert "betas" in _spec_error("  betas: [0.9]")
    assert "lr_warmup_steps" in _spec_error("  lr_warmup_steps: -1")
    assert "lr_warmup_steps" in _spec_error("  lr_warmup_steps: 20\n  steps: 10")
    assert "weight_decay" in _spec_error("  weight_decay: -0.1")
    assert "grad_clip" in _spec_error("  grad_clip: 0")
    assert "lr_schedule" in _spec_error("  lr_schedule: step")


# ---- the learner: each knob acts -------------------------------------------------------------------


def test_defaults_build_the_optimizer_exactly_as_before() -> None:
    """The AdamW the learner built before the knobs: lr, betas (0.9, 0.99), no weight decay, clip 1.0;
    a step with the defaults equals a step by that optimizer and clip, bit for bit."""
    learner = _learner()
    group = learner.optimizer.param_groups[0]
    assert type(learner.optimizer) is torch.optim.AdamW
    assert (group["lr"], group["betas"], group["weight_decay"]) == (1e-2, (0.9, 0.99), 0.0)
    samples = _samples(*TINY)
    twin = _learner()
    twin.optimizer = torch.optim.AdamW(twin.model.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.0)
    for _ in range(3):  # the schedule's position moves; a constant one never touches the rate
        learner.train_step(samples)
        # the old update by hand: the same loss and gradients, clip_grad_norm_(1.0), AdamW's step
        twin._begin(float(sum(len(s.response_ids) for s in samples)))
        twin.add_groups(samples)
        twin._acc = None
        torch.nn.utils.clip_grad_norm_(twin.model.parameters(), 1.0)
        twin.optimizer.step()
        twin.optimizer.zero_grad(set_to_none=True)
        twin.steps_done += 1
    mine, theirs = _params(learner), _params(twin)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert learner.optimizer.param_groups[0]["lr"] == 1e-2


def test_betas_reach_the_optimizer() -> None:
    assert _learner(betas=(0.8, 0.95)).optimizer.param_groups[0]["betas"] == (0.8, 0.95)
    # and change the update: Adam's second step depends on beta1
    a, b = _learner(), _learner(betas=(0.5, 0.99))
    samples = _samples(*TINY)
    for learner in (a, b):
        learner.train_step(samples)
        learner.train_step(samples)
    pa, pb = _params(a), _params(b)
    assert any(not torch.equal(pa[k], pb[k]) for k in pa)


def test_weight_decay_shrinks_parameters_on_a_zero_gradient_step() -> None:
    for wd, moved in ((0.0, False), (0.5, True)):
        learner = _learner(weight_decay=wd)
        before = _params(learner)
        for p in learner.model.parameters():
            p.grad = torch.zeros_like(p)
        learner.optimizer.step()
        after = _params(learner)
        changed = any(not torch.equal(before[k], after[k]) for k in before)
        assert changed == moved, wd
        if moved:  # AdamW's decoupled decay: p * (1 - lr * wd)
            k = next(k for k in before if before[k].abs().sum() > 0)
            torch.testing.assert_close(after[k], before[k] * (1 - 1e-2 * 0.5))


def _sgd_step(grad_clip: float | None) -> tuple[float, float]:
    """One train step with SGD(lr=1): (grad_norm metric, norm of the parameter change, which with SGD
    lr 1 is the clipped gradient's norm)."""
    learner = _learner(grad_clip=grad_clip)
    learner.optimizer = torch.optim.SGD(learner.model.parameters(), lr=1.0)
    before = _params(learner)
    metrics = learner.train_step(_samples(*TINY))
    after = _params(learner)
    moved = math.sqrt(sum(float(((after[k] - before[k]) ** 2).sum()) for k in before))
    return metrics["grad_norm"], moved


def test_grad_clip_bounds_the_update_and_grad_norm_is_before_clipping() -> None:
    norm, moved = _sgd_step(grad_clip=1e-3)
    assert norm > 1e-2  # the gradient is well over the clip ...
    assert moved == pytest.approx(1e-3, rel=1e-3)  # ... and the update is clipped to it
    unclipped_norm, unclipped = _sgd_step(grad_clip=None)
    assert unclipped_norm == pytest.approx(norm, rel=1e-6)  # the metric is the norm before clipping
    assert norm > 1.1  # over the default clip (1.0), so a None taken for the default fails the next line
    assert unclipped == pytest.approx(norm, rel=1e-3)  # no clip: the whole gradient


def test_the_schedule_sets_each_steps_rate_and_survives_a_resume() -> None:
    knobs = dict(lr_schedule="linear", lr_warmup_steps=2, steps=6)
    expected = [lr_at(k, LrSchedule(1e-2, "linear", 2, 6)) for k in range(6)]
    assert expected[0] == pytest.approx(5e-3) and expected[1] == 1e-2 and expected[5] < expected[2]
    samples = _samples(*TINY)
    learner = _learner(**knobs)
    learner.warm_start(1)
    assert learner.optimizer.param_groups[0]["lr"] == 1e-2  # the warm start runs at the configured rate
    seen = [learner.train_step(samples)["lr"] for _ in range(3)]
    state = learner.checkpoint_state()
    rest = [learner.train_step(samples)["lr"] for _ in range(3)]
    assert seen + rest == pytest.approx(expected)
    resumed = _learner(**knobs)  # a new process, restored from the checkpoint after step 3
    resumed.load_checkpoint_state(state)
    # the loaded optimizer holds step 3's rate (the last one used), the schedule's position is steps_done
    assert resumed.optimizer.param_groups[0]["lr"] == seen[-1] != rest[0]
    again = [resumed.train_step(samples)["lr"] for _ in range(3)]
    assert again == rest


# ---- the learner's metrics -------------------------------------------------------------------------


def test_a_step_reports_pg_loss_grad_norm_lr_and_updates() -> None:
    samples = _samples(*TINY)
    m = _learner().train_step(samples)
    assert m["grad_norm"] > 0 and m["lr"] == 1e-2 and m["updates"] == 1.0
    assert m["pg_loss"] == pytest.approx(m["loss"], rel=1e-9, abs=1e-12)  # no KL or entropy term: the same
    # streamed: the same figures
    streamed = _learner()
    streamed.begin_step(token_budget=len(samples) * 16)
    streamed.add_groups(samples)
    s = streamed.finish_step()
    for k in ("pg_loss", "grad_norm", "lr", "updates"):
        assert s[k] == pytest.approx(m[k], rel=1e-6, abs=1e-12), k
    # with an entropy bonus and a KL penalty, pg_loss is the policy term alone: loss - kl_coef * kl + ent_coef * H
    both = _learner(kl_coef=0.5, entropy_coeff=0.1)
    both.train_step(samples)  # the reference is these weights; a second step has a KL > 0
    m2 = both.train_step(samples)
    assert m2["kl"] > 0 and m2["entropy"] > 0
    assert m2["pg_loss"] != pytest.approx(m2["loss"], rel=1e-6)
    # token-mean: each term is its token sum over the step's tokens, as the metrics are
    assert m2["pg_loss"] + 0.5 * m2["kl"] - 0.1 * m2["entropy"] == pytest.approx(m2["loss"], rel=1e-5)


def test_several_updates_per_step_are_counted() -> None:
    samples = _samples(*TINY)  # 3 groups
    m = _learner(ppo_mini_batch_size=1, ppo_epochs=2, prompts_per_step=3).train_step(samples)
    assert m["updates"] == 6.0 and m["grad_norm"] > 0 and m["lr"] == 1e-2 and math.isfinite(m["pg_loss"])
