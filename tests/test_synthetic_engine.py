"""The synthetic engine: Engine protocol, no torch, deterministic tokens at a modelled rate, and the whole
worker path (agent -> binary token frames -> coordinator) with it."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import numpy as np
import pytest

from rlboost.contracts import token_frames
from rlboost.contracts.lengths import LengthModel
from rlboost.contracts.perf import EngineModel
from rlboost.worker.engines import Engine, GenRequest, make_engine
from rlboost.worker.engines.synthetic import EOS, SyntheticEngine, token_at

MODEL = EngineModel(tokens_per_s=400, seq_tokens_per_s=50, prefill_tokens_per_s=10_000, ref_batch=8, max_batch=8)
LENGTHS = LengthModel(median=20, sigma=0.7, prompt_sigma=0.3)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += dt


def engine(clock: FakeClock | None = None) -> SyntheticEngine:
    c = clock or FakeClock()
    e = SyntheticEngine(MODEL, LENGTHS, clock=c, sleep=c.sleep)
    e.load_weights(0, {})
    return e


def run(e: SyntheticEngine, reqs, abort=lambda rid: False, **kw):
    got: dict[str, list[int]] = {}

    def on_tokens(rid, off, ids, lps):
        assert len(ids) == len(lps)
        cur = got.setdefault(rid, [])
        assert off == reqs_by[rid].position0 + len(cur)  # contiguous, from the end of the prefix
        cur.extend(ids)

    reqs_by = {r.rid: r for r in reqs}
    reasons = e.generate(reqs, on_tokens, abort, **kw)
    return got, reasons


def test_implements_the_engine_protocol_without_torch():
    assert isinstance(engine(), Engine)
    code = "import sys, rlboost.worker.engines.synthetic; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tokens_and_lengths_are_deterministic_and_end_with_eos_or_budget():
    reqs = [GenRequest(f"r{i}", [1, 5, 6, i % 3], 200, seed=100 + i) for i in range(6)]
    got1, reasons = run(engine(), reqs)
    got2, _ = run(engine(), reqs)
    assert got1 == got2
    for r in reqs:
        n = LENGTHS.length(r.prompt, r.seed)
        toks = got1[r.rid]
        if n <= 200:
            assert reasons[r.rid] == "eos" and len(toks) == n and toks[-1] == EOS
        else:
            assert reasons[r.rid] == "length" and len(toks) == 200
        assert all(t == token_at(r.seed, p) for p, t in enumerate(toks[:-1]))
    short = GenRequest("s", [1, 2], 3, seed=7)
    got, _ = run(engine(), [short])
    assert len(got["s"]) == min(3, LENGTHS.length([1, 2], 7))


def test_a_migrated_response_continues_exactly():
    req = GenRequest("m", [1, 9, 9], 500, seed=3)
    whole, _ = run(engine(), [req])
    cut = len(whole["m"]) // 2
    seen = {"n": 0}

    def abort_after_cut(rid):
        return seen["n"] >= cut

    c = FakeClock()
    e1 = engine(c)
    part: list[int] = []

    def on_tokens(rid, off, ids, lps):
        part.extend(ids)
        seen["n"] = len(part)

    e1.generate([req], on_tokens, abort_after_cut)
    rest, _ = run(engine(), [GenRequest("m", req.prompt, 500 - len(part), seed=3, prefix=part)])
    assert part + rest["m"] == whole["m"]


def test_emits_at_the_modelled_rate_and_charges_prefill():
    c = FakeClock()
    e = engine(c)
    req = GenRequest("solo", [1] * 100, 30, seed=1)
    n = min(30, LENGTHS.length(req.prompt, req.seed))
    e.generate([req], lambda *a: None, lambda rid: False)
    expect = 100 / MODEL.prefill_tokens_per_s + n / MODEL.seq_tokens_per_s
    assert c.t == pytest.approx(expect, abs=2 * e.tick_s)
    c2 = FakeClock()
    e2 = engine(c2)
    full = [GenRequest(f"b{i}", [1], 40, seed=10 + i) for i in range(8)]
    out, _ = run(e2, full)
    total = sum(len(v) for v in out.values())
    # a full batch runs near tokens_per_s (fewer sequences toward the end run a bit faster each)
    assert total / c2.t > 0.5 * MODEL.tokens_per_s


def test_continuous_batching_admits_mid_batch_and_reports_each_end():
    c = FakeClock()
    e = engine(c)
    later = [GenRequest(f"late{i}", [2, 3], 10, seed=50 + i) for i in range(3)]
    ended: list[tuple[str, str]] = []

    def admit(n):
        out, later[:] = later[:n], later[n:]
        return out

    reasons = e.generate(
        [GenRequest("first", [2, 3], 10, seed=1)],
        lambda *a: None,
        lambda r: False,
        admit=admit,
        on_finish=lambda r, w: ended.append((r, w)),
    )
    assert {r for r, _ in ended} == {"first", "late0", "late1", "late2"} == set(reasons)
    with pytest.raises(ValueError):
        e.generate([GenRequest("x", [1], 5, seed=1), GenRequest("x", [1], 5, seed=1)], lambda *a: None, lambda r: False)


def test_make_engine_builds_the_node_model_from_the_welcome(monkeypatch):
    monkeypatch.setenv("RLBOOST_ACCELERATOR", "A100:2")
    model = {
        "kind": "synthetic",
        "synthetic": {"perf": {}, "lengths": {"median": 10, "sigma": 0.5, "prompt_sigma": 0.1}, "prompt_tokens": 500},
    }
    e = make_engine("synthetic", model, "float32", 16)
    assert e.max_batch == 32 and e.model.replicas == 2 and e.prompt_tokens == 500


def test_token_frames_round_trip_and_reject_malformed():
    data = token_frames.encode(3, [1, 2], [0, 5], [2, 1], [7, 8, 9], [-0.5, -0.25, -1.0])
    cols = token_frames.decode(data)
    assert cols.version == 3 and cols.handles.tolist() == [1, 2] and cols.ids.tolist() == [7, 8, 9]
    assert cols.lps.tolist() == [-0.5, -0.25, -1.0]
    for bad in (data[:-1], b"XXXX" + data[4:], data[:16], b""):
        with pytest.raises(token_frames.FrameError):
            token_frames.decode(bad)
    big_id = token_frames.encode(0, [1], [0], [1], [0], [0.0])
    arr = bytearray(big_id)
    arr[16 + 12 : 16 + 16] = (1 << 31).to_bytes(4, "little")
    with pytest.raises(token_frames.FrameError):
        token_frames.decode(bytes(arr))
    with pytest.raises(token_frames.FrameError):
        token_frames.encode(0, [1], [0], [2], [1], [0.0])


@pytest.mark.integration
@pytest.mark.parametrize("siblings", [False, True])
def test_workers_with_synthetic_engines_complete_a_step_through_binary_frames(tmp_path, siblings):
    """Coordinator + weight publisher on loopback, two real WorkerAgents with synthetic engines (with
    sibling scheduling too: the queue outgrows the 16 slots, so its whole-queue dispatch runs live)."""
    pytest.importorskip("torch")
    from rlboost.rollout.live import CoordinatorConfig, RolloutRequest
    from testkit.live_rollout import live_rollout

    async def main():
        cfg = CoordinatorConfig(
            job_seed=1,
            temperature=1.0,
            chunk_tokens=4,
            heartbeat_s=0.5,
            heartbeat_timeout_s=10,
            weights_url="",
            model={
                "kind": "synthetic",
                "synthetic": {"perf": {}, "lengths": {"median": 12, "sigma": 0.6, "prompt_sigma": 0.2}},
            },
            engine_dtype="float32",
            engine_batch=8,
            eos_id=EOS,
            max_new_tokens=64,
            sibling_scheduling=siblings,
        )
        async with live_rollout(cfg) as (coord, _):
            reqs = [
                RolloutRequest(f"s0-p{i}-g{g}", [1, 4 + i, 5, 3], 64, group=f"p{i}") for i in range(6) for g in range(4)
            ]
            done = await asyncio.wait_for(coord.run_step(0, 0, reqs), timeout=60)
        return coord, done

    coord, done = asyncio.run(main())
    assert len(done) == 24 and len({r.rid for r in done}) == 24
    lm = LengthModel(median=12, sigma=0.6, prompt_sigma=0.2)
    from rlboost.contracts.sampling import request_seed

    for r in done:
        n = lm.length(r.prompt, request_seed(1, r.rid))
        assert len(r.tokens) == min(n, 64) and r.finish == ("eos" if n <= 64 else "length")
        assert r.tokens[:-1] == [token_at(request_seed(1, r.rid), p) for p in range(len(r.tokens) - 1)]
    assert coord.frames_total > 0 and coord.rejected_frames == 0
    assert np.isclose(sum(len(r.tokens) for r in done), coord.tokens_total)
