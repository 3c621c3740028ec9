"""DAPO's knobs (arXiv 2503.14476): the soft overlong punishment (algorithm.overlong_buffer) and dynamic
sampling (algorithm.dynamic_sampling), on a tiny-gpt learner. Streamed == whole batch with the knobs on
is in tests/test_streaming_learner.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
import torch

from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, SpecError, TaskSpec, parse_spec
from rlboost.trainer.grpo import Sample, informative_groups, overlong_penalty, sample_advantages
from rlboost.trainer.learner import Learner
from tests.test_distributed import _samples
from tests.torch_threads import one_thread  # noqa: F401  (autouse: single-threaded torch)

TINY = (ModelSpec(n_layer=2, n_embd=32, n_head=2), TaskSpec())


# ---- the shaping function -------------------------------------------------------------------------


def test_overlong_penalty_at_the_buffer_boundaries() -> None:
    # L_max 100, L_cache 20: the buffer is (80, 100]
    assert overlong_penalty(0, 100, 20) == 0.0
    assert overlong_penalty(80, 100, 20) == 0.0  # |y| = L_max - L_cache: not yet punished
    assert overlong_penalty(81, 100, 20) == pytest.approx(-1 / 20)
    assert overlong_penalty(90, 100, 20) == pytest.approx(-0.5)  # half way through the buffer
    assert overlong_penalty(100, 100, 20) == pytest.approx(-1.0)  # |y| = L_max
    assert overlong_penalty(101, 100, 20) == -1.0  # beyond
    assert overlong_penalty(90, 100, 20, penalty=0.4) == pytest.approx(-0.2)
    assert overlong_penalty(500, 100, 20, penalty=0.4) == -0.4
    for bad in (0, 100, 120):
        with pytest.raises(ValueError):
            overlong_penalty(50, 100, bad)


def test_informative_groups_are_those_with_unequal_rewards() -> None:
    s = [
        Sample([1], [2], 1.0, 0),
        Sample([1], [2], 0.0, 0),
        Sample([1], [2], 1.0, 1),
        Sample([1], [2], 1.0, 1),
        Sample([1], [2], 0.0, 2),
        Sample([1], [2], 0.0, 2),
        Sample([1], [2], 0.5, 3),  # a lone response: nothing to compare with
    ]
    assert informative_groups(s) == {0}
    assert float(sample_advantages(s)[2:].abs().sum()) == 0.0  # what is dropped had zero advantage


# ---- the job file -----------------------------------------------------------------------------------


def test_knobs_parse_off_by_default_and_validate_the_buffer() -> None:
    base = {"name": "dapo", "rollout": {"max_workers": 0}}
    a = parse_spec(base).algorithm
    assert a.overlong_buffer is None and a.dynamic_sampling is False and a.loss_knobs_set() == []
    on = {"max_new_tokens": 40, "overlong_buffer": {"length": 16}, "dynamic_sampling": True}
    a = parse_spec({**base, "algorithm": on}).algorithm
    assert a.overlong_buffer is not None and (a.overlong_buffer.length, a.overlong_buffer.penalty) == (16, 1.0)
    assert a.loss_knobs_set() == ["overlong_buffer", "dynamic_sampling"]
    with pytest.raises(SpecError) as e:
        parse_spec({**base, "algorithm": {"max_new_tokens": 16, "overlong_buffer": {"length": 16}}})
    assert "overlong_buffer.length (16) must be < algorithm.max_new_tokens (16)" in str(e.value)
    with pytest.raises(SpecError) as e:
        parse_spec({**base, "algorithm": {"overlong_buffer": {"length": 4, "penalty": -1}}})
    assert "penalty" in str(e.value)


# ---- the learner ------------------------------------------------------------------------------------


def _learner(**knobs: object) -> Learner:
    algo = AlgorithmSpec.model_validate({"learning_rate": 1e-2, "seed": 0, **knobs})
    return Learner(TINY[0], algo, TINY[1], seed=0, device="cpu")


def _params(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.model.state_dict().items()}


def _step(samples: Sequence[Sample], **knobs: object) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    learner = _learner(**knobs)
    metrics = learner.train_step(samples)
    return _params(learner), metrics


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _constant(samples: Sequence[Sample], groups: set[int], reward: float = 1.0) -> list[Sample]:
    return [dataclasses.replace(s, reward=reward) if s.group in groups else s for s in samples]


def test_defaults_leave_samples_and_advantages_untouched() -> None:
    samples = _constant(_samples(*TINY, n_groups=3), {1})
    kept, penalties, dropped = _learner()._trainable(samples)
    assert all(a is b for a, b in zip(kept, samples, strict=True)) and len(kept) == len(samples)
    assert (penalties, dropped) == (0.0, 0)
    assert torch.equal(sample_advantages(kept), sample_advantages(samples))
    _, metrics = _step(samples)
    assert not {"overlong_penalty_mean", "groups_dropped", "update_skipped"} & metrics.keys()


def test_a_buffer_no_response_reaches_changes_nothing_bit_for_bit() -> None:
    samples = _samples(*TINY, n_groups=3)  # responses of 1..7 tokens; max_new_tokens 12
    assert max(len(s.response_ids) for s in samples) <= 12 - 5
    off, m_off = _step(samples)
    on, m_on = _step(samples, overlong_buffer={"length": 5})
    assert _equal(off, on)
    assert m_on["overlong_penalty_mean"] == 0.0
    assert {k: m_on[k] for k in m_off} == m_off


def test_overlong_penalty_shapes_the_reward_before_advantages() -> None:
    # all rewards equal: no signal without shaping; the buffer punishes the long responses
    samples = _constant(_samples(*TINY, n_groups=3), {0, 1, 2}, reward=1.0)
    lens = [len(s.response_ids) for s in samples]
    buffer = {"length": 6, "penalty": 0.5}  # buffer (6, 12]
    pens = [overlong_penalty(n, 12, 6, 0.5) for n in lens]
    assert any(pens) and not all(pens)
    on, metrics = _step(samples, overlong_buffer=buffer)
    shaped = [dataclasses.replace(s, reward=s.reward + p) for s, p in zip(samples, pens, strict=True)]
    by_hand, _ = _step(shaped)  # the same update as the rewards shaped beforehand
    assert _equal(on, by_hand)
    assert not _equal(on, _step(samples)[0])  # and not the unshaped one
    assert metrics["reward_mean"] == 1.0  # the task reward
    assert metrics["overlong_penalty_mean"] == pytest.approx(sum(pens) / len(pens))
    assert metrics["adv_abs_mean"] > 0


def test_dynamic_sampling_trains_as_if_only_the_informative_groups_were_there() -> None:
    samples = _constant(_samples(*TINY, n_groups=2), {1})  # [informative, constant]
    assert informative_groups(samples) == {0}
    on, m_on = _step(samples, dynamic_sampling=True)
    alone, m_alone = _step([s for s in samples if s.group == 0])
    assert _equal(on, alone)
    assert m_on["groups_dropped"] == 1.0 and m_on["update_skipped"] == 0.0
    assert m_on["loss"] == m_alone["loss"] and m_on["grad_norm"] == m_alone["grad_norm"]
    # the knob matters: off, the constant group's tokens dilute the token mean
    off, _ = _step(samples)
    assert not _equal(on, off)
    assert m_on["reward_mean"] == pytest.approx(sum(s.reward for s in samples) / len(samples))


@pytest.mark.parametrize("ppo", [{"ppo_epochs": 2}, {"ppo_mini_batch_size": 1}])
def test_dynamic_sampling_with_several_updates_per_step(ppo: dict) -> None:
    samples = _constant(_samples(*TINY, n_groups=3), {1})
    on, m_on = _step(samples, dynamic_sampling=True, **ppo)
    alone, m_alone = _step([s for s in samples if s.group != 1], **ppo)
    assert _equal(on, alone)
    assert m_on["updates"] == m_alone["updates"] and m_on["groups_dropped"] == 1.0


@pytest.mark.parametrize("streamed", [False, True])
def test_a_step_whose_groups_are_all_dropped_makes_no_update(streamed: bool) -> None:
    samples = _constant(_constant(_samples(*TINY, n_groups=2), {0}, 1.0), {1}, 0.0)
    learner = _learner(dynamic_sampling=True)
    learner.train_step(_samples(*TINY, n_groups=2))  # a real update first: Adam has state
    before, opt_before = _params(learner), str(learner.optimizer.state_dict())
    if streamed:
        learner.begin_step(token_budget=100)
        learner.add_groups([s for s in samples if s.group == 1])
        learner.add_groups([s for s in samples if s.group == 0])
        metrics = learner.finish_step()
    else:
        metrics = learner.train_step(samples)
    assert _equal(before, _params(learner)) and str(learner.optimizer.state_dict()) == opt_before
    assert metrics["update_skipped"] == 1.0 and metrics["groups_dropped"] == 2.0
    assert metrics["loss"] == 0.0 and metrics["reward_mean"] == 0.5
    assert (metrics["updates"], metrics["lr"]) == (0.0, learner.optimizer.param_groups[0]["lr"])
    assert learner.steps_done == 2
    learner.train_step(_samples(*TINY, n_groups=2))  # and the next step trains as usual
    assert not _equal(before, _params(learner))


def test_metrics_rows_carry_the_dapo_figures_only_when_on(tmp_path) -> None:
    import json

    from rlboost.cli.metrics_log import MetricsLog
    from tests.test_metrics_log import rec

    log = MetricsLog(tmp_path / "m.jsonl")
    log.write(rec(1), clock=1.0, dollars=0.0, preemptions=0)
    dapo = rec(2, overlong_penalty_mean=-0.25, groups_dropped=3, update_skipped=False)
    log.write(dapo, clock=2.0, dollars=0.0, preemptions=0)
    off, on = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert not {"overlong_penalty_mean", "groups_dropped", "update_skipped"} & off.keys()
    assert (on["overlong_penalty_mean"], on["groups_dropped"], on["update_skipped"]) == (-0.25, 3, False)
