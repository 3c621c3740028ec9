"""Weight publisher + pull client over a real aiohttp server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Literal

import aiohttp
import pytest
import torch
from aiohttp import web

from rlboost.contracts.weight_manifest import Manifest
from rlboost.weights.buffers import tensor_views
from rlboost.weights.publisher import PublishOptions, WeightPublisher, add_routes
from rlboost.weights.pull import PullOptions, PullStats, pull_weights
from rlboost.weights.pull_control import WeightPullError, latest_version

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def model(seed: int = 0, width: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(width, 32, generator=g),  # float32
        "layer.0.w": torch.randn(width, width, generator=g).to(torch.bfloat16),
        "layer.0.b": torch.randn(width, generator=g, dtype=torch.float64),
        "layer.1.w": torch.randn(width, 16, generator=g).to(torch.float16),
        "steps": torch.tensor([seed, 7, -3], dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
    }


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


def served_chunk(pub: WeightPublisher, request: web.Request) -> bytes:
    """The bytes the real handler serves for this chunk request (its body is an opaque payload)."""
    return bytes(pub.chunk(int(request.match_info["version"]), int(request.match_info["index"])))


def replace_body(resp: web.StreamResponse, body: bytes) -> web.Response:
    """Same status and headers as the real answer, other bytes (the real one is sent by sendfile)."""
    headers = {k: v for k, v in resp.headers.items() if k.lower() not in ("content-length", "content-type")}
    return web.Response(status=resp.status, body=body, headers=headers, content_type="application/octet-stream")


@contextlib.asynccontextmanager
async def serve(publisher: WeightPublisher, *middlewares: Callable) -> AsyncIterator[str]:
    app = web.Application(middlewares=list(middlewares))
    add_routes(app, publisher)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def run(coro: Awaitable) -> object:
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_round_trip_multi_chunk_bit_exact() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=1000))
    tensors = model()
    m = pub.publish(3, tensors)
    assert len(m.chunks) > 10 and m.total_bytes == sum(c.size for c in m.chunks)
    progress: list[tuple[int, int]] = []
    stats = PullStats()

    async def go() -> dict[str, torch.Tensor]:
        async with serve(pub) as url:
            assert await latest_version(url) == 3
            opts = PullOptions(parallel=3)
            return await pull_weights(url, 3, opts, on_progress=lambda d, t: progress.append((d, t)), stats=stats)

    got = run(go())
    assert_same(tensors, got)
    assert progress[-1] == (m.total_bytes, m.total_bytes)
    assert [d for d, _ in progress] == sorted(d for d, _ in progress)
    assert (stats.version, stats.total_bytes, stats.chunks, stats.retries) == (
        3,
        m.total_bytes,
        len(m.chunks),
        0,
    )
    assert stats.bytes_received == m.total_bytes and stats.seconds > 0


def test_single_chunk_and_latest_none_and_token_header() -> None:
    pub = WeightPublisher()  # default 4 MiB chunks: the whole model is one chunk (and no tracker hits)
    seen: list[str | None] = []

    @web.middleware
    async def record_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization"))
        return await handler(request)

    async def go() -> dict[str, torch.Tensor]:
        async with serve(pub, record_auth) as url:
            assert await latest_version(url, token="s3cret") is None
            pub.publish(0, model(1))
            return await pull_weights(url, 0, PullOptions(token="s3cret"))

    assert_same(model(1), run(go()))
    assert len(pub.manifest(0).chunks) == 1
    assert seen and all(h == "Bearer s3cret" for h in seen)


@pytest.mark.parametrize("alg", ["blake3", "sha256"])
def test_corrupted_chunk_is_detected_and_refetched(alg: Literal["blake3", "sha256"]) -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=2048, digest_alg=alg))
    assert pub.publish(1, model()).digest == alg
    hits: dict[str, int] = {}
    corrupted: list[int] = []

    @web.middleware
    async def corrupt_first(request: web.Request, handler: Handler) -> web.StreamResponse:
        resp = await handler(request)
        hits[request.path] = hits.get(request.path, 0) + 1
        if request.path.endswith("/chunks/2") and hits[request.path] == 1:
            body = bytearray(served_chunk(pub, request))
            body[100] ^= 0xFF  # same length, wrong bytes: only the digest can tell
            corrupted.append(len(body))
            return replace_body(resp, bytes(body))
        return resp

    stats = PullStats()

    async def go() -> dict[str, torch.Tensor]:
        async with serve(pub, corrupt_first) as url:
            return await pull_weights(url, 1, stats=stats)

    assert_same(model(), run(go()))
    assert corrupted == [2048] and hits["/v1/weights/1/chunks/2"] == 2 and stats.retries == 1


def test_always_corrupt_chunk_fails_after_retries() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=2048))
    pub.publish(1, model())

    @web.middleware
    async def corrupt(request: web.Request, handler: Handler) -> web.StreamResponse:
        resp = await handler(request)
        if request.path.endswith("/chunks/0"):
            return replace_body(resp, bytes(len(served_chunk(pub, request))))
        return resp

    async def go() -> None:
        async with serve(pub, corrupt) as url:
            await pull_weights(url, 1, PullOptions(retries=2))

    with pytest.raises(WeightPullError, match=r"version 1 chunk 0.*3 attempts.*blake3 mismatch"):
        run(go())


def test_broken_connection_mid_chunk_resumes_with_range() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=64 * 1024))
    tensors = model(width=512)  # several 64 KiB chunks
    m = pub.publish(5, tensors)
    assert len(m.chunks) >= 3
    ranges: list[str | None] = []

    @web.middleware
    async def break_first(request: web.Request, handler: Handler) -> web.StreamResponse:
        resp = await handler(request)
        if not request.path.endswith("/chunks/1"):
            return resp
        ranges.append(request.headers.get("Range"))
        if len(ranges) > 1:
            return resp
        body = served_chunk(pub, request)
        broken = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        broken.content_length = len(body)
        await broken.prepare(request)
        await broken.write(body[: len(body) // 2])
        assert request.transport is not None
        request.transport.close()  # flushes the half written, then drops the connection
        return broken

    stats = PullStats()

    async def go() -> dict[str, torch.Tensor]:
        async with serve(pub, break_first) as url:
            return await pull_weights(url, 5, stats=stats)

    assert_same(tensors, run(go()))
    half, size = m.chunks[1].size // 2, m.chunks[1].size
    assert ranges == [None, f"bytes={half}-{size - 1}"]
    assert stats.retries == 1 and stats.bytes_received == m.total_bytes  # nothing fetched twice


def test_gc_keeps_newest_and_pinned() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=4096, keep=2))
    small = {"w": torch.ones(3)}
    pub.publish(1, small)
    pub.pin(1)
    pub.pin(1)  # reference counted: two in-flight steps
    for v in (2, 3, 4):
        pub.publish(v, small)
    assert pub.versions() == [1, 3, 4] and pub.latest == 4
    pub.unpin(1)
    assert pub.versions() == [1, 3, 4]
    pub.unpin(1)  # last reference gone: collected at once
    assert pub.versions() == [3, 4]
    assert pub.manifest(1) is None and pub.chunk(1, 0) is None
    with pytest.raises(ValueError, match="not pinned"):
        pub.unpin(1)
    pub.pin(6)  # pinning ahead of publish is allowed and protects it later
    for v in (6, 7, 8):
        pub.publish(v, small)
    assert pub.versions() == [6, 7, 8]
    with pytest.raises(ValueError, match="not newer"):
        pub.publish(8, small)


def test_publish_from_thread_while_serving_pinned_version() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=1500, keep=1))
    pub.publish(1, model(1))
    pub.pin(1)

    def trainer() -> None:
        for v in range(2, 12):
            pub.publish(v, model(v))

    async def go() -> list[dict[str, torch.Tensor]]:
        async with serve(pub) as url:
            t = threading.Thread(target=trainer)
            t.start()
            out = [await pull_weights(url, 1, PullOptions(parallel=8)) for _ in range(3)]
            await asyncio.to_thread(t.join)
            out.append(await pull_weights(url, 11))
            return out

    *old, new = run(go())
    for got in old:
        assert_same(model(1), got)
    assert_same(model(11), new)
    assert pub.versions() == [1, 11]


def test_bad_params_are_400_or_404_never_500() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=1000))
    m = pub.publish(2, model())
    base = "/v1/weights"
    cases = {
        f"{base}/abc/manifest": 400,
        f"{base}/-1/manifest": 400,
        f"{base}/+2/manifest": 400,
        f"{base}/2.0/manifest": 400,
        f"{base}/99999999999999999999999/manifest": 400,
        f"{base}/7/manifest": 404,
        f"{base}/2/chunks/x": 400,
        f"{base}/2/chunks/-3": 400,
        f"{base}/x/chunks/0": 400,
        f"{base}/2/chunks/{len(m.chunks)}": 404,
        f"{base}/9/chunks/0": 404,
    }

    async def go() -> None:
        async with serve(pub) as url, aiohttp.ClientSession() as s:
            for path, want in cases.items():
                async with s.get(url + path) as r:
                    assert r.status == want, path
                    assert "error" in await r.json(), path
            async with s.get(f"{url}{base}/2/manifest") as r:
                assert Manifest.model_validate(await r.json()) == m
            chunk0 = bytes(pub.chunk(2, 0))
            async with s.get(f"{url}{base}/2/chunks/0", headers={"Range": "bytes=10-19"}) as r:
                assert r.status == 206 and await r.read() == chunk0[10:20]
                assert r.headers["Content-Range"] == f"bytes 10-19/{len(chunk0)}"
                assert r.headers["X-Digest"] == m.chunks[0].digest
            async with s.get(f"{url}{base}/2/chunks/0", headers={"Range": "bytes=-5"}) as r:
                assert r.status == 206 and await r.read() == chunk0[-5:]
            for bad, want in (
                ("bytes=5000-", 416),
                ("bytes=9-3", 416),
                ("pages=1-2", 400),
                ("bytes=1-2,4-5", 400),
            ):
                async with s.get(f"{url}{base}/2/chunks/0", headers={"Range": bad}) as r:
                    assert r.status == want, bad

    run(go())


def test_manifest_with_an_unknown_digest_or_a_wrong_root_is_refused() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=2048))
    pub.publish(1, model())

    def rewrite(**changes: object) -> Callable:
        @web.middleware
        async def mw(request: web.Request, handler: Handler) -> web.StreamResponse:
            resp = await handler(request)
            if request.path.endswith("/manifest"):
                body = {**pub.manifest(1).model_dump(), **changes}  # type: ignore[union-attr]
                return web.json_response(body)
            return resp

        return mw

    async def go(mw: Callable) -> None:
        async with serve(pub, mw) as url:
            await pull_weights(url, 1, PullOptions(retries=0))

    with pytest.raises(WeightPullError, match="invalid manifest"):
        run(go(rewrite(digest="md5")))
    # the same chunk digests read as SHA-256 no longer add up to the root
    with pytest.raises(WeightPullError, match="root hash does not match"):
        run(go(rewrite(digest="sha256")))


def test_unknown_version_error_names_it() -> None:
    pub = WeightPublisher()
    pub.publish(1, {"w": torch.zeros(2)})

    async def go() -> None:
        async with serve(pub) as url:
            await pull_weights(url, 42)

    with pytest.raises(WeightPullError, match=r"weight version 42.*404"):
        run(go())


def test_unreachable_server_fails_within_deadline() -> None:
    async def go() -> None:
        await pull_weights("http://127.0.0.1:9", 1, PullOptions(retries=1, timeout_s=2.0))

    with pytest.raises(WeightPullError, match=r"weight version 1.*2 attempts"):
        run(go())


def test_pull_rate_estimate_is_smoothed_bytes_per_second() -> None:
    from rlboost.weights.pull import _Rate

    now = [0.0]
    r = _Rate(clock=lambda: now[0])
    r.add(0)
    assert r.per_s == 0.0
    now[0] = 0.1
    r.add(100)
    assert r.per_s == pytest.approx(1000.0)
    now[0] = 0.105  # too soon after the last sample to say anything
    r.add(10_000)
    assert r.per_s == pytest.approx(1000.0)
    now[0] = 0.2
    r.add(300)
    assert r.per_s == pytest.approx(1500.0)  # halfway to the new 2000 B/s


def test_publisher_stages_the_next_version_into_a_buffer_paged_in_meanwhile() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=4096))
    pub.publish(0, model(0))
    assert pub._next is not None
    prepared = pub._next[1].result()
    pub.publish(1, model(1))
    assert pub._versions[1].buf is prepared  # the copy that blocks training landed in it
    pub._next[1].result()  # type: ignore[index]
    pub.publish(2, model(2, width=8))  # another size: the prepared buffer does not fit
    assert pub._versions[2].buf.size == pub.manifest(2).total_bytes  # type: ignore[union-attr]
    assert_same(model(2, width=8), tensor_views(pub._versions[2].buf.view, pub.manifest(2).tensors))  # type: ignore[union-attr]
    off = WeightPublisher(PublishOptions(prepare_next=False))
    off.publish(0, model(0))
    assert off._next is None
