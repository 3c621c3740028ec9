"""Fuzzing what a worker sends, below the coordinator (issue 56): the binary frame decoder and the rollout
book. Any bytes decode to consistent columns or raise FrameError; any frame the book is handed is stored
or refused with ProtocolViolation, and what it stores is always in the vocabulary, in budget, finite and
consistent. (tests/test_hostile.py drives the same through a live coordinator.)"""

from __future__ import annotations

import contextlib
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlboost.contracts import token_frames
from rlboost.rollout.book import ProtocolViolation, Response, RolloutBook

EOS, VOCAB, BUDGET, VERSION = 2, 50, 12, 3
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

u32 = st.integers(0, 2**32 - 1)
header = st.tuples(
    st.sampled_from([token_frames.MAGIC, b"RBT0", b"\0\0\0\0"]), u32, st.integers(0, 12), st.integers(0, 40)
)


@st.composite
def frame_bytes(draw) -> bytes:
    """Near-valid frames: a header whose counts may or may not match the body that follows."""
    magic, version, k, n = draw(header)
    body_len = draw(st.one_of(st.just(12 * k + 12 * n), st.integers(0, 12 * k + 12 * n + 16)))
    return struct.pack("<4sIII", magic, version, k, n) + draw(st.binary(min_size=body_len, max_size=body_len))


@FUZZ
@given(data=st.one_of(st.binary(max_size=300), frame_bytes()))
def test_decode_returns_consistent_columns_or_frame_error(data):
    try:
        cols = token_frames.decode(data)
    except token_frames.FrameError:
        return
    k, n = cols.handles.shape[0], cols.ids.shape[0]
    assert cols.offsets.shape == cols.counts.shape == (k,) and cols.lps.shape == (n,)
    assert int(cols.counts.sum(dtype=np.int64)) == n
    assert (cols.ids < 2**31).all() and np.isfinite(cols.lps).all()
    assert cols.version < 2**31 and (cols.offsets < 2**31).all()


def new_book() -> tuple[RolloutBook, list[Response]]:
    book = RolloutBook(EOS, page=4, vocab_size=VOCAB)
    rs = [Response(f"r{i}", 0, VERSION, [1, 4], BUDGET, seed=i) for i in range(4)]
    book.add(rs)
    book.take("hostile", 3, VERSION)  # r0..r2 held by the engine under test, r3 queued
    return book, rs


def assert_book_consistent(book: RolloutBook, rs: list[Response]) -> None:
    for r in rs:
        toks, lps = r.tokens, r.logprobs
        assert len(toks) == len(lps) == r.generated <= BUDGET
        assert all(0 <= t < VOCAB for t in toks), toks
        assert all(np.isfinite(lps)), lps
        assert EOS not in toks[:-1], toks  # nothing after an EOS


ids = st.one_of(st.integers(0, VOCAB - 1), st.sampled_from([EOS, VOCAB, 2**31 - 1, -1, 2**40]))
lps = st.one_of(st.floats(-20, 0), st.sampled_from([float("nan"), float("inf"), -float("inf")]))


@st.composite
def chunk_columns(draw):
    """A frame's columns: handles of held, queued and unknown responses; offsets near the right ones;
    counts that may not add up; ids in and out of the vocabulary; log-probs that may not be finite."""
    k = draw(st.integers(0, 5))
    handles = draw(st.lists(st.integers(-1, 6), min_size=k, max_size=k))
    offsets = draw(st.lists(st.integers(-1, BUDGET + 2), min_size=k, max_size=k))
    counts = draw(st.lists(st.integers(0, 5), min_size=k, max_size=k))
    n = sum(counts) + draw(st.sampled_from([0, 0, 0, 1, -1]))
    n = max(n, 0)
    tok = draw(st.lists(ids, min_size=n, max_size=n))
    lp = draw(st.lists(lps, min_size=n + draw(st.sampled_from([0, 0, 1])), max_size=n + 1))
    version = draw(st.sampled_from([VERSION, VERSION, VERSION + 1, -1, 2**31]))
    return version, handles, offsets, counts, tok, lp[: n + 1]


@FUZZ
@given(frames=st.lists(chunk_columns(), min_size=1, max_size=6))
def test_the_book_admits_only_consistent_in_vocabulary_tokens(frames):
    book, rs = new_book()
    for version, handles, offsets, counts, tok, lp in frames:
        cols = [np.asarray(c, np.int64) for c in (handles, offsets, counts, tok)]
        try:
            n = book.accept_columns("hostile", version, *cols, np.asarray(lp, np.float64))
        except ProtocolViolation:
            pass
        else:
            assert n >= 0
        assert_book_consistent(book, rs)


@FUZZ
@given(
    chunks=st.lists(
        st.tuples(
            st.sampled_from(["r0", "r1", "r3", "nope"]),
            st.one_of(st.integers(0, BUDGET), st.integers(-(2**70), 2**70)),
            st.lists(st.one_of(ids, st.integers(-(2**70), 2**70)), max_size=4),
            st.lists(lps, max_size=4),
            st.one_of(st.just(VERSION), st.integers(-(2**70), 2**70)),
        ),
        max_size=4,
    ),
    ends=st.lists(
        st.tuples(
            st.sampled_from(["r0", "r2", "x"]),
            st.sampled_from(["eos", "length", "aborted", "stop", ""]),
            st.integers(-3, 2**40),
        ),
        max_size=3,
    ),
)
def test_json_chunks_and_finishes_are_stored_or_refused(chunks, ends):
    book, rs = new_book()
    with contextlib.suppress(ProtocolViolation):
        book.accept_chunks("hostile", chunks)
    for rid, reason, length in ends:
        with contextlib.suppress(ProtocolViolation):
            book.finish("hostile", rid, reason, length)
    assert_book_consistent(book, rs)
    for r in rs:
        assert r.finish in (None, "eos", "length")


def test_an_id_past_the_vocabulary_is_refused_and_nothing_is_stored():
    """The issue's frame: 2**31 - 1 is within the protocol's range, past the model's vocabulary."""
    book, rs = new_book()
    frame = token_frames.decode(
        token_frames.encode(VERSION, [rs[0].handle, rs[1].handle], [0, 0], [1, 1], [5, 2**31 - 1], [-0.1, -0.2])
    )
    with pytest.raises(ProtocolViolation, match="vocabulary"):
        book.accept_columns("hostile", frame.version, frame.handles, frame.offsets, frame.counts, frame.ids, frame.lps)
    assert rs[0].generated == rs[1].generated == 0  # all or nothing
    last = [np.asarray([x]) for x in (rs[0].handle, 0, 1, VOCAB - 1)]
    assert book.accept_columns("hostile", VERSION, *last, np.asarray([-0.1])) == 1  # the last id is in
    assert rs[0].tokens == [VOCAB - 1]
