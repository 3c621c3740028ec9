"""Chains and jumps: a worker several versions behind gets one composed delta, bit-exact, or the full
model when that is cheaper; the trainer keeps deltas within a memory budget and says how far back."""

from __future__ import annotations

import asyncio
import itertools

import aiohttp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlboost.contracts.spec import SpecError, parse_spec
from rlboost.weights import delta_codec
from rlboost.weights.delta_chain import compose_chunk
from rlboost.weights.peer_server import WeightNode
from rlboost.weights.publisher import PublishOptions, WeightPublisher
from rlboost.weights.pull import PullOptions
from tests.test_weight_swarm import TOKEN, assert_same, serve


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.sampled_from([64, 1000, 4096]),
    width=st.sampled_from([1, 2, 4]),
    steps=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6),
    sparse=st.booleans(),
)
def test_a_composed_chunk_delta_rebuilds_the_last_version_bit_exactly(
    seed: int, size: int, width: int, steps: list[float], sparse: bool
) -> None:
    rng = np.random.default_rng(seed)
    versions = [rng.integers(0, 256, size, dtype=np.uint8)]
    for frac in steps:  # each step changes a fraction of the bytes (0: none, 1: all)
        v = versions[-1].copy()
        where = rng.random(size) < frac
        v[where] = rng.integers(0, 256, int(where.sum()), dtype=np.uint8)
        versions.append(v)
    parts = []
    for old, new in itertools.pairwise(versions):
        e = delta_codec.encode_best(memoryview(old), memoryview(new), width)
        if e is not None:
            parts.append((e[1], e[0]))
    got = compose_chunk(parts, memoryview(versions[-1].tobytes()), width, sparse)
    if got is None:
        assert np.array_equal(versions[0], versions[-1])
        return
    out = bytearray(size)
    delta_codec.decode_chunk(memoryview(versions[0].tobytes()), got[1], memoryview(out), width, got[0])
    assert bytes(out) == versions[-1].tobytes()


def chain(n_versions: int, noisy: set[int] = frozenset()) -> list[dict[str, torch.Tensor]]:  # type: ignore[assignment]
    """Version k: version k-1 with a few hundred elements nudged (a small-lr step); versions in
    `noisy` also redraw every bit of tensor `c` (its delta is no smaller than its bytes)."""
    g = torch.Generator().manual_seed(0)
    cur = {
        "a.weight": torch.randn(64 * 1024, generator=g),
        "b.weight": torch.randn(8 * 1024, generator=g),
        "c.counts": torch.zeros(8 * 1024, dtype=torch.int32),
    }
    out = [cur]
    for k in range(1, n_versions):
        nxt = {n: t.clone() for n, t in cur.items()}
        if k in noisy:
            nxt["c.counts"] = torch.randint(-(2**31), 2**31 - 1, (8 * 1024,), dtype=torch.int32, generator=g)
        else:
            idx = torch.randint(0, 64 * 1024, (300,), generator=g)
            nxt["a.weight"][idx] += 1e-3
            if k == 2:  # changed once, changed back at 3: no net change across 1..3 in b
                nxt["b.weight"][:10] += 1.0
            if k == 3:
                nxt["b.weight"][:10] = out[1]["b.weight"][:10]
        out.append(nxt)
        cur = nxt
    return out


def pull_behind(pub: WeightPublisher, models: list[dict], first: int, then: int) -> tuple[dict, object]:
    """A worker pulls `first`, the trainer publishes up to `then`, the worker pulls `then`."""

    async def go() -> tuple[dict, object]:
        async with serve(pub) as (url, _), aiohttp.ClientSession() as s:
            for v in range(first + 1):
                pub.publish(v, models[v])
            node = WeightNode(PullOptions(token=TOKEN, peer_id="w0", parallel=2))
            try:
                await node.pull(url, first, s)
                for v in range(first + 1, then + 1):
                    pub.publish(v, models[v])
                async with s.get(f"{url}/v1/weights/latest", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                    said = await r.json()
                got = await node.pull(url, then, s)
                return {k: t.clone() for k, t in got.items()}, (node.last, said)
            finally:
                await node.close()

    return asyncio.run(asyncio.wait_for(go(), 90))


def test_a_worker_four_versions_behind_pulls_one_composed_delta_bit_exactly() -> None:
    models = chain(6)
    pub = WeightPublisher(PublishOptions(chunk_bytes=16 * 1024))
    got, (st_, said) = pull_behind(pub, models, 1, 5)
    assert_same(models[5], got)
    assert st_.mode == "delta" and st_.unchanged_chunks > 0  # type: ignore[attr-defined]
    model_bytes = st_.total_bytes  # type: ignore[attr-defined]
    assert st_.bytes_received < model_bytes / 4, st_.summary()  # type: ignore[attr-defined]
    assert st_.from_origin == 0 and st_.from_peers == 0  # type: ignore[attr-defined]  # the delta covered all
    assert pub.counters.delta_bytes == st_.delta_bytes  # type: ignore[attr-defined]
    assert said == {"version": 5, "oldest_base": 0}  # every step's delta fits the default budget
    assert list(pub.stats()["delta_history"]["bytes_by_version"]) == ["1", "2", "3", "4", "5"]


def test_a_worker_behind_the_history_budget_pulls_in_full_and_the_trainer_says_how_far_back() -> None:
    models = chain(6)
    probe = WeightPublisher(PublishOptions(chunk_bytes=16 * 1024))
    for v in range(6):
        probe.publish(v, models[v])
    asyncio.run(probe.wait_delta(5, 4))  # the deltas are made in the background
    sizes = probe.history.stats()["bytes_by_version"]
    budget = sizes["4"] + sizes["5"]  # room for the last two steps only

    opts = PublishOptions(chunk_bytes=16 * 1024, delta_history_bytes=budget)
    got, (st_, said) = pull_behind(WeightPublisher(opts), models, 1, 5)
    assert_same(models[5], got)
    assert said["oldest_base"] == 3 and st_.mode == "full"  # type: ignore[attr-defined]
    pub = WeightPublisher(opts)
    got, (st_, said) = pull_behind(pub, models, 3, 5)
    assert_same(models[5], got)
    assert said["oldest_base"] == 3 and st_.mode == "delta"  # type: ignore[attr-defined]
    assert list(pub.stats()["delta_history"]["bytes_by_version"]) == ["4", "5"]


def test_a_jump_sends_in_full_the_chunks_whose_delta_is_no_smaller() -> None:
    models = chain(5, noisy={2, 3})
    pub = WeightPublisher(PublishOptions(chunk_bytes=16 * 1024))
    got, (st_, _) = pull_behind(pub, models, 1, 4)
    assert_same(models[4], got)
    m = pub.manifest(4)
    assert m is not None
    c = next(t for t in m.tensors if t.name == "c.counts")
    noisy = {x.index for x in m.chunks if x.offset < c.offset + c.nbytes and c.offset < x.offset + x.size}
    assert st_.mode == "delta" and st_.from_origin == sum(m.chunks[i].size for i in noisy)  # type: ignore[attr-defined]
    assert 0 < st_.delta_bytes < st_.total_bytes / 4  # type: ignore[attr-defined]  # the rest came as a delta


def test_the_history_budget_is_a_job_file_key_checked_by_name() -> None:
    job = {"name": "jb", "rollout": {"max_workers": 0}}
    assert parse_spec(job).trainer.delta_history_mib == 512
    assert parse_spec({**job, "trainer": {"delta_history_mib": 0}}).trainer.delta_history_mib == 0
    with pytest.raises(SpecError, match=r"trainer\.delta_history_mib"):
        parse_spec({**job, "trainer": {"delta_history_mib": -1}})
    pub = WeightPublisher(PublishOptions(chunk_bytes=16 * 1024, delta_history_bytes=0))  # none kept: v-1 still served
    models = chain(3)
    for v in range(3):
        pub.publish(v, models[v])
    assert asyncio.run(pub.wait_delta(2, 1)) is not None and asyncio.run(pub.wait_delta(2, 0)) is None
    assert pub.oldest_base() == 1 and pub.history.stats()["bytes"] == 0
