"""The one engine test suite: every engine (torch on tiny-gpt, torch on a Hugging Face model, vLLM)
satisfies the same protocol — streaming in order, finish reasons, seeded sampling, abort that keeps
the partial tokens, continuation on another engine instance from prompt + partial tokens with the
remaining budget, and in-place weight loading. The vLLM engine runs under `pytest -m vllm`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from rlboost.contracts.engine import Engine, GenRequest
from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, TaskSpec
from tests.torch_threads import one_thread  # noqa: F401  (autouse: single-threaded torch)

BUDGET = 16


@dataclass
class Kit:
    """One engine kind: how to build it, two weight sets, prompts, and how exact it is."""

    name: str
    build: Callable[[], Engine]
    weights: dict[str, dict]  # "stops": emits eos within BUDGET, "long": rarely stops
    prompts: list[list[int]]
    eos: int
    atol: float  # log-prob tolerance across engines / batch shapes
    decode: Callable[[list[int]], str]  # the task's response text (Task.decode_response): stop strings
    engines: list[Engine] = field(default_factory=list)

    def engine(self, i: int, weights: str, version: int = 1) -> Engine:
        """The i-th instance of this kind (built once), loaded with a weight set."""
        while len(self.engines) <= i:
            self.engines.append(self.build())
        e = self.engines[i]
        e.load_weights(version, self.weights[weights])
        return e


def _tiny_gpt_kit() -> Kit:
    from rlboost.models.torch_engine import TorchEngine
    from rlboost.trainer.learner import Learner
    from rlboost.trainer.tasks import make_task

    spec = ModelSpec()
    stops = Learner(spec, AlgorithmSpec(), TaskSpec(), seed=0)
    stops.warm_start(40)
    long = Learner(spec, AlgorithmSpec(), TaskSpec(), seed=1)
    prompts = [[1, 14, 15, 16, 3], [1, 20, 3], [1, 17, 22, 18, 19, 21, 23, 3], [1, 30, 31, 3]]
    return Kit(
        "torch",
        lambda: TorchEngine(spec, dtype="float64"),
        {"stops": stops.state_dict(), "long": long.state_dict()},
        prompts,
        eos=2,
        atol=1e-9,
        decode=make_task(TaskSpec()).decode_response,
    )


@pytest.fixture(scope="module")
def hf_assets(tmp_path_factory) -> tuple[ModelSpec, dict[str, dict], list[list[int]], int, Callable]:
    """A tiny random Qwen2 + tokenizer, a math dataset, and two weight sets for it."""
    pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from rlboost.trainer.tasks import make_task
    from testkit.hf_fixtures import make_tiny_model, warm_started_weights, write_math_jsonl

    tmp = tmp_path_factory.mktemp("hf")
    model_dir = make_tiny_model(tmp / "model")
    data = write_math_jsonl(tmp / "math.jsonl")
    spec = ModelSpec(kind="hf", path=str(model_dir), dtype="float32")
    task = make_task(TaskSpec(name="jsonl", path=data, reward="math_boxed"), spec)
    prompts = [p.prompt_ids for p in task.sample(np.random.default_rng(0), 4)]
    weights = {
        "stops": warm_started_weights(model_dir, data, steps=6),
        "long": load_file(model_dir / "model.safetensors"),
    }
    return spec, weights, prompts, task.eos_id, task.decode_response


KINDS = ["torch", "torch-hf", pytest.param("vllm", marks=pytest.mark.vllm)]


@pytest.fixture(scope="module", params=KINDS)
def kit(request) -> Iterator[Kit]:
    if request.param == "torch":
        yield _tiny_gpt_kit()
        return
    spec, weights, prompts, eos, decode = request.getfixturevalue("hf_assets")
    if request.param == "torch-hf":
        from rlboost.models.torch_engine import TorchEngine

        yield Kit("torch", lambda: TorchEngine(spec, dtype="float32"), weights, prompts, eos, atol=1e-4, decode=decode)
        return
    pytest.importorskip("vllm")
    from rlboost.worker.engines.vllm_engine import VllmEngine

    yield Kit(
        "vllm", lambda: VllmEngine(spec, dtype="float32", max_batch=32), weights, prompts, eos, 1e-4, decode
    )


class Recorder:
    """Collects streamed tokens per rid and checks they arrive in order, without gaps."""

    def __init__(self, requests: list[GenRequest]) -> None:
        self.ids: dict[str, list[int]] = {r.rid: [] for r in requests}
        self.lps: dict[str, list[float]] = {r.rid: [] for r in requests}
        self.start = {r.rid: r.position0 for r in requests}

    def __call__(self, rid: str, offset: int, ids: list[int], logprobs: list[float]) -> None:
        assert offset == self.start[rid] + len(self.ids[rid]), "tokens out of order or with a gap"
        assert len(ids) == len(logprobs) and ids
        self.ids[rid].extend(ids)
        self.lps[rid].extend(logprobs)


def run(
    engine: Engine, requests: list[GenRequest], abort=lambda rid: False, **truncation: float
) -> tuple[Recorder, dict[str, str]]:
    """generate at temperature 1 (truncation: top_k / top_p keywords, if any)."""
    rec = Recorder(requests)
    return rec, engine.generate(requests, rec, abort, 1.0, **truncation)


def req(rid: str, prompt: list[int], n: int, seed: int, prefix: list[int] | None = None) -> GenRequest:
    return GenRequest(rid=rid, prompt=prompt, max_new_tokens=n, seed=seed, prefix=prefix or [])


def test_streams_tokens_with_consistent_finish_reasons(kit: Kit) -> None:
    e = kit.engine(0, "stops")
    assert isinstance(e, Engine) and e.name == kit.name and e.version == 1
    requests = [req(f"r{i}", p, BUDGET, seed=100 + i) for i, p in enumerate(kit.prompts * 4)]
    rec, reasons = run(e, requests)
    assert set(reasons) == {r.rid for r in requests}
    for r in requests:
        ids = rec.ids[r.rid]
        assert 1 <= len(ids) <= BUDGET and all(lp <= 1e-6 for lp in rec.lps[r.rid])
        if reasons[r.rid] == "eos":
            assert ids[-1] == kit.eos and kit.eos not in ids[:-1]
        else:
            assert reasons[r.rid] == "length" and len(ids) == BUDGET and kit.eos not in ids
    assert "eos" in reasons.values()


def test_sampling_is_seeded(kit: Kit) -> None:
    e = kit.engine(0, "long")
    requests = [req(f"r{i}", p, BUDGET, seed=7) for i, p in enumerate(kit.prompts)]
    a, _ = run(e, requests)
    b, _ = run(e, requests)
    assert a.ids == b.ids
    c, _ = run(e, [req(r.rid, r.prompt, BUDGET, seed=8) for r in requests])
    assert a.ids != c.ids


def test_abort_keeps_partial_tokens_and_continues_on_another_instance(kit: Kit) -> None:
    """r1 is aborted after 3 tokens, r3 before it starts; the others are untouched. r1 then continues
    on a second instance from prompt + its 3 tokens with the remaining budget, and ends exactly as
    the uninterrupted run did."""
    requests = [req(f"r{i}", p, BUDGET, seed=70 + i) for i, p in enumerate(kit.prompts)]
    clean, clean_reasons = run(kit.engine(0, "long"), requests)
    rec = Recorder(requests)

    def abort(rid: str) -> bool:
        return (rid == "r1" and len(rec.ids["r1"]) >= 3) or rid == "r3"

    reasons = kit.engine(0, "long").generate(requests, rec, abort, 1.0)
    assert reasons["r1"] == "aborted" and rec.ids["r1"] == clean.ids["r1"][:3]
    assert reasons["r3"] == "aborted" and rec.ids["r3"] == []
    for rid in ("r0", "r2"):
        assert rec.ids[rid] == clean.ids[rid] and reasons[rid] == clean_reasons[rid]
    partial = rec.ids["r1"]
    tail_req = req("r1", kit.prompts[1], BUDGET - len(partial), seed=71, prefix=partial)
    tail, tail_reasons = run(kit.engine(1, "long"), [tail_req])
    assert partial + tail.ids["r1"] == clean.ids["r1"]
    assert tail_reasons["r1"] == clean_reasons["r1"]
    np.testing.assert_allclose(rec.lps["r1"] + tail.lps["r1"], clean.lps["r1"], rtol=0, atol=kit.atol)


def test_continuation_at_several_split_points(kit: Kit) -> None:
    full, reasons = run(kit.engine(0, "long"), [req("a", kit.prompts[0], BUDGET, seed=1000)])
    tokens = full.ids["a"]
    for k in (1, 5, BUDGET - 2):
        if k >= len(tokens):
            continue
        tail, tail_reasons = run(kit.engine(1, "long"), [req("a", kit.prompts[0], BUDGET - k, 1000, tokens[:k])])
        assert tokens[:k] + tail.ids["a"] == tokens and tail_reasons == reasons


@pytest.mark.parametrize("truncation", [{"top_p": 0.8}, {"top_k": 5, "top_p": 0.9}])
def test_continuation_with_top_k_top_p_equals_the_uninterrupted_response(kit: Kit, truncation: dict) -> None:
    """algorithm.top_k / top_p are part of the seeded rule: a response continued on another instance
    from a prefix draws what the uninterrupted run drew, and the truncation does change the draws."""
    requests = [req(f"r{i}", p, BUDGET, seed=300 + i) for i, p in enumerate(kit.prompts)]
    full, reasons = run(kit.engine(0, "long"), requests, **truncation)
    plain, _ = run(kit.engine(0, "long"), requests)
    assert full.ids != plain.ids
    for r in requests:
        tokens = full.ids[r.rid]
        for k in (2, 7):
            if k >= len(tokens):
                continue
            cont = req(r.rid, r.prompt, BUDGET - k, r.seed, tokens[:k])
            tail, tail_reasons = run(kit.engine(1, "long"), [cont], **truncation)
            assert tokens[:k] + tail.ids[r.rid] == tokens and tail_reasons[r.rid] == reasons[r.rid]
            np.testing.assert_allclose(tail.lps[r.rid], full.lps[r.rid][k:], rtol=0, atol=kit.atol)


def _stop_in(decode: Callable[[list[int]], str], tokens: list[int]) -> tuple[str, int] | None:
    """A stop string the response's text holds, ending after its second token at the earliest, and where
    the rule ends the response at (it keeps that token)."""
    from rlboost.contracts.stop import StopStrings

    for m in range(2, len(tokens)):
        text = decode(tokens[:m]).strip()
        if len(text) >= 2:
            stop = text[-2:]
            end = StopStrings([stop], decode).end(tokens)
            if end is not None and end >= 2:
                return stop, end
    return None


def _ends_at_the_stop(kit: Kit, r: GenRequest, stop: str, want: list[int]) -> None:
    """r with `stop` ends with `want` in process and migrated one token before the stop completes."""
    from rlboost.contracts.stop import StopCollector, StopStrings
    from rlboost.rollout.book import Response, RolloutBook

    rule = StopStrings([stop], kit.decode)
    got = StopCollector([r.rid], rule)
    kit.engine(0, "long").generate([r], got.on_tokens, got.should_abort, 1.0)
    assert got.tokens[r.rid] == want
    # migrated: engine e0 makes len(want) - 1 tokens, e1 continues from them through the book
    cut = len(want) - 1
    book = RolloutBook(kit.eos, stop=rule)
    resp = Response(r.rid, 0, 1, r.prompt, BUDGET, r.seed)
    book.add([resp])
    book.take("e0", 1, 1)
    first = Recorder([r])
    kit.engine(0, "long").generate([r], first, lambda rid: len(first.ids[rid]) >= cut, 1.0)
    book.accept("e0", r.rid, 0, first.ids[r.rid][:cut], first.lps[r.rid][:cut], 1)
    assert not resp.done
    book.release("e0")
    book.take("e1", 1, 1)
    cont = req(r.rid, r.prompt, BUDGET - cut, r.seed, resp.tokens)

    def into_book(rid: str, offset: int, ids: list[int], lps: list[float]) -> None:
        book.accept("e1", rid, offset, ids, lps, 1)

    kit.engine(1, "long").generate([cont], into_book, lambda rid: resp.done, 1.0)
    assert resp.tokens == want and resp.migrated
    assert resp.finish == ("eos" if want[-1] == kit.eos else "stop")
    assert book.take_stopped() == [("e1", r.rid)] and book.drain_completed() == [resp]


def test_stop_strings_end_responses_at_the_same_token_in_process_and_migrated(kit: Kit) -> None:
    """algorithm.stop: every engine's response ends at the rule's token (contracts/stop.py) — in process
    (the collector aborts the engine as soon as a stop string shows), and through the rollout book
    when the response migrates one token before the stop string completes (a stop string of several
    tokens then straddles two engines' parts)."""
    requests = [req(f"r{i}", p, BUDGET, seed=500 + i) for i, p in enumerate(kit.prompts)]
    full, _ = run(kit.engine(0, "long"), requests)
    checked = 0
    for r in requests:
        found = _stop_in(kit.decode, full.ids[r.rid])
        if found is not None:
            stop, end = found
            _ends_at_the_stop(kit, r, stop, full.ids[r.rid][:end])
            checked += 1
    assert checked >= 2, "too few responses with a stop string to test"


def test_batch_neighbours_do_not_change_a_response(kit: Kit) -> None:
    e = kit.engine(0, "long")
    requests = [req(f"r{i}", p, 10, seed=5 + i) for i, p in enumerate(kit.prompts)]
    alone = {r.rid: run(e, [r])[0].ids[r.rid] for r in requests}
    together, _ = run(e, requests)
    assert together.ids == alone


def test_load_weights_in_place_changes_outputs(kit: Kit) -> None:
    requests = [req(f"r{i}", p, 8, seed=11) for i, p in enumerate(kit.prompts)]
    e = kit.engine(0, "stops", version=1)
    a, _ = run(e, requests)
    assert kit.engine(0, "long", version=2) is e and e.version == 2
    b, _ = run(e, requests)
    kit.engine(0, "stops", version=3)
    c, _ = run(e, requests)
    assert e.version == 3
    assert a.ids == c.ids and a.ids != b.ids
    for rid in a.lps:
        np.testing.assert_allclose(a.lps[rid], c.lps[rid], rtol=0, atol=1e-6)


def test_bad_requests_are_rejected(kit: Kit) -> None:
    e = kit.engine(0, "long")
    with pytest.raises(ValueError, match="unique"):
        e.generate([req("x", [1, 3], 2, 0), req("x", [1, 3], 2, 0)], lambda *a: None, lambda rid: False)
    with pytest.raises(ValueError, match="exceeds"):
        e.generate([req("x", [1] * 8, 1_000_000, 0)], lambda *a: None, lambda rid: False)


def test_fixture_model_is_tiny(tmp_path: Path) -> None:
    """The helper itself: a tiny model whose head_dim suits vLLM's CPU backend."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    from testkit.hf_fixtures import make_tiny_model

    cfg = AutoConfig.from_pretrained(make_tiny_model(tmp_path / "m"))
    assert cfg.hidden_size // cfg.num_attention_heads >= 64 and cfg.num_hidden_layers == 2
