"""The adaptive speculation rule (rlboost/contracts/speculation.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlboost.contracts.speculation import AcceptanceMeter, PassCost, batch_step_cost, draft_length, expected_yield


def test_expected_yield_matches_the_geometric_series():
    assert expected_yield(0.5, 0) == 1.0
    assert expected_yield(0.5, 2) == 1 + 0.5 + 0.25
    assert expected_yield(1.0, 3) == 4.0
    assert expected_yield(0.0, 5) == 1.0


def test_it_speculates_in_the_tail_and_not_in_a_full_batch():
    cost = batch_step_cost(64)
    assert draft_length(0.6, live=64, max_tokens=4, step_cost=cost) == 0  # full batch: verification costs
    assert draft_length(0.6, live=4, max_tokens=4, step_cost=cost) == 4  # tail: the forward pass is idle
    assert draft_length(0.6, live=20, max_tokens=8, step_cost=cost) == 2  # 20 * 3 = 60 fits, 20 * 4 does not


def test_no_drafting_when_nothing_is_accepted():
    assert draft_length(0.0, live=1, max_tokens=8, step_cost=lambda n: 1.0 + 0.01 * n) == 0


@given(st.floats(0, 1), st.integers(0, 300), st.integers(0, 16), st.integers(1, 256))
def test_the_choice_is_never_slower_than_plain_decoding(accept, live, max_tokens, cap):
    cost = batch_step_cost(cap)
    k = draft_length(accept, live, max_tokens, cost)
    assert 0 <= k <= max_tokens
    if live:
        assert expected_yield(accept, k) / cost(live * (k + 1)) >= 1 / cost(live) * (1 - 1e-9)


def test_the_meter_moves_from_its_prior_toward_what_it_sees():
    m = AcceptanceMeter(prior=0.5)
    assert m.rate == 0.5
    for _ in range(50):
        m.update(drafted=4, accepted=4)
    assert m.rate > 0.9
    for _ in range(50):
        m.update(drafted=4, accepted=0)
    assert m.rate < 0.1


def test_pass_cost_answers_from_measurements_and_the_prior_between() -> None:
    """PassCost: the prior alone until a pass is measured; a measured size its running mean; between
    two measured sizes linear; beyond them the prior's shape scaled to the nearest measurement."""
    cost = PassCost(batch_step_cost(64), keep=0.5)
    assert cost(64) == cost(10) == 1.0 and cost(65) == 2.0  # the memory-bound prior
    assert not cost.knows_plain(64)
    cost.observe(64, 0.010)
    assert cost.knows_plain(64) and cost.knows_plain(100) and not cost.knows_plain(32)
    assert cost(64) == 0.010 and cost(32) == 0.010 and cost(128) == pytest.approx(0.020)  # scaled prior
    cost.observe(256, 0.016)
    assert cost(160) == pytest.approx(0.013)  # half-way between the measured 64 and 256
    assert cost(512) == pytest.approx(0.032)  # the prior's doubling, from the measured 256
    # what draft_length makes of it (64 live rows): a pass over 4x the tokens costs 1.6x, so at acceptance
    # 0.3 one drafted token pays and three do not; at 0.1 none does. The prior alone would draft 3.
    assert draft_length(0.3, 64, 3, cost) == 1 and draft_length(0.1, 64, 3, cost) == 0
    assert draft_length(0.3, 64, 3, batch_step_cost(256)) == 3
    cost.observe(64, 0.020)
    assert cost(64) == pytest.approx(0.015)  # running mean (keep 0.5)


def test_a_width_once_measured_slow_is_tried_again_after_retry_after_passes() -> None:
    """One slow pass (a hiccup) at a drafting width: draft_length stops drafting, so nothing would ever
    measure that width again; after `retry_after` plain passes it is priced as unmeasured (the prior
    scaled from the fresh plain pass), drafted again, and its new time replaces the slow one."""
    cost = PassCost(batch_step_cost(256), retry_after=10)
    cost.observe(64, 0.010)  # plain: 64 live rows
    cost.observe(256, 0.100)  # 3 drafted tokens a row, once, during a hiccup: 10x a plain pass
    assert draft_length(0.6, 64, 3, cost) == 0  # judged slow: no drafting
    for _ in range(9):
        cost.observe(64, 0.010)
    assert draft_length(0.6, 64, 3, cost) == 0  # not yet: 9 passes since
    cost.observe(64, 0.010)
    assert cost(256) == pytest.approx(0.010)  # stale: the prior's shape from the plain pass (one unit)
    assert draft_length(0.6, 64, 3, cost) == 3  # tried again
    cost.observe(256, 0.012)
    assert cost(256) == pytest.approx(0.012)  # replaced, not blended with the stale 0.100
    assert draft_length(0.6, 64, 3, cost) == 3
    every_width_stale = PassCost(batch_step_cost(256), retry_after=1)
    every_width_stale.observe(64, 0.010)
    every_width_stale.observe(256, 0.100)
    every_width_stale.passes += 5  # nothing fresher: the old measurements still price
    assert every_width_stale(256) == pytest.approx(0.100)
