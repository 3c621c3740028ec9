"""algorithm.stop (contracts/stop.py): the spec's validation, the rule on decoded text, the rollout book
ending a response at a stop string whichever engines made its tokens, and a live step with workers.
Each engine's agreement (torch on tiny-gpt and on a Hugging Face model, vLLM in CI's vllm tier) is in
tests/test_engine_contract.py (test_stop_strings_end_responses_at_the_same_token_in_process_and_migrated)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from pydantic import ValidationError

from rlboost.contracts.spec import AlgorithmSpec
from rlboost.contracts.stop import MAX_STOP_CHARS, MAX_STOP_STRINGS, StopCollector, StopStrings
from rlboost.models.vocab import EOS, decode, encode
from rlboost.rollout.book import Response, RolloutBook


def text_of(ids: list[int]) -> str:
    """tiny-gpt's response text (the tiny tasks' decode_response: a final EOS is not text)."""
    return decode(ids[:-1] if ids and ids[-1] == EOS else ids)


@pytest.mark.parametrize(
    ("value", "fix"),
    [
        ([""], "non-empty"),
        (["x" * (MAX_STOP_CHARS + 1)], f"at most {MAX_STOP_CHARS} characters"),
        (["a"] * (MAX_STOP_STRINGS + 1), f"at most {MAX_STOP_STRINGS} stop strings"),
        ([3], "non-empty strings"),
        ({"a": 1}, "a list of strings"),
    ],
)
def test_spec_rejects_bad_stop_lists_naming_the_field(value: object, fix: str) -> None:
    with pytest.raises(ValidationError) as e:
        AlgorithmSpec(stop=value)
    assert "algorithm.stop" in str(e.value) and fix in str(e.value)


def test_spec_takes_a_list_or_one_string_and_defaults_to_none() -> None:
    assert AlgorithmSpec().stop == []
    assert AlgorithmSpec(stop=["</answer>", "\n\n"]).stop == ["</answer>", "\n\n"]
    assert AlgorithmSpec(stop="</answer>").stop == ["</answer>"]


def test_the_rule_ends_at_the_token_completing_the_first_stop_string() -> None:
    rule = StopStrings(["cd", "x"], text_of)
    ids = encode("abcdexcd")
    assert rule.end(ids) == 4  # "abcd": the token that completes "cd" is kept
    assert rule.cut(ids) == encode("abcd")
    assert rule.end(encode("abx")) == 3 and rule.end(encode("abab")) is None
    assert rule.end(encode("ababxy"), checked=4) == 5  # only what follows the checked tokens is new
    assert rule.cut([*encode("ab"), EOS]) == [*encode("ab"), EOS]
    with pytest.raises(ValueError, match=r"algorithm\.stop"):
        StopStrings([""], text_of)


def _book(stops: list[str]) -> tuple[RolloutBook, Response]:
    book = RolloutBook(EOS, page=4, stop=StopStrings(stops, text_of))
    r = Response("s0-p0-g0", 0, 1, [1, 5, 3], 20, seed=7)
    book.add([r])
    return book, r


def test_book_ends_a_response_mid_chunk_and_drops_what_follows() -> None:
    book, r = _book(["cd"])
    book.take("e0", 1, 1)
    ids = encode("abcdef")
    book.accept_columns(
        "e0", 1, np.array([r.handle]), np.array([0]), np.array([len(ids)]), np.array(ids), np.zeros(len(ids))
    )
    assert r.tokens == encode("abcd") and r.finish == "stop" and r.engine is None
    assert book.take_stopped() == [("e0", r.rid)] and book.take_stopped() == []
    assert book.drain_completed() == [r] and book.outstanding(0) == 0
    # late tokens and the engine's own end for it change nothing
    assert book.accept("e0", r.rid, 6, encode("g"), [0.0], 1) == 0
    assert not book.finish("e0", r.rid, "aborted", 6)
    assert r.tokens == encode("abcd") and [x.rid for x in book.collect(0)] == [r.rid]


def test_book_finds_a_stop_string_split_between_two_engines() -> None:
    """A response migrated between "c" and "d" ends at "d", as if it had never moved."""
    book, r = _book(["cd"])
    book.take("e0", 1, 1)
    book.accept("e0", r.rid, 0, encode("abc"), [0.0] * 3, 1)
    assert not r.done
    assert book.release("e0") == [r.rid]
    book.take("e1", 1, 1)
    book.accept("e1", r.rid, 3, encode("dxy"), [0.0] * 3, 1)
    assert r.tokens == encode("abcd") and r.finish == "stop" and r.migrated
    assert book.take_stopped() == [("e1", r.rid)]


def test_a_stop_string_at_eos_is_an_eos_end_and_no_stop_leaves_eos_and_length() -> None:
    book, r = _book(["zz"])
    book.take("e0", 1, 1)
    book.accept("e0", r.rid, 0, [*encode("ab"), EOS], [0.0] * 3, 1)
    assert not r.done and book.finish("e0", r.rid, "eos", 3) and r.finish == "eos"
    assert book.take_stopped() == []


def test_collector_aborts_at_the_stop_and_keeps_later_tokens_out() -> None:
    got = StopCollector(["a", "b"], StopStrings(["cd"], text_of))
    got.on_tokens("a", 0, encode("abc"), [0.0] * 3)
    got.on_tokens("a", 3, encode("de"), [0.0] * 2)
    got.on_tokens("a", 5, encode("f"), [0.0])  # the engine had not seen the abort yet
    got.on_tokens("b", 0, encode("xy"), [0.0] * 2)
    assert got.tokens == {"a": encode("abcd"), "b": encode("xy")}
    assert got.should_abort("a") and not got.should_abort("b")


def _live_step(lengths: dict, rule: StopStrings, kill_busy: bool):
    """Coordinator + two WorkerAgents with synthetic engines run one step of 16 responses (kill_busy:
    the first worker is killed once it holds 4 partial responses); (coordinator, responses)."""
    pytest.importorskip("torch")
    from rlboost.rollout.live import CoordinatorConfig, RolloutRequest
    from testkit.live_rollout import live_rollout

    async def main():
        cfg = CoordinatorConfig(
            job_seed=1, temperature=1.0, chunk_tokens=4, heartbeat_s=0.5, heartbeat_timeout_s=10,
            weights_url="", model={"kind": "synthetic", "synthetic": {"perf": {}, "lengths": lengths}},
            engine_dtype="float32", engine_batch=8, eos_id=EOS, max_new_tokens=BUDGET, stop=rule,
        )
        async with live_rollout(cfg) as (coord, runs):
            reqs = [
                RolloutRequest(f"s0-p{i}-g{g}", [1, 4 + i, 5, 3], BUDGET, group=f"p{i}")
                for i in range(4)
                for g in range(4)
            ]
            step = asyncio.create_task(coord.run_step(0, 0, reqs))
            if kill_busy:  # wait on state: the first worker holds partial responses, then it dies
                while not any(w["worker_id"] == "w0" and w["partial"] >= 4 for w in coord.workers_snapshot()):
                    assert not step.done(), "the step ended before the worker could be killed"
                    await asyncio.sleep(0.001)
                runs[0].cancel()
            done = await asyncio.wait_for(step, timeout=60)
        return coord, done

    return asyncio.run(main())


BUDGET = 64


def _synthetic_response(lengths: dict, r: Response) -> list[int]:
    """The synthetic engine's whole response to r (no stop strings): what every engine generates."""
    from rlboost.contracts.lengths import LengthModel
    from rlboost.contracts.sampling import request_seed
    from rlboost.worker.engines.synthetic import token_at

    seed = request_seed(1, r.rid)
    full_len = LengthModel(**lengths).length(r.prompt, seed)
    full = [token_at(seed, p) for p in range(min(full_len, BUDGET))]
    if full_len <= BUDGET:
        full[-1] = EOS
    return full


@pytest.mark.integration
def test_a_live_step_ends_responses_at_stop_strings() -> None:
    """Each response is the synthetic engine's response ended by the rule, and the engines are told to
    abort those a stop string ended (the step completes with every frame accepted)."""
    lengths = {"median": 24, "sigma": 0.3, "prompt_sigma": 0.2}
    rule = StopStrings(["7", "k"], text_of)
    coord, done = _live_step(lengths, rule, kill_busy=False)
    assert len(done) == 16 and coord.rejected_frames == 0
    stopped = 0
    for r in done:
        full = _synthetic_response(lengths, r)
        assert r.tokens == rule.cut(full)
        if r.finish == "stop":
            stopped += 1
            assert len(r.tokens) < len(full) and text_of(r.tokens)[-1] in "7k"
    assert stopped >= 3


@pytest.mark.integration
def test_responses_of_a_killed_worker_stop_where_they_would_have() -> None:
    """A worker dies mid-step: its partial responses continue on the other one and still end at the
    rule's token, as the responses that never moved do."""
    lengths = {"median": 48, "sigma": 0.2, "prompt_sigma": 0.1}
    rule = StopStrings(["k"], text_of)
    coord, done = _live_step(lengths, rule, kill_busy=True)
    assert len(done) == 16
    for r in done:
        assert r.tokens == rule.cut(_synthetic_response(lengths, r))
    moved = [r for r in done if r.migrated]
    assert moved and coord.book.migrations >= 1
    assert any(r.finish == "stop" for r in moved), "no migrated response reached a stop string"


def _rule_on_whole_prefixes(rule: StopStrings, tokens: list[int]) -> int | None:
    """The rule as written: the first n whose whole text tokens[:n] holds a stop string."""
    return next((n for n in range(1, len(tokens) + 1) if any(s in rule.decode(tokens[:n]) for s in rule.stops)), None)


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_incremental_windows_find_the_whole_text_rule_on_a_byte_level_tokenizer(chunk: int) -> None:
    """Random responses of a byte-level BPE tokenizer (multi-byte characters split over tokens): checked
    chunk by chunk, as the book does (a window of `lookback` tokens before the new ones), a response ends
    where the rule on whole prefixes ends it, whatever the chunks."""
    pytest.importorskip("transformers")
    from testkit.hf_fixtures import make_tokenizer

    tok = make_tokenizer()
    rng = np.random.default_rng(chunk)
    words = ["</answer>", "é", "Привет", "日本語", " the", "\n\n", "ab", "🙂"]
    found = 0
    for trial in range(40):
        text = "".join(rng.choice(words, size=30))
        ids = tok.encode(text, add_special_tokens=False)
        stop = ["</answer>", "\n\n", "日本", "é P", "🙂🙂"][trial % 5]
        rule = StopStrings([stop], lambda x: tok.decode(x, skip_special_tokens=True))
        want = _rule_on_whole_prefixes(rule, ids)
        got, checked = None, 0
        while got is None and checked < len(ids):
            nxt = min(len(ids), checked + chunk)
            got = rule.end(ids[:nxt], checked)
            checked = nxt
        assert got == want, (text, stop)
        found += want is not None
    assert found >= 10


def test_the_simulators_calibration_measures_lengths_ended_at_stop_strings(monkeypatch) -> None:
    """`rlboost simulate`'s local calibration generates the first step's responses as the job does: with
    algorithm.stop each is the same response ended at the rule's token, never longer."""
    pytest.importorskip("torch")
    import rlboost.simulator.local_calibration as lc
    from rlboost.contracts.spec import JobSpec
    from rlboost.trainer.learner import Learner
    from rlboost.trainer.tasks import make_task

    monkeypatch.setattr(lc, "LENGTH_SAMPLES", 64)
    got = {}
    for stop in ([], ["a"]):
        spec = JobSpec.model_validate({
            "name": "stops", "rollout": {"max_workers": 0}, "task": {"name": "reverse"},
            "algorithm": {"prompts_per_step": 8, "group_size": 8, "max_new_tokens": 12, "warm_start_steps": 20,
                          "stop": stop},
        })
        learner = Learner(spec.model, spec.algorithm, spec.task, seed=0)
        got[bool(stop)] = lc.first_step_lengths(spec, make_task(spec.task, spec.model), learner)
    assert all(s <= n for s, n in zip(got[True], got[False], strict=True))
    assert sum(got[True]) < sum(got[False])
