"""Speculative decoding in the torch engine (rollout.speculative) is lossless: with drafting on, every
response is token for token (and logprob for logprob, in float64) the one plain decoding gives, on
TinyGPT and on a Hugging Face architecture; a response aborted mid-draft and continued elsewhere ends
as its uninterrupted run; drafts come from siblings (co-batched, or brought by the request). The
drafter's index is checked against a brute-force search."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlboost.contracts.engine import GenRequest
from rlboost.contracts.sampling import request_seed
from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, SpeculativeSpec, TaskSpec
from rlboost.models.drafting import NgramIndex
from tests.test_engine_contract import Recorder
from tests.test_engine_contract import run as _run
from tests.torch_threads import one_thread  # noqa: F401  (autouse: single-threaded torch)

BUDGET = 40
PROMPTS = [[1, 14, 15, 16, 3], [1, 20, 3], [1, 17, 22, 18, 19, 21, 23, 3]]


def _requests(prompts: list[list[int]], group_size: int = 3, budget: int = BUDGET) -> list[GenRequest]:
    out = []
    for p, prompt in enumerate(prompts):
        for g in range(group_size):
            rid = f"s0-p{p}-g{g}"
            out.append(GenRequest(rid, list(prompt), budget, request_seed(5, rid), group=f"p{p}"))
    return out


def _tiny_engines(weights: str) -> Callable[[str], object]:
    from rlboost.models.torch_engine import TorchEngine
    from rlboost.trainer.learner import Learner

    spec = ModelSpec()
    learner = Learner(spec, AlgorithmSpec(), TaskSpec(), seed=0 if weights == "stops" else 1)
    if weights == "stops":
        learner.warm_start(40)
    state = learner.state_dict()

    def build(method: str) -> TorchEngine:
        e = TorchEngine(spec, dtype="float64", speculative=SpeculativeSpec(method=method, max_tokens=4))
        e.load_weights(1, state)
        return e

    return build


def _assert_same(a: Recorder, b: Recorder) -> None:
    assert a.ids == b.ids
    for rid in a.ids:
        np.testing.assert_allclose(a.lps[rid], b.lps[rid], rtol=0, atol=1e-9)


def _drafted(engine) -> tuple[int, int]:
    return sum(c.drafted for c in engine.drafts.values()), sum(c.accepted for c in engine.drafts.values())


@pytest.mark.parametrize("weights", ["stops", "long"])
@pytest.mark.parametrize("method", ["group", "ngram"])
def test_tiny_gpt_same_responses_with_and_without_speculation(weights: str, method: str) -> None:
    build = _tiny_engines(weights)
    requests = _requests(PROMPTS)
    plain, plain_reasons = _run(build("none"), requests)
    spec_engine = build(method)
    spec, spec_reasons = _run(spec_engine, requests)
    _assert_same(spec, plain)
    assert spec_reasons == plain_reasons
    drafted, accepted = _drafted(spec_engine)
    assert drafted > 0 and 0 <= accepted <= drafted  # it did verify drafts (and rejected some)


@pytest.mark.parametrize("truncation", [{"top_k": 4}, {"top_p": 0.7}, {"top_k": 8, "top_p": 0.9}])
@pytest.mark.parametrize("method", ["group", "ngram"])
def test_tiny_gpt_same_responses_with_and_without_speculation_under_top_k_top_p(method: str, truncation: dict) -> None:
    """Verification samples every fed position with the same truncated rule: drafting stays lossless."""
    build = _tiny_engines("long")
    requests = _requests(PROMPTS)
    plain, plain_reasons = _run(build("none"), requests, **truncation)
    spec_engine = build(method)
    spec, spec_reasons = _run(spec_engine, requests, **truncation)
    _assert_same(spec, plain)
    assert spec_reasons == plain_reasons
    drafted, accepted = _drafted(spec_engine)
    assert drafted > 0 and 0 <= accepted <= drafted
    assert plain.ids != _run(build("none"), requests)[0].ids  # the truncation reached the sampler


def test_a_sibling_brought_by_the_request_drafts_its_text() -> None:
    """A request whose sibling (generated elsewhere) wrote exactly its text: every draft is accepted."""
    build = _tiny_engines("long")
    (r,) = _requests(PROMPTS[:1], group_size=1)
    plain, _ = _run(build("none"), [r])
    text = plain.ids[r.rid]
    e = build("group")
    again, _ = _run(e, [GenRequest(r.rid, r.prompt, BUDGET, r.seed, group=r.group, siblings=[list(text)])])
    _assert_same(again, plain)
    drafted, accepted = _drafted(e)
    assert drafted >= len(text) // 2 and accepted == drafted
    assert e.drafts[r.rid].passes < len(text) / 2  # several tokens per forward pass


def test_aborted_mid_draft_and_continued_elsewhere_equals_the_uninterrupted_run() -> None:
    """Tokens arrive several at a time with drafting: an abort after the 5th token lands mid-draft. The
    partial response continues on a second engine (also drafting) and ends as the plain run did."""
    build = _tiny_engines("long")
    (r,) = _requests(PROMPTS[:1], group_size=1)
    plain, plain_reasons = _run(build("none"), [r])
    text = plain.ids[r.rid]
    siblings = [list(text)]  # a sibling with the same text: drafts of several tokens per step
    first = build("group")
    rec = Recorder([r])
    req = GenRequest(r.rid, r.prompt, BUDGET, r.seed, group=r.group, siblings=siblings)
    reasons = first.generate([req], rec, lambda rid: len(rec.ids[rid]) >= 5, 1.0)
    partial = rec.ids[r.rid]
    assert reasons[r.rid] == "aborted" and 5 <= len(partial) < len(text) and partial == text[: len(partial)]
    assert len(partial) > 5  # it stopped after a step that streamed several tokens: mid-draft
    rest = GenRequest(r.rid, r.prompt, BUDGET - len(partial), r.seed, prefix=partial, group=r.group, siblings=siblings)
    tail, tail_reasons = _run(build("group"), [rest])
    assert partial + tail.ids[r.rid] == text and tail_reasons == plain_reasons
    np.testing.assert_allclose(rec.lps[r.rid] + tail.lps[r.rid], plain.lps[r.rid], rtol=0, atol=1e-9)


def test_hf_same_responses_with_and_without_speculation(tmp_path) -> None:
    """A random tiny Qwen2 repeats little of itself, so texts to draft from are brought by the requests
    (as the coordinator sends siblings' texts)."""
    pytest.importorskip("transformers")
    from rlboost.models.torch_engine import TorchEngine
    from testkit.hf_fixtures import make_tiny_model

    spec = ModelSpec(kind="hf", path=str(make_tiny_model(tmp_path / "m")), dtype="float32")
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17, 5, 6, 7]]
    requests = _requests(prompts, budget=24)

    def engine(method: str) -> TorchEngine:
        return TorchEngine(spec, dtype="float64", speculative=SpeculativeSpec(method=method, max_tokens=4))

    plain, plain_reasons = _run(engine("none"), requests)
    # each request brings a "sibling" that wrote its text up to token 12 and then other tokens: drafts
    # are accepted up to there and rejected after
    def diverging(text: list[int]) -> list[int]:
        return text[:12] + [(t + 1) % 300 for t in text[12:]]

    with_siblings = [
        GenRequest(r.rid, r.prompt, r.max_new_tokens, r.seed, group=r.group, siblings=[diverging(plain.ids[r.rid])])
        for r in requests
    ]
    e = engine("group")
    spec_s, spec_reasons = _run(e, with_siblings)
    _assert_same(spec_s, plain)
    assert spec_reasons == plain_reasons
    drafted, accepted = _drafted(e)
    assert 0 < accepted < drafted


# ---- the drafter ------------------------------------------------------------------------------------

def _brute_longest(docs: list[list[int]], context: list[int], lo: int, hi: int) -> int:
    """The longest n in lo..hi whose context suffix occurs in some document with a token after it."""
    for n in range(min(hi, len(context)), lo - 1, -1):
        suf = context[len(context) - n :]
        for d in docs:
            if any(d[e - n : e] == suf for e in range(n, len(d))):
                return n
    return 0


@settings(max_examples=200, deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(0, 3), max_size=30), min_size=1, max_size=4),
    context=st.lists(st.integers(0, 3), max_size=12),
    k=st.integers(0, 6),
)
def test_drafter_proposes_what_followed_the_longest_matching_suffix(docs, context, k) -> None:
    idx = NgramIndex(min_match=1, max_match=5)
    ids = [idx.add_doc() for _ in docs]
    for i, d in zip(ids, docs):  # grown in two parts: extending must index as adding at once does
        idx.extend(i, d[: len(d) // 2])
        idx.extend(i, d[len(d) // 2 :])
    prop = idx.propose(context, k)
    n = _brute_longest(docs, context, 1, 5)
    if k == 0 or n == 0:
        assert prop == []
        return
    assert 1 <= len(prop) <= k
    suf = context[len(context) - n :]
    # some occurrence of the longest matching suffix is followed by exactly the proposal
    assert any(d[e - n : e] == suf and d[e : e + k] == prop for d in docs for e in range(n, len(d)))


def test_a_batch_that_fills_the_engine_decodes_plain() -> None:
    """The static batch computes every row, finished or not: drafting K tokens makes the pass (K + 1)
    times wider, which costs a second pass's worth once it passes the engine's batch (the rule's cost
    without a measurement). A full batch never drafts; one of half the engine's batch drafts."""
    from rlboost.models.torch_engine import TorchEngine
    from rlboost.trainer.learner import Learner

    spec = ModelSpec()
    state = Learner(spec, AlgorithmSpec(), TaskSpec(), seed=1).state_dict()
    requests = _requests(PROMPTS)  # 9 requests
    drafted = {}
    for max_batch in (9, 18):
        e = TorchEngine(spec, dtype="float64", max_batch=max_batch, speculative=SpeculativeSpec(method="ngram"))
        e.load_weights(1, state)
        _run(e, requests)
        drafted[max_batch] = _drafted(e)[0]
    assert drafted[9] == 0 and drafted[18] > 0


class PassTimer:
    """An engine's timer (TorchEngine(timer=...)) on which a decode pass lasts cost(tokens it feeds):
    it is read at a pass's start and end, so every second reading adds the pass under way."""

    def __init__(self, cost: Callable[[int], float]) -> None:
        self.cost, self.t, self.engine, self.started = cost, 0.0, None, False

    def __call__(self) -> float:
        if self.started:
            self.t += self.cost(self.engine.fed_tokens)
        self.started = not self.started
        return self.t


@pytest.mark.parametrize("wide", ["flat", "proportional"])
def test_the_engine_drafts_where_its_measured_passes_say_it_pays(wide: str) -> None:
    """The draft length weighs the engine's own measured pass times (PassCost), not only the prior's
    memory-bound shape. A request whose sibling wrote its text (every draft accepted): where a pass
    over (K + 1)x the tokens costs what a plain pass does, it drafts to the end; where it costs (K + 1)x
    (a CPU, a full GPU), even perfect drafts only tie with plain decoding, so after the first draft's
    pass is measured nothing more is drafted. Either way the response is plain decoding's."""
    build = _tiny_engines("long")
    (r,) = _requests(PROMPTS[:1], group_size=1)
    plain, _ = _run(build("none"), [r])
    text = plain.ids[r.rid]
    timer = PassTimer((lambda n: 1.0) if wide == "flat" else (lambda n: float(n)))
    e = build("group")
    timer.engine, e.timer = e, timer
    again, _ = _run(e, [GenRequest(r.rid, r.prompt, BUDGET, r.seed, group=r.group, siblings=[list(text)])])
    _assert_same(again, plain)
    drafted, accepted = _drafted(e)
    assert accepted == drafted and e.pass_cost.seen  # the decode passes were measured
    if wide == "flat":
        assert drafted >= len(text) // 2
    else:
        assert 0 < drafted <= 4  # the first draft (the prior thought it free), then plain decoding
