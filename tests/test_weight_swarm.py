"""Peer fan-out, lying and dying sources, garbage collection under pulls, same-machine transfer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
import torch
from aiohttp import web

from rlboost.weights.local import open_local
from rlboost.weights.peer_server import PeerServer, ServeOptions, WeightNode
from rlboost.weights.publisher import PublishOptions, WeightPublisher, add_routes
from rlboost.weights.pull import PullOptions, PullStats, pull_weights
from rlboost.weights.store import WeightStore
from rlboost.weights.tracker import Announce, SwarmTracker, decode_bits, encode_bits

TOKEN = "tok"


def model(seed: int = 0, n: int = 96 * 1024) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "a.weight": torch.randn(n, generator=g),
        "b.weight": torch.randn(n // 2, generator=g).to(torch.bfloat16),
        "c.bias": torch.randn(7, generator=g, dtype=torch.float64),
    }


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]), k


def auth() -> web.middleware:
    @web.middleware
    async def check(request: web.Request, handler):  # the trainer's real middleware does the same
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"error": "token"}, status=401)
        return await handler(request)

    return check


def hold_after_first_chunk(gate: asyncio.Event) -> web.middleware:
    """Serve one chunk, then hold every other chunk request until `gate` is set: a pull that is
    certainly still in flight, however fast or loaded the machine is."""
    served = [0]

    @web.middleware
    async def hold(request: web.Request, handler):
        if "/chunks/" in request.path:
            served[0] += 1
            if served[0] > 1:
                await gate.wait()
        return await handler(request)

    return hold


@contextlib.asynccontextmanager
async def serve(
    pub: WeightPublisher, port: int = 0, gate: asyncio.Event | None = None
) -> AsyncIterator[tuple[str, web.AppRunner]]:
    app = web.Application(middlewares=[auth(), *([hold_after_first_chunk(gate)] if gate else [])])
    add_routes(app, pub)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    host, bound = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{bound}", runner
    finally:
        await runner.cleanup()


def run(coro) -> object:
    return asyncio.run(asyncio.wait_for(coro, 90))


def test_fanout_peers_carry_the_load_and_origin_sends_about_one_copy() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=16 * 1024, egress_bps=4e6))  # a slow trainer uplink
    want = model()
    m = pub.publish(1, want)
    assert len(m.chunks) > 20

    async def go() -> list[tuple[dict, PullStats, int]]:
        async with serve(pub) as (url, _), aiohttp.ClientSession() as s:
            link = ServeOptions(egress_bps=4e6)
            nodes = [WeightNode(PullOptions(token=TOKEN, peer_id=f"w{i}", parallel=2), link) for i in range(4)]
            for n in nodes:
                await n.start()
            try:
                got = await asyncio.gather(*(n.pull(url, 1, s) for n in nodes))
                # workers receive into anonymous (huge-page) memory and serve peers by plain writes
                assert all(n.store.latest_complete().buf.file is None for n in nodes)  # type: ignore[union-attr]
                return [(g, n.last, n.server.counters.total) for g, n in zip(got, nodes)]
            finally:
                for n in nodes:
                    await n.close()

    out = run(go())
    for tensors, _, _ in out:
        assert_same(want, tensors)
    served_by_peers = sum(served for _, _, served in out)
    assert served_by_peers > 0
    assert sum(st.from_peers for _, st, _ in out) == served_by_peers
    # Each chunk leaves the trainer about once, though four workers pulled it.
    assert pub.counters.full_bytes <= 1.5 * m.total_bytes, (pub.counters.full_bytes, m.total_bytes)
    assert pub.stats()["egress_bytes"] == pub.counters.full_bytes


class LyingPeer:
    """Claims to hold every chunk and serves wrong bytes of the right length."""

    def __init__(self, pub: WeightPublisher) -> None:
        self.pub, self.hits = pub, 0

    async def chunk(self, request: web.Request) -> web.Response:
        self.hits += 1
        data = bytearray(self.pub.chunk(int(request.match_info["v"]), int(request.match_info["i"])))
        data[0] ^= 1
        return web.Response(body=bytes(data), content_type="application/octet-stream")


def test_lying_peer_is_dropped_and_reported() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=16 * 1024))
    want = model(2)
    m = pub.publish(3, want)
    liar = LyingPeer(pub)
    n = len(m.chunks)

    async def go() -> tuple[dict, PullStats, dict]:
        app = web.Application()
        app.router.add_get("/v1/weights/{v}/chunks/{i}", liar.chunk)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        liar_url = "http://{}:{}".format(*runner.addresses[0][:2])
        pub.tracker.announce(3, Announce(peer_id="liar", url=liar_url, n_chunks=n, have=encode_bits(range(n), n)))
        try:
            async with serve(pub) as (url, _):
                st = PullStats()
                got = await pull_weights(url, 3, PullOptions(token=TOKEN, peer_id="honest"), stats=st)
                view = pub.tracker.announce(3, Announce(peer_id="late", n_chunks=n))
                return got, st, {"view": view, "liar": liar_url}
        finally:
            await runner.cleanup()

    got, st, info = run(go())
    assert_same(want, got)
    assert liar.hits >= 1 and st.bad_peers == [info["liar"]]
    assert st.from_peers == 0 and st.from_origin >= m.total_bytes
    assert all(p["url"] != info["liar"] for p in info["view"]["peers"])  # the tracker dropped it too


def test_transfer_survives_its_peer_source_being_killed() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=32 * 1024))
    want = model(4, n=256 * 1024)  # ~1.5 MB
    m = pub.publish(1, want)

    async def go() -> tuple[dict, PullStats, int]:
        async with serve(pub) as (url, _), aiohttp.ClientSession() as s:
            slow = ServeOptions(egress_bps=1.5e6)  # slow enough to kill mid-transfer
            seed = WeightNode(PullOptions(token=TOKEN, peer_id="seed"), slow)
            await seed.pull(url, 1, s)
            egress0 = pub.counters.full_bytes
            st = PullStats()
            task = asyncio.create_task(
                pull_weights(url, 1, PullOptions(token=TOKEN, peer_id="newcomer", parallel=2), session=s, stats=st)
            )
            while st.from_peers < 64 * 1024 and not task.done():
                await asyncio.sleep(0.02)
            await seed.close()  # the source dies mid-transfer
            got = await task
            return got, st, pub.counters.full_bytes - egress0

    got, st, origin_bytes = run(go())
    assert_same(want, got)
    assert st.from_peers > 0 and st.bad_peers and 0 < origin_bytes < m.total_bytes
    assert st.from_origin == origin_bytes


def test_transfer_survives_origin_restart() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=32 * 1024, egress_bps=3e6))
    want = model(5, n=256 * 1024)
    pub.publish(2, want)

    async def go() -> tuple[dict, PullStats]:
        async with serve(pub) as (url, runner):
            port = int(url.rsplit(":", 1)[1])
            st = PullStats()
            task = asyncio.create_task(pull_weights(url, 2, PullOptions(token=TOKEN, swarm=False, retries=8), stats=st))
            while st.bytes_received < 200 * 1024:
                await asyncio.sleep(0.02)
            await runner.cleanup()  # the trainer's server dies mid-transfer ...
            await asyncio.sleep(0.3)
            async with serve(pub, port):  # ... and comes back on the same port
                return await task, st

    got, st = run(go())
    assert_same(want, got)
    assert st.retries >= 1


def test_gc_never_removes_a_version_being_pulled() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=32 * 1024, keep=1, delta=False))
    want = model(6, n=128 * 1024)
    pub.publish(1, want)

    async def go() -> tuple[dict, list[int], list[int]]:
        gate = asyncio.Event()  # the pull of version 1 cannot finish before the gate opens
        async with serve(pub, gate=gate) as (url, _):
            task = asyncio.create_task(pull_weights(url, 1, PullOptions(token=TOKEN, peer_id="slow", parallel=1)))
            while 1 not in pub.tracker.versions_in_use():
                await asyncio.sleep(0.01)
            for v in range(2, 6):  # training races ahead while the worker still pulls version 1
                await asyncio.to_thread(pub.publish, v, model(v, n=128 * 1024))
            during = pub.versions()
            assert not task.done()
            gate.set()
            got = await task
            pub.collect()
            return got, during, pub.versions()

    got, during, after = run(go())
    assert_same(want, got)
    assert during == [1, 5] and after == [5]


def test_tracker_grants_each_chunk_once_and_expires_dead_pullers() -> None:
    now = [0.0]
    tr = SwarmTracker(lease_s=3.0, peer_ttl_s=8.0, clock=lambda: now[0])
    a = tr.announce(1, Announce(peer_id="a", url="http://a", n_chunks=10, want=4))
    b = tr.announce(1, Announce(peer_id="b", url="http://b", n_chunks=10, want=4))
    assert a["origin"] == [0, 1, 2, 3] and b["origin"] == [4, 5, 6, 7]
    a = tr.announce(1, Announce(peer_id="a", url="http://a", n_chunks=10, have=encode_bits([0, 1], 10), want=4))
    assert a["origin"] == [2, 3, 8, 9] and a["peers"] == []  # b holds nothing yet
    b = tr.announce(1, Announce(peer_id="b", url="http://b", n_chunks=10, want=4))
    assert b["origin"] == [4, 5, 6, 7]
    assert [decode_bits(p["have"], 10) for p in b["peers"]] == [{0, 1}]
    assert tr.versions_in_use() == {1}
    now[0] = 5.0  # b stops announcing: its grants lapse and go to a; then b is forgotten
    a = tr.announce(1, Announce(peer_id="a", url="http://a", n_chunks=10, have=encode_bits(range(4), 10), want=8))
    assert a["origin"] == [4, 5, 6, 7, 8, 9]
    now[0] = 20.0
    tr.announce(1, Announce(peer_id="a", url="http://a", n_chunks=10, have=encode_bits(range(10), 10), done=True))
    assert tr.versions_in_use() == set()
    with pytest.raises(ValueError):
        decode_bits(encode_bits(range(16), 16), 3)


def test_peer_server_needs_the_job_token_and_serves_only_verified_chunks() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=16 * 1024))
    m = pub.publish(1, model())

    async def go() -> None:
        store = WeightStore()
        from rlboost.weights.buffers import HostBuffer

        buf = HostBuffer(m.total_bytes)
        mark = store.begin(m, buf)
        buf.view[: m.chunks[0].size] = pub.chunk(1, 0)
        mark(0)
        server = PeerServer(store, TOKEN)
        url = await server.start()
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"{url}/v1/weights/1/chunks/0") as r:
                    assert r.status == 401
                h = {"Authorization": f"Bearer {TOKEN}"}
                async with s.get(f"{url}/v1/weights/1/chunks/0", headers=h) as r:
                    assert r.status == 200 and await r.read() == bytes(pub.chunk(1, 0))
                async with s.get(f"{url}/v1/weights/1/chunks/1", headers=h) as r:
                    assert r.status == 404  # not fetched yet
            assert server.counters.full_bytes == m.chunks[0].size
        finally:
            await server.close()

    run(go())


def test_same_machine_engine_maps_the_publisher_buffer() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=16 * 1024))
    want = model(7)
    m = pub.publish(1, want)
    if m.local_path is None:
        pytest.skip("no memfd on this platform")
    assert open_local(m) is not None
    bad = m.model_copy(update={"local_path": "/proc/self/fd/999999"})
    assert open_local(bad) is None

    async def go() -> tuple[dict, PullStats]:
        async with serve(pub) as (url, _):
            st = PullStats()
            return await pull_weights(url, 1, PullOptions(token=TOKEN, local=True), stats=st), st

    got, st = run(go())
    assert_same(want, got)
    assert st.mode == "local" and st.bytes_received == 0 and pub.counters.total == 0


def test_a_buffer_prepared_before_the_pull_is_the_one_the_pull_fills() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=16 * 1024))
    want = model(9)
    m = pub.publish(1, want)

    async def go() -> tuple[dict, bool, bool]:
        async with serve(pub) as (url, _), aiohttp.ClientSession() as s:
            node = WeightNode(PullOptions(token=TOKEN, peer_id="booting"), serve=None)
            await node.prepare("http://127.0.0.1:9", 1, s)  # nothing listens there: harmless, no buffer
            assert node._reserving is None
            await node.prepare(url, 1, s)
            assert node._reserving is not None
            await node._reserving
            reserved = node.store._spare[-1]
            sized = reserved.size == m.total_bytes and reserved.file is None
            got = await node.pull(url, 1, s)
            used = node.store.latest_complete().buf is reserved  # type: ignore[union-attr]
            # the second buffer (for the next version, while this one stays the delta base) is
            # paged in right after the pull, and the next pull lands in it
            assert node._reserving is not None
            await node._reserving
            second = next(b for b in node.store._spare if b is not reserved)
            pub.publish(2, model(11))
            assert_same(model(11), await node.pull(url, 2, s))
            used = used and node.store.latest_complete().buf is second  # type: ignore[union-attr]
            await node.close()
            return got, sized, used

    got, sized, used = run(go())
    assert_same(want, got)
    assert sized and used


def test_a_busy_peer_turns_pullers_away_without_being_dropped() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=32 * 1024))
    want = model(10, n=128 * 1024)
    pub.publish(1, want)

    async def go() -> tuple[list[dict], list[PullStats], int, int]:
        async with serve(pub) as (url, _), aiohttp.ClientSession() as s:
            seed = WeightNode(PullOptions(token=TOKEN, peer_id="seed"), ServeOptions(egress_bps=2e6, max_uploads=1))
            await seed.pull(url, 1, s)
            assert seed.server is not None
            egress0 = pub.counters.full_bytes
            stats = [PullStats() for _ in range(3)]
            got = await asyncio.gather(
                *(
                    pull_weights(url, 1, PullOptions(token=TOKEN, peer_id=f"p{i}", parallel=2), session=s, stats=st)
                    for i, st in enumerate(stats)
                )
            )
            busy = seed.server.counters.busy
            await seed.close()
            return got, stats, busy, pub.counters.full_bytes - egress0

    got, stats, busy, origin_bytes = run(go())
    for g in got:
        assert_same(want, g)
    assert busy > 0  # requests were turned away...
    assert all(not st.bad_peers for st in stats)  # ...and nobody took the busy seed for a bad one
    assert sum(st.from_peers for st in stats) > 0 and origin_bytes == 0  # everything came from peers


def test_a_pull_right_after_prepare_soon_waits_for_the_prepared_buffer() -> None:
    pub = WeightPublisher(PublishOptions(chunk_bytes=16 * 1024))
    want = model(12)
    pub.publish(1, want)

    async def go() -> tuple[dict, bool]:
        async with serve(pub) as (url, _), aiohttp.ClientSession() as s:
            node = WeightNode(PullOptions(token=TOKEN, peer_id="racing"), serve=None)
            made: list = []
            reserve = node.store.reserve

            def recording(size: int) -> None:
                reserve(size)
                made.append(node.store._spare[-1])

            node.store.reserve = recording  # type: ignore[method-assign]
            node.prepare_soon(url, 1, s)
            got = await node.pull(url, 1, s)  # at once: the manifest fetch has not even started
            used = node.store.latest_complete().buf is made[0]  # type: ignore[union-attr]
            await node.close()
            return got, used

    got, used = run(go())
    assert_same(want, got)
    assert used
