"""TinyGPT (padding, positions, KV cache) and the torch engine (streaming, migration, abort)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlboost.contracts.engine import Engine, GenRequest
from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, TaskSpec
from rlboost.models.tiny_gpt import TinyGPT, TinyGPTConfig, left_pad
from rlboost.models.torch_engine import TorchEngine
from rlboost.models.vocab import EOS
from rlboost.trainer.learner import Learner
from tests.torch_threads import one_thread  # noqa: F401  (autouse: single-threaded torch)

SPEC = ModelSpec()


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    """Lightly warm-started weights: responses are task-like but far from solved."""
    learner = Learner(SPEC, AlgorithmSpec(), TaskSpec(), seed=0)
    learner.warm_start(40)
    return learner.state_dict()


@pytest.fixture(scope="module")
def random_weights() -> dict[str, torch.Tensor]:
    """Untrained weights: EOS is rare, so responses run long (good for prefix/continuation tests)."""
    return Learner(SPEC, AlgorithmSpec(), TaskSpec(), seed=1).state_dict()


def engine_with(w: dict[str, torch.Tensor], dtype: str = "float64", max_batch: int = 64) -> TorchEngine:
    e = TorchEngine(SPEC, dtype=dtype, max_batch=max_batch)
    e.load_weights(1, w)
    return e


class Recorder:
    """Collects streamed tokens per rid and checks they arrive in order, without gaps."""

    def __init__(self, requests: list[GenRequest]) -> None:
        self.ids = {r.rid: [] for r in requests}
        self.lps = {r.rid: [] for r in requests}
        self.start = {r.rid: r.position0 for r in requests}

    def __call__(self, rid: str, offset: int, ids: list[int], logprobs: list[float]) -> None:
        assert offset == self.start[rid] + len(self.ids[rid])
        assert len(ids) == len(logprobs)
        self.ids[rid].extend(ids)
        self.lps[rid].extend(logprobs)


def run(engine: Engine, requests: list[GenRequest], abort=lambda rid: False, temperature: float = 1.0):
    rec = Recorder(requests)
    reasons = engine.generate(requests, rec, abort, temperature)
    return rec, reasons


def req(rid: str, prompt: list[int], n: int, seed: int, prefix: list[int] | None = None) -> GenRequest:
    return GenRequest(rid=rid, prompt=prompt, max_new_tokens=n, seed=seed, prefix=prefix or [])


PROMPTS = [[1, 14, 15, 16, 3], [1, 20, 3], [1, 17, 22, 18, 19, 21, 23, 3], [1, 30, 31, 3]]


# ---- model -------------------------------------------------------------------------------------


def test_left_padding_and_kv_cache_match_plain_forward() -> None:
    torch.manual_seed(0)
    model = TinyGPT(TinyGPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=32)).double().eval()
    seqs = [[1, 5, 6, 7, 3, 9], [1, 8, 3], [1, 4, 4, 4, 4, 4, 4, 3, 10]]
    alone = []
    for s in seqs:
        idx, pos, mask = left_pad([s])
        alone.append(model(idx, pos, mask)[0][0])
    idx, pos, mask = left_pad(seqs)
    batched, _ = model(idx, pos, mask)
    for i, s in enumerate(seqs):
        torch.testing.assert_close(batched[i, -len(s) :], alone[i], rtol=0, atol=1e-12)
    # Prefill all but the last 2 tokens, then decode them one at a time through the cache.
    head = [s[:-2] for s in seqs]
    idx, pos, mask = left_pad(head)
    _, past = model(idx, pos, mask)
    for k in (2, 1):
        new = torch.tensor([[s[-k]] for s in seqs])
        new_pos = torch.tensor([[len(s) - k] for s in seqs])
        mask = torch.cat([mask, torch.ones(len(seqs), 1, dtype=torch.bool)], dim=1)
        logits, past = model(new, new_pos, mask, past)
        for i, s in enumerate(seqs):
            torch.testing.assert_close(logits[i, 0], alone[i][len(s) - k], rtol=0, atol=1e-10)


def test_positions_beyond_block_size_are_rejected() -> None:
    model = TinyGPT(TinyGPTConfig(block_size=8))
    idx, pos, mask = left_pad([[1] * 9])
    with pytest.raises(ValueError, match="block_size"):
        model(idx, pos, mask)


# ---- engine: streaming and finish reasons -------------------------------------------------------


def test_engine_satisfies_protocol_and_streams(weights) -> None:
    e = engine_with(weights, dtype="float32")
    assert isinstance(e, Engine)
    assert e.name == "torch" and e.version == 1
    requests = [req(f"r{i}", p, 12, seed=100 + i) for i, p in enumerate(PROMPTS * 4)]
    rec, reasons = run(e, requests)
    assert set(reasons) == {r.rid for r in requests}
    for r in requests:
        ids = rec.ids[r.rid]
        assert 1 <= len(ids) <= 12
        assert all(lp <= 0 for lp in rec.lps[r.rid])
        if reasons[r.rid] == "eos":
            assert ids[-1] == EOS and EOS not in ids[:-1]
        else:
            assert reasons[r.rid] == "length" and len(ids) == 12 and EOS not in ids
    assert "eos" in reasons.values()  # the warm-started model does stop


def test_engine_is_deterministic_and_seeded(weights) -> None:
    requests = [req(f"r{i}", p, 12, seed=7) for i, p in enumerate(PROMPTS)]
    a, _ = run(engine_with(weights), requests)
    b, _ = run(engine_with(weights), requests)
    assert a.ids == b.ids
    other = [req(r.rid, r.prompt, 12, seed=8) for r in requests]
    c, _ = run(engine_with(weights), other)
    assert a.ids != c.ids


# ---- engine: migration and batch invariance (float64) --------------------------------------------


def test_continuation_on_fresh_engine_matches_uninterrupted(random_weights) -> None:
    n, splits = 10, 0
    for i, prompt in enumerate(PROMPTS * 2):
        full, reasons = run(engine_with(random_weights), [req("a", prompt, n, seed=1000 + i)])
        tokens = full.ids["a"]
        for k in (1, 4, 9):
            if k >= len(tokens):
                continue  # stopped on EOS before the split point
            # First k tokens on one engine, the rest on a fresh one from prompt + prefix.
            head, _ = run(engine_with(random_weights), [req("a", prompt, k, seed=1000 + i)])
            assert head.ids["a"] == tokens[:k]
            tail_req = req("a", prompt, n - k, seed=1000 + i, prefix=head.ids["a"])
            tail, tail_reasons = run(engine_with(random_weights), [tail_req])
            assert head.ids["a"] + tail.ids["a"] == tokens
            np.testing.assert_allclose(head.lps["a"] + tail.lps["a"], full.lps["a"], rtol=0, atol=1e-9)
            assert tail_reasons == reasons
            splits += 1
    assert splits >= 12  # most responses of an untrained model run long


def test_batch_composition_does_not_change_results(random_weights, weights) -> None:
    for w in (random_weights, weights):
        requests = [
            req("short", PROMPTS[1], 9, seed=5),
            req("long", PROMPTS[2], 4, seed=6),
            req("pref", PROMPTS[0], 6, seed=7, prefix=[20, 21, 22]),
            req("mid", PROMPTS[3], 12, seed=8),
            req("dup-prompt", PROMPTS[1], 9, seed=9),
        ]
        alone = {}
        for r in requests:
            rec, reasons = run(engine_with(w), [r])
            alone[r.rid] = (rec.ids[r.rid], rec.lps[r.rid], reasons[r.rid])
        # Together in one batch, and split into successive batches of 2.
        for max_batch in (64, 2):
            rec, reasons = run(engine_with(w, max_batch=max_batch), requests)
            for r in requests:
                ids, lps, reason = alone[r.rid]
                assert rec.ids[r.rid] == ids and reasons[r.rid] == reason
                np.testing.assert_allclose(rec.lps[r.rid], lps, rtol=0, atol=1e-9)


# ---- engine vs learner, weights, abort ----------------------------------------------------------


def test_engine_logprobs_match_learner_float32() -> None:
    learner = Learner(SPEC, AlgorithmSpec(), TaskSpec(), seed=3)
    learner.warm_start(40)
    e = TorchEngine(SPEC, dtype="float32")
    e.load_weights(0, learner.state_dict())
    requests = [req(f"r{i}", p, 12, seed=50 + i) for i, p in enumerate(PROMPTS * 2)]
    rec, _ = run(e, requests)
    for r in requests:
        expected = learner.logprobs(r.prompt, rec.ids[r.rid])
        np.testing.assert_allclose(rec.lps[r.rid], expected, rtol=0, atol=1e-4)


def test_load_weights_changes_outputs_in_place(weights, random_weights) -> None:
    e = TorchEngine(SPEC, dtype="float32")
    module = e.model
    requests = [req(f"r{i}", p, 8, seed=11) for i, p in enumerate(PROMPTS)]
    e.load_weights(1, weights)
    a, _ = run(e, requests)
    e.load_weights(2, random_weights)
    b, _ = run(e, requests)
    e.load_weights(3, weights)
    c, _ = run(e, requests)
    assert e.model is module and e.version == 3
    assert a.ids == c.ids and a.lps == c.lps
    assert a.ids != b.ids


def test_load_weights_rejects_bad_sets_without_partial_load(weights) -> None:
    e = engine_with(weights)
    missing = dict(weights)
    missing.pop("lm_head.weight")
    with pytest.raises(ValueError, match="missing"):
        e.load_weights(2, missing)
    bad_shape = {**{k: torch.zeros_like(v) for k, v in weights.items()}, "wte.weight": torch.zeros(3, 3)}
    with pytest.raises(ValueError, match="shape"):
        e.load_weights(2, bad_shape)
    assert e.version == 1
    torch.testing.assert_close(e.model.wte.weight, weights["wte.weight"].double())


def test_abort_stops_only_that_sequence(random_weights) -> None:
    requests = [req(f"r{i}", p, 10, seed=70 + i) for i, p in enumerate(PROMPTS)]
    clean, clean_reasons = run(engine_with(random_weights), requests)
    rec = Recorder(requests)

    def abort(rid: str) -> bool:
        # r1 is aborted once it has 3 tokens; r3 before it starts.
        return (rid == "r1" and len(rec.ids["r1"]) >= 3) or rid == "r3"

    reasons = engine_with(random_weights).generate(requests, rec, abort)
    assert reasons["r1"] == "aborted" and rec.ids["r1"] == clean.ids["r1"][:3]
    assert reasons["r3"] == "aborted" and rec.ids["r3"] == []
    for rid in ("r0", "r2"):
        assert rec.ids[rid] == clean.ids[rid] and reasons[rid] == clean_reasons[rid]


def test_requests_that_do_not_fit_are_rejected(weights) -> None:
    e = engine_with(weights)
    too_long = req("x", [1] * 60, SPEC.block_size - 60 + 1, seed=0)
    with pytest.raises(ValueError, match="block_size"):
        e.generate([too_long], lambda *a: None, lambda rid: False)
    with pytest.raises(ValueError, match="unique"):
        e.generate([req("x", [1, 3], 2, 0), req("x", [1, 3], 2, 0)], lambda *a: None, lambda rid: False)
