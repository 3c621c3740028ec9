"""Columnar token ingest (binary frames) equals applying each chunk on its own, whatever the frame holds."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rlboost.contracts import token_frames
from rlboost.rollout.book import ProtocolViolation, Response, RolloutBook

EOS = 2


def fresh(n: int, budget: int) -> RolloutBook:
    b = RolloutBook(EOS, page=4)  # tiny pages: every frame crosses page boundaries
    b.add(Response(rid=f"r{i}", step=0, version=0, prompt=[1, 2], max_new_tokens=budget, seed=i) for i in range(n))
    b.take("e0", n // 2, 0)
    b.take("e1", n, 0)
    return b


def tok(rid: int, p: int) -> int:
    return 10 + (rid * 7 + p) % 20


chunks = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 12), st.integers(0, 5)),  # (response, offset, count)
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(frames=st.lists(st.tuples(st.sampled_from(["e0", "e1"]), chunks), max_size=12), budget=st.integers(3, 12))
def test_a_frame_equals_its_chunks_one_by_one(frames, budget):
    columnar, reference = fresh(6, budget), fresh(6, budget)
    for engine, cs in frames:
        ids = [[tok(r, off + j) for j in range(c)] for r, off, c in cs]
        handles = [columnar.responses[f"r{r}"].handle for r, _, _ in cs]
        data = token_frames.encode(
            0,
            handles,
            [off for _, off, _ in cs],
            [c for _, _, c in cs],
            [t for x in ids for t in x],
            [-float(t) for x in ids for t in x],
        )
        cols = token_frames.decode(data)
        before = {rid: (list(r.tokens), list(r.logprobs)) for rid, r in columnar.responses.items()}
        try:
            got = columnar.accept_columns(engine, 0, cols.handles, cols.offsets, cols.counts, cols.ids, cols.lps)
            col_err = None
        except ProtocolViolation as e:
            got, col_err = 0, e
        want, ref_err = 0, None  # reference: the same chunks, one at a time
        try:
            for (r, off, _), x in zip(cs, ids):
                want += reference.accept(engine, f"r{r}", off, x, [-float(t) for t in x], 0)
        except ProtocolViolation as e:
            ref_err = e
        assert (col_err is None) == (ref_err is None), (col_err, ref_err)
        if col_err is not None:  # rejected as a whole: nothing changed (the engine is dropped here)
            assert {rid: (list(r.tokens), list(r.logprobs)) for rid, r in columnar.responses.items()} == before
            return
        assert got == want
        for rid in columnar.responses:
            assert columnar.responses[rid].tokens == reference.responses[rid].tokens
            assert columnar.responses[rid].logprobs == reference.responses[rid].logprobs


def test_stale_handles_and_other_engines_are_ignored():
    b = fresh(4, 10)
    h = [b.responses[f"r{i}"].handle for i in range(4)]
    owner = {f"r{i}": b.responses[f"r{i}"].engine for i in range(4)}
    e0 = [i for i in range(4) if owner[f"r{i}"] == "e0"]
    cols = token_frames.decode(
        token_frames.encode(0, [h[i] for i in range(4)] + [10**6], [0] * 5, [2] * 5, [5] * 10, [-1.0] * 10)
    )
    assert b.accept_columns("e0", 0, cols.handles, cols.offsets, cols.counts, cols.ids, cols.lps) == 2 * len(e0)
    assert all(len(b.responses[f"r{i}"].tokens) == (2 if i in e0 else 0) for i in range(4))
    assert np.all(b.lengths([b.responses[f"r{i}"] for i in e0]) == 2)
