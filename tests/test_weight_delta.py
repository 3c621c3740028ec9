"""Delta transfer: v-1 -> v as XOR + shuffle + zstd, rebuilt bit for bit, with a full-pull fallback."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import numpy as np
import pytest
import torch
from aiohttp import web

from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, TaskSpec
from rlboost.models.vocab import EOS
from rlboost.trainer.grpo import Sample
from rlboost.trainer.learner import Learner
from rlboost.weights import delta_codec
from rlboost.weights.peer_server import WeightNode
from rlboost.weights.publisher import PublishOptions, WeightPublisher, add_routes
from rlboost.weights.pull import PullOptions


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].view(torch.uint8).numpy().tobytes() == b[k].contiguous().view(torch.uint8).numpy().tobytes(), k


@contextlib.asynccontextmanager
async def serve(pub: WeightPublisher, *middlewares) -> AsyncIterator[str]:
    app = web.Application(middlewares=list(middlewares))
    add_routes(app, pub)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield "http://{}:{}".format(*runner.addresses[0][:2])
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("dtype,width", [(np.float32, 4), (np.uint16, 2), (np.float64, 8), (np.uint8, 1)])
def test_codec_round_trip_is_exact(dtype, width) -> None:
    rng = np.random.default_rng(0)
    old = (
        rng.standard_normal(4096).astype(np.float64).astype(dtype)
        if dtype != np.uint16
        else rng.integers(0, 1 << 16, 4096, dtype=np.uint16)
    )
    new = old.copy()
    new[::7] = new[::7] + 1 if dtype in (np.uint8, np.uint16) else new[::7] * 1.001
    payload = delta_codec.encode(memoryview(old.tobytes()), memoryview(new.tobytes()), width)
    assert payload is not None and len(payload) < new.nbytes
    out = bytearray(new.nbytes)
    delta_codec.decode_into(memoryview(old.tobytes()), payload, memoryview(out), width)
    assert bytes(out) == new.tobytes()
    assert delta_codec.encode(memoryview(old.tobytes()), memoryview(old.tobytes()), width) is None
    with pytest.raises(ValueError):
        delta_codec.decode_into(memoryview(old.tobytes()), b"not zstd", memoryview(out), width)


def learner_after_steps() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The local model's weights before and after one real GRPO update."""
    torch.set_num_threads(1)
    learner = Learner(ModelSpec(), AlgorithmSpec(), TaskSpec(), seed=0)
    learner.warm_start(2)
    before = learner.state_dict()
    prompt = [1, 14, 15, 3]
    learner.train_step([Sample(prompt, [15, 14, EOS], 1.0, group=0), Sample(prompt, [16, 17, EOS], 0.0, group=0)])
    return before, learner.state_dict()


def test_delta_after_a_real_training_step_rebuilds_weights_exactly() -> None:
    before, after = learner_after_steps()
    bf16_before = {k: v.to(torch.bfloat16) for k, v in before.items()}
    bf16_after = {k: v.to(torch.bfloat16) for k, v in after.items()}
    for v0, v1, label in ((before, after, "fp32"), (bf16_before, bf16_after, "bf16")):
        pub = WeightPublisher(PublishOptions(chunk_bytes=64 * 1024))
        pub.publish(0, v0)
        m1 = pub.publish(1, v1)

        async def go(pub: WeightPublisher = pub) -> tuple:
            async with serve(pub) as url, aiohttp.ClientSession() as s:
                node = WeightNode(PullOptions(token="t", peer_id="w"), serve=None)
                await node.pull(url, 0, s)
                full = node.last
                got = await node.pull(url, 1, s)
                return got, full, node.last

        got, full, st = asyncio.run(go())
        assert_same(v1, got)
        assert st.mode == "delta" and st.from_origin == 0, label
        assert 0 < st.delta_bytes < m1.total_bytes and full.mode == "full", label
        assert pub.counters.delta_bytes == st.delta_bytes


def test_corrupt_delta_falls_back_to_the_full_chunk() -> None:
    before, after = learner_after_steps()
    pub = WeightPublisher(PublishOptions(chunk_bytes=64 * 1024))
    pub.publish(4, before)
    pub.publish(5, after)

    @web.middleware
    async def break_delta(request: web.Request, handler):
        resp = await handler(request)
        if "/delta/" in request.path and request.path.endswith("/chunks/0"):
            return web.Response(body=b"\x28\xb5\x2f\xfd garbage", headers={"X-Digest": "0" * 64})
        return resp

    async def go() -> tuple:
        async with serve(pub, break_delta) as url, aiohttp.ClientSession() as s:
            node = WeightNode(PullOptions(token="t", peer_id="w"), serve=None)
            await node.pull(url, 4, s)
            return await node.pull(url, 5, s), node.last

    got, st = asyncio.run(go())
    assert_same(after, got)
    assert st.mode == "delta" and st.from_origin == pub.manifest(5).chunks[0].size and st.retries >= 1


def test_worker_two_versions_behind_pulls_one_composed_delta() -> None:
    # (beyond the trainer's delta history it pulls in full: tests/test_delta_chain.py)
    pub = WeightPublisher(PublishOptions(chunk_bytes=64 * 1024, keep=3))
    vs = [{"w": torch.full((5000,), float(i))} for i in range(3)]
    for i, v in enumerate(vs):
        pub.publish(i, v)

    async def go() -> tuple:
        async with serve(pub) as url, aiohttp.ClientSession() as s:
            node = WeightNode(PullOptions(token="t", peer_id="w"), serve=None)
            await node.pull(url, 0, s)
            return await node.pull(url, 2, s), node.last

    got, st = asyncio.run(go())
    assert_same(vs[2], got)
    assert st.mode == "delta" and 0 < st.delta_bytes < st.total_bytes and st.from_origin == 0
