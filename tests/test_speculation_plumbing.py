"""How speculative decoding's inputs and counts travel: the coordinator sends a request's siblings'
tokens (bounded, per group once per frame), the worker hands them to its engine with the request, and
reports the engine's drafted / accepted counts with the request's end, which the coordinator adds to
the response (summed over the engines it ran on). Frames with inconsistent counts are refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rlboost.contracts import protocol as P
from rlboost.contracts.engine import DraftCounts
from rlboost.contracts.speculation import AcceptanceMeter
from rlboost.rollout import live_pool
from rlboost.rollout.book import Response, RolloutBook
from rlboost.rollout.policies.lengths import LengthStats

EOS = 2


def _book(n: int, group_of=lambda i: "p0") -> RolloutBook:
    b = RolloutBook(EOS)
    b.add(
        Response(rid=f"s0-p0-g{i}", step=0, version=0, prompt=[1, 3], max_new_tokens=50, seed=i, group=group_of(i))
        for i in range(n)
    )
    return b


def test_siblings_sent_are_the_groups_others_finished_first_and_bounded(monkeypatch) -> None:
    b = _book(5, group_of=lambda i: "p1" if i == 4 else "p0")
    b.take("e1", 5, 0)
    b.accept("e1", "s0-p0-g0", 0, [5, 6], [-1.0] * 2, 0)  # partial, short
    b.accept("e1", "s0-p0-g1", 0, [7, 8, 9, 10], [-1.0] * 4, 0)  # partial, longer
    b.accept("e1", "s0-p0-g2", 0, [11, EOS], [-1.0] * 2, 0)
    assert b.finish("e1", "s0-p0-g2", "eos", 2)  # finished
    b.accept("e1", "s0-p1-g4", 0, [12], [-1.0], 0)  # another group
    pool = live_pool.LivePool(b, {}, LengthStats(50), lambda: 0.0)
    batch = [b.responses["s0-p0-g3"], b.responses["s0-p0-g0"]]  # g0 is in the batch: not its own sibling
    assert pool.siblings_of(batch) == {"p0": [[11, EOS], [7, 8, 9, 10]]}
    monkeypatch.setattr(live_pool, "SIBLING_TOKENS", 5)
    assert pool.siblings_of(batch) == {"p0": [[11, EOS]]}  # the next would pass the frame's budget
    msg = P.Generate(requests=[], siblings=pool.siblings_of(batch))
    assert P.coord_msg.validate_json(msg.model_dump_json()) == msg


def test_generate_refuses_more_sibling_tokens_than_its_cap() -> None:
    with pytest.raises(ValidationError, match="siblings carry more"):
        P.Generate(requests=[], siblings={"p0": [[1] * (P.MAX_SIBLING_TOKENS + 1)]})


def test_finished_counts_are_one_per_rid_and_accepted_never_exceeds_drafted() -> None:
    ok = P.Finished(rids=["a"], reasons=["eos"], lengths=[3], drafted=[4], accepted=[2], draft_passes=[1])
    assert P.worker_msg.validate_json(ok.model_dump_json()) == ok
    assert P.Finished(rids=["a"], reasons=["eos"], lengths=[3]).drafted == []  # an engine that does not draft
    with pytest.raises(ValidationError, match="one each per rid"):
        P.Finished(rids=["a", "b"], reasons=["eos", "eos"], lengths=[3, 3], drafted=[1], accepted=[1], draft_passes=[1])
    with pytest.raises(ValidationError, match="more tokens accepted"):
        P.Finished(rids=["a"], reasons=["eos"], lengths=[3], drafted=[1], accepted=[2], draft_passes=[1])


def test_worker_hands_siblings_to_the_engine_and_reports_its_counts() -> None:
    from rlboost.worker.agent import WorkerAgent, WorkerConfig

    agent = WorkerAgent(WorkerConfig(trainer_url="http://x", token="t", worker_id="w"))
    sib = [[5, 6, 7]]
    specs = [P.GenSpec(rid=f"r{i}", prompt=[1], max_new_tokens=4, seed=i, version=0, group="p0") for i in range(2)]
    agent._take(P.Generate(requests=[*specs, P.GenSpec(rid="x", prompt=[1], max_new_tokens=4, seed=0, version=0)],
                           siblings={"p0": sib}))
    reqs = agent._admit(10)
    assert [(r.rid, r.group, r.siblings) for r in reqs] == [("r0", "p0", sib), ("r1", "p0", sib), ("x", None, [])]

    class Drafting:
        drafts = {"r0": DraftCounts(6, 4, 2)}

    agent.engine = Drafting()  # type: ignore[assignment]
    assert agent._draft_counts(["r0", "r1"]) == {"drafted": [6, 0], "accepted": [4, 0], "draft_passes": [2, 0]}
    assert Drafting.drafts == {}  # taken: a request that comes back starts new counts
    agent.engine = object()  # type: ignore[assignment]
    assert agent._draft_counts(["r0"]) == {}


def test_coordinator_sums_counts_over_the_engines_a_response_ran_on() -> None:
    from rlboost.rollout.live import CoordinatorConfig, LiveCoordinator

    cfg = CoordinatorConfig(job_seed=0, temperature=1.0, chunk_tokens=8, heartbeat_s=1, heartbeat_timeout_s=4,
                            weights_url="", model={}, engine_dtype="float32", engine_batch=8, eos_id=EOS,
                            speculative=P.Speculation(method="group"))
    coord = LiveCoordinator(cfg)
    assert coord.pool.send_siblings and coord._welcome("w").speculative.method == "group"
    assert coord.pool.drafting() is None  # nothing drafted yet: the offload predicts plain decoding
    b = coord.book
    b.add([Response(rid="a", step=0, version=0, prompt=[1, 3], max_new_tokens=9, seed=1, group="p0")])

    class Conn:
        def __init__(self, cid: str) -> None:
            self.id = cid

    b.take("e1", 1, 0)
    b.accept("e1", "a", 0, [5, 6, 7], [-1.0] * 3, 0)
    aborted = P.Finished(rids=["a"], reasons=["aborted"], lengths=[3], drafted=[4], accepted=[2], draft_passes=[1])
    coord._count_drafts(Conn("e1"), aborted)  # type: ignore[arg-type]
    coord._count_drafts(Conn("e9"), aborted)  # type: ignore[arg-type]  (not its engine: ignored)
    b.finish("e1", "a", "aborted", 3)
    b.take("e2", 1, 0)
    b.accept("e2", "a", 3, [8, EOS], [-1.0] * 2, 0)
    coord._count_drafts(  # type: ignore[arg-type]
        Conn("e2"), P.Finished(rids=["a"], reasons=["eos"], lengths=[5], drafted=[3], accepted=[1], draft_passes=[1])
    )
    r = b.responses["a"]
    assert (r.drafted, r.accepted, r.draft_passes) == (7, 3, 2)
    # the offload's view of the pool: the measured acceptance (e9's counts ignored), the job's max K
    d = coord.pool.drafting()
    assert d is not None and d.max_tokens == P.Speculation().max_tokens
    seen = AcceptanceMeter()
    seen.update(4, 2)
    seen.update(3, 1)
    assert d.accept == seen.rate < AcceptanceMeter().rate  # 3 of 7 accepted pulls the prior (0.5) down


def test_a_live_pool_that_does_not_speculate_predicts_plain_decoding() -> None:
    from rlboost.rollout.live import CoordinatorConfig, LiveCoordinator

    cfg = CoordinatorConfig(job_seed=0, temperature=1.0, chunk_tokens=8, heartbeat_s=1, heartbeat_timeout_s=4,
                            weights_url="", model={}, engine_dtype="float32", engine_batch=8, eos_id=EOS)
    coord = LiveCoordinator(cfg)
    coord.pool.count_drafts(10, 10)
    assert coord.pool.drafting() is None


def test_step_figures_count_tokens_per_verifying_pass() -> None:
    from rlboost.contracts.step_record import speculation_figures

    # two responses: 3 passes gaining 2+1+1 tokens with 3 drafted tokens accepted of 8; nothing drafted
    figs = speculation_figures([(6, 2, 2), (2, 1, 1), (0, 0, 0)])
    assert figs == {"spec_drafted": 8, "spec_accepted": 3, "spec_tokens_per_pass": 2.0}
    assert speculation_figures([(0, 0, 0)])["spec_tokens_per_pass"] is None
