"""Migration bookkeeping: completeness, uniqueness and version pinning under arbitrary engine churn."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlboost.rollout.book import ProtocolViolation, Response, RolloutBook

EOS = 2


def resp(rid: str, budget: int = 5, version: int = 0, step: int = 0) -> Response:
    return Response(rid=rid, step=step, version=version, prompt=[1, 5, 6, 3], max_new_tokens=budget, seed=7)


def test_take_assigns_and_finish_completes_once():
    b = RolloutBook(EOS)
    b.add([resp("a"), resp("b")])
    got = b.take("e1", 10, version=0)
    assert [r.rid for r in got] == ["a", "b"]
    assert b.accept("e1", "a", 0, [5, 6, EOS], [-0.1, -0.2, -0.3], 0) == 3
    assert b.finish("e1", "a", "eos", 3)
    assert not b.finish("e1", "a", "eos", 3)  # second completion is ignored
    assert b.outstanding(0) == 1


def test_release_requeues_with_partial_tokens_and_counts_migration():
    b = RolloutBook(EOS)
    b.add([resp("a", budget=6)])
    b.take("e1", 1, 0)
    b.accept("e1", "a", 0, [7, 8], [-1.0, -1.0], 0)
    assert b.release("e1") == ["a"]
    [r] = b.take("e2", 1, 0)
    assert r.tokens == [7, 8] and r.remaining == 4
    b.accept("e2", "a", 2, [9, EOS], [-1.0, -1.0], 0)
    assert b.finish("e2", "a", "eos", 4)
    [done] = b.collect(0)
    assert done.tokens == [7, 8, 9, EOS]
    assert done.engines == ["e1", "e2"] and done.migrated
    assert b.migrations == 1


def test_a_response_continued_on_many_engines_is_one_migration():
    """`migrations` counts responses whose tokens came from more than one engine (what the records'
    engine lists say), once each: moved twice, moved back, or handed back to the same engine."""
    b = RolloutBook(EOS)
    b.add([resp("a", budget=9)])
    for step, engine in enumerate(("e1", "e2", "e1", "e3")):
        b.take(engine, 1, 0)
        b.accept(engine, "a", 2 * step, [7, 8], [-1.0, -1.0], 0)
        b.release(engine)
    assert b.responses["a"].engines == ["e1", "e2", "e1", "e3"] and b.responses["a"].migrated
    assert b.migrations == 1
    b = RolloutBook(EOS)
    b.add([resp("b", budget=9)])
    for step in range(2):  # tokens from e4, handed back, then e4 again: never another engine
        b.take("e4", 1, 0)
        b.accept("e4", "b", step, [7], [-1.0], 0)
        b.release("e4")
    assert b.responses["b"].engines == ["e4"] and not b.responses["b"].migrated
    assert b.migrations == 0


def test_late_frames_from_released_engine_are_dropped():
    b = RolloutBook(EOS)
    b.add([resp("a")])
    b.take("e1", 1, 0)
    b.release("e1")
    assert b.accept("e1", "a", 0, [5], [-1.0], 0) == 0
    assert b.responses["a"].tokens == []


def test_wrong_version_gap_and_overflow_are_violations():
    b = RolloutBook(EOS)
    b.add([resp("a", budget=2, version=3)])
    assert b.take("e1", 1, version=2) == []  # pinned: an engine on another version gets nothing
    b.take("e1", 1, version=3)
    with pytest.raises(ProtocolViolation):
        b.accept("e1", "a", 0, [5], [-1.0], version=2)
    with pytest.raises(ProtocolViolation):
        b.accept("e1", "a", 1, [5], [-1.0], version=3)
    with pytest.raises(ProtocolViolation):
        b.accept("e1", "a", 0, [5, 6, 7], [-1.0] * 3, version=3)


def test_overlapping_resend_keeps_existing_tokens():
    b = RolloutBook(EOS)
    b.add([resp("a")])
    b.take("e1", 1, 0)
    b.accept("e1", "a", 0, [5, 6], [-1.0, -1.0], 0)
    assert b.accept("e1", "a", 1, [6, 7], [-1.0, -1.0], 0) == 1
    assert b.responses["a"].tokens == [5, 6, 7]


def test_release_completes_responses_that_already_ended():
    b = RolloutBook(EOS)
    b.add([resp("a", budget=2), resp("b", budget=3)])
    b.take("e1", 2, 0)
    b.accept("e1", "a", 0, [5, 6], [-1.0, -1.0], 0)  # budget used up, finish frame lost
    b.accept("e1", "b", 0, [5, EOS], [-1.0, -1.0], 0)  # ended on EOS, finish frame lost
    assert b.release("e1") == []
    assert b.outstanding(0) == 0
    assert {r.finish for r in b.collect(0)} == {"length", "eos"}


def test_false_finish_claim_is_requeued():
    b = RolloutBook(EOS)
    b.add([resp("a", budget=4)])
    b.take("e1", 1, 0)
    b.accept("e1", "a", 0, [5], [-1.0], 0)
    assert not b.finish("e1", "a", "eos", 1)  # no EOS token held: continue elsewhere
    assert list(b.queue) == ["a"]


# ---- property: any interleaving of engine churn yields complete, unique, pinned responses ----

ops = st.lists(
    st.tuples(st.sampled_from(["take", "gen", "release", "abort"]), st.integers(0, 2), st.integers(1, 4)),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, n=st.integers(1, 6), budget=st.integers(1, 6))
def test_churn_never_loses_or_duplicates(ops, n, budget):
    """A reference generator: token at position p of rid is f(rid, p) (like seeded sampling)."""

    def tok(rid: str, p: int) -> int:
        return EOS if (hash((rid, p)) % 7 == 0) else 10 + p

    b = RolloutBook(EOS)
    rids = [f"r{i}" for i in range(n)]
    b.add([resp(r, budget=budget) for r in rids])
    engines = [f"e{i}" for i in range(3)]

    def gen(e: str, k: int) -> None:
        for rid in sorted(b.assigned(e)):
            r = b.responses[rid]
            start = len(r.tokens)
            ids = []
            for p in range(start, min(start + k, r.max_new_tokens)):
                ids.append(tok(rid, p))
                if ids[-1] == EOS:
                    break
            b.accept(e, rid, start, ids, [-1.0] * len(ids), 0)
            if ids and (ids[-1] == EOS or start + len(ids) == r.max_new_tokens):
                b.finish(e, rid, "eos" if ids[-1] == EOS else "length", start + len(ids))

    for op, ei, k in ops:
        e = engines[ei]
        if op == "take":
            b.take(e, k, 0)
        elif op == "gen":
            gen(e, k)
        elif op == "release":
            b.release(e)
        else:
            assigned = sorted(b.assigned(e))
            if assigned:
                r = b.responses[assigned[0]]
                b.finish(e, r.rid, "aborted", len(r.tokens))
    # every churned engine goes away; one healthy engine finishes everything
    for e in engines:
        b.release(e)
    for _ in range(n * budget + 5):
        b.take("final", n, 0)
        gen("final", budget)
    assert b.outstanding(0) == 0
    done = b.collect(0)
    assert sorted(r.rid for r in done) == rids  # each exactly once
    for r in done:
        expect = []
        for p in range(budget):
            expect.append(tok(r.rid, p))
            if expect[-1] == EOS:
                break
        assert r.tokens == expect  # the same response whatever engine churn happened
        assert r.version == 0
