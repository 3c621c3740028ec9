"""Speculative decoding in the simulator (issue 38): the cited acceptance model, the verification cost,
and replays that speculate where the job asks (and `sync` never does)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml

from rlboost.cli.sim_report import results_json
from rlboost.contracts.perf import DEFAULT_PERF, EngineModel
from rlboost.contracts.spec import load_spec
from rlboost.contracts.speculation import draft_length, expected_yield
from rlboost.contracts.speculation_perf import (
    ACCEPTANCE,
    GROUP_MEAN_LENGTH,
    NGRAM_MEAN_LENGTH,
    rate_from_mean_length,
)
from rlboost.simulator import PRESETS
from rlboost.simulator import cli as sim_cli
from rlboost.simulator.engines import ModelledEngine
from rlboost.simulator.speculation import Speculation
from rlboost.simulator.step_state import StepState

PAPER = Path(__file__).resolve().parents[1] / "examples/simulate/paper-h100.yaml"


def test_the_rates_give_back_the_cited_mean_lengths_at_a_long_draft():
    for tau in (NGRAM_MEAN_LENGTH, GROUP_MEAN_LENGTH):
        assert expected_yield(rate_from_mean_length(tau), 10_000) == pytest.approx(tau)
        # at a short draft the same rate yields less: the inversion is the low end
        assert expected_yield(rate_from_mean_length(tau), 2) < tau
    with pytest.raises(ValueError):
        rate_from_mean_length(0.5)


def test_group_acceptance_grows_with_the_siblings_done_from_the_ngram_rate():
    a = [ACCEPTANCE.rate("group", f / 7) for f in range(8)]
    assert a[0] == ACCEPTANCE.rate("ngram", 0.5) == rate_from_mean_length(NGRAM_MEAN_LENGTH)
    assert a[-1] == pytest.approx(rate_from_mean_length(GROUP_MEAN_LENGTH))
    assert all(x < y for x, y in itertools.pairwise(a))
    assert ACCEPTANCE.rate("none", 1.0) == 0.0


def test_a_verification_pass_costs_a_decode_step_of_its_tokens():
    m = EngineModel.for_accelerator(DEFAULT_PERF["H100"], count=2, max_batch=128)
    for live in (1, 2, 3, 64, 256):
        assert m.pass_time(live, live) == m.step_time(live)  # no drafts: a decode step
    # one sequence's tokens stay on one GPU of the two: 5 tokens cost a GPU's decode step of 5
    one = EngineModel.for_accelerator(DEFAULT_PERF["H100"], count=1, max_batch=128)
    assert m.pass_time(5, 1) == pytest.approx(one.step_time(5))
    assert m.pass_time(5, 1) < 5 * m.step_time(1)  # the point of drafting: the tail is memory-bound


def _engine(live: set[int], n_resp: int = 16, group: int = 8) -> tuple[ModelledEngine, StepState]:
    model = EngineModel.for_accelerator(DEFAULT_PERF["H100"], count=1, max_batch=128)
    e = ModelledEngine(0, "e0", "reserved", model, None, 0.0, False)
    s = StepState(0, 0.0, n_resp, group, None, [])
    e.live = set(live)
    return e, s


def test_an_engine_picks_k_with_the_shared_rule_and_advances_by_the_expected_yield():
    e, s = _engine({7})
    s.done[:7] = True  # every sibling of response 7 has finished
    sp = Speculation("group", 8, lambda: s)
    a = ACCEPTANCE.rate("group", 1.0)
    k = draft_length(a, 1, 8, lambda n: e.model.pass_time(n, 1))
    assert k > 0
    assert sp.seconds_per_token(e) == pytest.approx(e.model.pass_time(k + 1, 1) / expected_yield(a, k))
    # with no sibling done it drafts from less: slower per token, still faster than plain decoding
    e2, s2 = _engine({7})
    slow = Speculation("group", 8, lambda: s2).seconds_per_token(e2)
    assert sp.seconds_per_token(e) < slow < e.model.step_time(1)


def test_a_full_batch_does_not_draft():
    e, s = _engine(set(range(128)), n_resp=128)
    s.done[:] = False
    sp = Speculation("ngram", 8, lambda: s)
    assert sp.seconds_per_token(e) == pytest.approx(e.model.step_time(128))


def _job(tmp_path: Path, method: str) -> Path:
    doc = yaml.safe_load(PAPER.read_text())
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"question": f"q{i}", "answer": "1"}) + "\n" for i in range(256)))
    doc["task"]["path"] = str(data)
    doc["algorithm"]["prompts_per_step"] = 16  # small: the test is about the mechanism
    doc["rollout"]["speculative"] = {"method": method, "max_tokens": 8}
    job = tmp_path / f"{method}.yaml"
    job.write_text(yaml.safe_dump(doc))
    return job


def _replays(tmp_path: Path, method: str) -> dict:
    rp = sim_cli.prepare(load_spec(_job(tmp_path, method)), None, constant_workers=1, steps=3, calibrated=False)
    return {p: rp.replay(PRESETS[p]) for p in ("sync", "on-demand", "rlboost")}


def test_replays_speculate_where_the_job_asks_except_sync(tmp_path):
    none, group = _replays(tmp_path, "none"), _replays(tmp_path, "group")
    for r in none.values():
        assert r.speculation is None and all("speculation" not in x for x in r.step_log)
    # sync models veRL's default: the job's speculation does not change it
    assert group["sync"].speculation is None
    assert group["sync"].run_s == none["sync"].run_s and group["sync"].dollars == none["sync"].dollars
    for p in ("on-demand", "rlboost"):
        sp = group[p].speculation
        assert sp is not None and sp["tokens_per_pass"] > 1.0 and 0.0 < sp["acceptance"] < 1.0
        gen_none = sum(x["gen_s"] for x in none[p].step_log)
        gen_group = sum(x["gen_s"] for x in group[p].step_log)
        assert gen_group < gen_none  # the tail decodes faster
        assert group[p].trained_tokens == none[p].trained_tokens  # lossless: the same responses
    # reported per policy in `simulate --json`, only where the replay speculated
    rows = {row["policy"]: row for row in results_json(list(group.values()))}
    assert "speculation" not in rows["sync"] and rows["rlboost"]["speculation"]["tokens_per_pass"] > 1.0


def test_a_speculating_replay_reproduces(tmp_path):
    a = _replays(tmp_path, "group")["rlboost"]
    b = _replays(tmp_path, "group")["rlboost"]
    assert a.step_log == b.step_log and a.dollars == b.dollars and a.speculation == b.speculation


def test_a_recorded_run_gives_the_replay_its_measured_acceptance(tmp_path):
    """`--lengths` with a recorded run's rollouts.jsonl that drafted: the replay's engines draft at that
    run's accepted / drafted (simulate.acceptance), not the cited rates; a run that drafted nothing, or a
    job file's own simulate.acceptance, leaves the job as it is."""
    rows = [{"tokens": [1] * n, "drafted": d, "accepted": a} for n, d, a in [(900, 40, 2), (1500, 60, 3), (700, 0, 0)]]
    drafted_run = tmp_path / "drafted.jsonl"
    drafted_run.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plain_run = tmp_path / "plain.jsonl"
    plain_run.write_text("".join(json.dumps({"tokens": [1] * n}) + "\n" for n in (900, 1500, 700)))
    spec = load_spec(_job(tmp_path, "group"))

    def prepared(lengths: Path, spec=spec):
        return sim_cli.prepare(spec, None, lengths=lengths, constant_workers=1, steps=3, calibrated=False)

    low = prepared(drafted_run)
    assert low.spec.simulate.acceptance == pytest.approx(5 / 100)
    assert prepared(plain_run).spec.simulate.acceptance is None
    own = spec.model_copy(update={"simulate": spec.simulate.model_copy(update={"acceptance": 0.3})})
    assert prepared(drafted_run, own).spec.simulate.acceptance == 0.3
    # the replays: at 5 % drafting gains almost nothing (the shared rule hardly drafts), the cited rates much
    measured = low.replay(PRESETS["on-demand"]).speculation
    cited = prepared(plain_run).replay(PRESETS["on-demand"]).speculation
    assert measured is not None and cited is not None
    assert measured["drafted"] == 0 or measured["acceptance"] == pytest.approx(0.05, abs=1e-9)
    assert measured["tokens_per_pass"] < 1.1 < cited["tokens_per_pass"]


def test_a_recorded_run_file_gives_lengths_and_acceptance_in_one_read(tmp_path):
    """read_recorded: rollouts.jsonl gives sorted positive lengths and the drafted/accepted sums; a JSON
    list of lengths gives no acceptance; a line without `tokens` is named by its number."""
    from rlboost.contracts.lengths import read_recorded

    run = tmp_path / "rollouts.jsonl"
    rows = [{"tokens": [1] * 5, "drafted": 8, "accepted": 6}, {"tokens": []}, {"tokens": [1, 2], "drafted": None}]
    run.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    got = read_recorded(run)
    assert (got.lengths, got.drafted, got.accepted, got.acceptance) == ((2, 5), 8, 6, 0.75)
    listed = tmp_path / "lengths.json"
    listed.write_text("[30, 10, 20]")
    assert read_recorded(listed).lengths == (10, 20, 30) and read_recorded(listed).acceptance is None
    run.write_text(json.dumps({"tokens": [1]}) + "\n" + json.dumps({"text": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"rollouts\.jsonl:2: expected a rollouts\.jsonl line with `tokens`"):
        read_recorded(run)
