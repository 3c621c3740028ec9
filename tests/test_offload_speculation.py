"""The predictive offload knows the engines speculate (issue 38): `pool_finish_s` times the remote pool's
tail with the engines' own drafting rule at the acceptance the pool measures, and is exactly what it was
where nothing drafts; in a replay that speculates the trainer's engine hands over earlier for it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from rlboost.contracts.perf import DEFAULT_PERF, EngineModel
from rlboost.contracts.spec import load_spec
from rlboost.contracts.speculation import draft_length, expected_yield
from rlboost.rollout.policies.offload import Drafting, PredictiveOffload, StepProgress, pool_finish_s
from rlboost.simulator import PRESETS
from rlboost.simulator import cli as sim_cli
from rlboost.simulator.modelled_pool import ModelledPool
from tests.test_sim_speculation import _job as speculating_job

H100 = EngineModel.for_accelerator(DEFAULT_PERF["H100"], count=1, max_batch=128)
NODE = EngineModel.for_accelerator(DEFAULT_PERF["H100"], count=8, max_batch=128)


def test_nothing_drafted_changes_nothing():
    r = np.array([4000.0, 900.0, 30.0] + [200.0] * 300)
    for models in ([H100], [NODE], [H100, NODE]):
        assert pool_finish_s(r, models, None) == pool_finish_s(r, models)
        # an acceptance of 0 yields nothing per draft: the rule drafts nothing, the time stands
        assert pool_finish_s(r, models, Drafting(0.0, 4)) == pool_finish_s(r, models)


def test_a_speculating_tail_finishes_sooner_by_the_engines_rule():
    a = 0.6
    # one sequence alone: its K and pass time from the shared rule, exactly
    k = draft_length(a, 1, 4, lambda n: H100.pass_time(n, 1))
    assert k > 0
    alone = pool_finish_s(np.array([4000.0]), [H100], Drafting(a, 4))
    assert alone == pytest.approx(4000 * H100.pass_time(k + 1, 1) / expected_yield(a, k))
    assert alone < pool_finish_s(np.array([4000.0]), [H100])
    tail = np.array([4000.0] + [10.0] * 255)
    assert pool_finish_s(tail, [NODE], Drafting(a, 4)) < pool_finish_s(tail, [NODE])
    # the better the drafts, the sooner
    assert pool_finish_s(tail, [NODE], Drafting(0.65, 4)) < pool_finish_s(tail, [NODE], Drafting(0.45, 4))


def _reference(r: np.ndarray, replicas: int, d: Drafting) -> float:
    """pool_finish_s on one engine model without its shortcut: the engines' rule asked at every load."""
    one = EngineModel.for_accelerator(DEFAULT_PERF["H100"], count=1, max_batch=128)

    def per_gpu(x: float) -> float:  # a decode step of x sequences on one GPU; queueing beyond its batch
        return one.step_time(x) if x <= one.max_batch else x / one.max_batch * one.step_time(one.max_batch)

    rs = np.sort(r)[::-1]
    step = rs - np.append(rs[1:], 0.0)
    total = 0.0
    for j in range(rs.size):
        k, u = j + 1, max((j + 1) / replicas, 1.0)
        draft = draft_length(d.accept, k, d.max_tokens, lambda n, k=k, u=u: per_gpu(n / k * u))
        total += step[j] * per_gpu(u * (draft + 1)) / expected_yield(d.accept, draft)
    return total


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(1.0, 16_000.0), min_size=1, max_size=1200),
    st.floats(0.0, 0.95),
    st.integers(1, 8),
    st.sampled_from([1, 2, 8]),
)
def test_speculating_pool_times_follow_the_rule_at_every_load(lengths, a, max_tokens, replicas):
    r = np.array(lengths)
    models = [EngineModel.for_accelerator(DEFAULT_PERF["H100"], count=replicas, max_batch=128)]
    d = Drafting(a, max_tokens)
    got = pool_finish_s(r, models, d)
    assert got == pytest.approx(_reference(r, replicas, d), rel=1e-9)
    assert got <= pool_finish_s(r, models) * (1 + 1e-12)  # never slower than plain decoding
    assert pool_finish_s(r, models, Drafting(min(a + 0.04, 0.99), max_tokens)) <= got * (1 + 1e-12)


def _progress(remaining: list[float], total: float, drafting: Drafting | None) -> StepProgress:
    rem = np.asarray(remaining, dtype=float)
    return StepProgress(
        elapsed=10.0,
        remote_engines=1,
        remote_rate=NODE.full_rate(),
        remote_seq_rate=1 / NODE.step_time(1),
        remaining_tokens=float(rem.sum()),
        max_remaining=float(rem.max()),
        total_tokens=total,
        unfinished=rem.size,
        remaining_sample=rem,
        remote_models=(NODE,),
        drafting=drafting,
    )


def test_the_predictive_offload_hands_over_sooner_when_the_tail_drafts():
    p = PredictiveOffload(train_tokens_per_s=1000.0)
    rem = [6000.0] + [100.0] * 50
    plain = p.remote_finish_s(_progress(rem, 0.0, None))
    fast = p.remote_finish_s(_progress(rem, 0.0, Drafting(0.6, 4)))
    assert fast < plain
    total = 1000.0 * (fast + plain) / 2  # the trainer's work ends between the two predictions
    assert not p.should_offload(_progress(rem, total, None))
    assert p.should_offload(_progress(rem, total, Drafting(0.6, 4)))


def _job(tmp_path: Path, method: str) -> Path:
    job = speculating_job(tmp_path, method)  # the paper's job, small
    doc = yaml.safe_load(job.read_text())
    doc["algorithm"]["prompts_per_step"] = 64  # enough that the trainer's engine has a tail to hand over
    job.write_text(yaml.safe_dump(doc))
    return job


def _boxes(tmp_path: Path, method: str) -> list[float]:
    rp = sim_cli.prepare(load_spec(_job(tmp_path, method)), None, constant_workers=2, steps=5, calibrated=False)
    r = rp.replay(PRESETS["rlboost"])
    return [x["box_s"] for x in r.step_log[1:]]  # the first step has no lengths learned yet


def test_a_speculating_replay_hands_over_earlier_for_knowing_it(tmp_path, monkeypatch):
    knowing = _boxes(tmp_path, "group")
    assert all(b is not None for b in knowing)
    monkeypatch.setattr(ModelledPool, "drafting", lambda self: None)  # the offload as it was
    blind = _boxes(tmp_path, "group")
    assert all(b is not None for b in blind)
    assert sum(knowing) < sum(blind)


def test_a_pool_that_does_not_speculate_reports_no_drafting(tmp_path):
    rp = sim_cli.prepare(load_spec(_job(tmp_path, "none")), None, constant_workers=1, steps=1, calibrated=False)
    seen: list[object] = []
    orig = ModelledPool.drafting

    def spy(self: ModelledPool) -> Drafting | None:
        seen.append(orig(self))
        return seen[-1]  # type: ignore[return-value]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ModelledPool, "drafting", spy)
        rp.replay(PRESETS["rlboost"])
    assert seen and all(x is None for x in seen)
