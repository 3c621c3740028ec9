"""The torch.distributed weight broadcast (rlboost/weights/broadcast.py, the `torch` transport
rlboost/weights/transports/torch_broadcast.py): the trainer side in this process, each member a real
process (tests/broadcast_member.py), gloo over loopback, the HTTP fallback against a real publisher
server (testkit/weight_origin.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from rlboost.contracts.protocol import Offer
from rlboost.weights.broadcast import (
    BroadcastError,
    BroadcastOptions,
    BroadcastPlan,
    BroadcastResult,
    Transfer,
    buckets,
    receive,
)
from rlboost.weights.buffers import HostBuffer
from rlboost.weights.publisher import WeightPublisher
from rlboost.weights.pull import PullStats
from rlboost.weights.transports import Receiver, Site, TrainerEnd, trainer_transport
from rlboost.weights.transports.torch_broadcast import TorchBroadcast, backend_for, suits
from testkit.weight_origin import CHUNK, Origin
from tests.test_weights import assert_same
from tests.torch_threads import one_thread  # noqa: F401 - fixture

ROOT = Path(__file__).resolve().parents[1]


def big_model(seed: int = 0) -> dict[str, torch.Tensor]:
    """~200 KB in several dtypes: many chunks, so a kill can land between buckets."""
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(256, 96, generator=g),
        "layer.0.w": torch.randn(128, 128, generator=g).to(torch.bfloat16),
        "layer.0.b": torch.randn(128, generator=g, dtype=torch.float64),
        "steps": torch.tensor([seed, 7, -3], dtype=torch.int64),
    }


@pytest.fixture
def origin() -> Iterator[Origin]:
    o = Origin(big_model())
    yield o
    o.close()


def start_member(plan_file: Path, member: str, origin: Origin, out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "tests.broadcast_member", str(plan_file), member, origin.url, str(out), *extra]
    return subprocess.Popen(cmd, cwd=ROOT, env=env)


def send_in_thread(transfer: Transfer, buf: HostBuffer) -> tuple[threading.Thread, list[BroadcastResult]]:
    box: list[BroadcastResult] = []
    t = threading.Thread(target=lambda: box.append(transfer.send(buf)), daemon=True)
    t.start()
    return t, box


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, "the stalling member exited before its stall"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def run_transfer(
    origin: Origin, tmp_path: Path, opts: BroadcastOptions, *, kill: str | None = None
) -> tuple[BroadcastResult, dict[str, dict], float]:
    """Members w1..w3 (`kill` stalls after its first bucket and is SIGKILLed there); returns the
    trainer's result, each surviving member's output, and the seconds `send` took."""
    members = ["w1", "w2", "w3"]
    transfer = Transfer(origin.manifest, members, opts)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(transfer.plan.model_dump_json())
    marker = tmp_path / "stalled"
    procs = {
        m: start_member(
            plan_file, m, origin, tmp_path / f"{m}.pt", *(["--stall-after", "0", str(marker)] if m == kill else [])
        )
        for m in members
    }
    try:
        t0 = time.monotonic()
        thread, box = send_in_thread(transfer, origin.buffer())
        if kill:
            wait_for(marker, procs[kill])
            procs[kill].send_signal(signal.SIGKILL)  # mid-broadcast: it holds bucket 0 of several
        thread.join(120)
        assert box, "the trainer's send did not return"
        took = time.monotonic() - t0
        outs = {}
        for m, p in procs.items():
            rc = p.wait(120)
            if m == kill:
                assert rc == -signal.SIGKILL
                continue
            assert rc == 0, f"member {m} exited {rc}"
            outs[m] = torch.load(tmp_path / f"{m}.pt")
        return box[0], outs, took
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        transfer.close()


def fast(**kw: object) -> BroadcastOptions:
    base: dict = {"bucket_bytes": 2 * CHUNK, "timeout_s": 30.0, "regroup_s": 6.0}
    return BroadcastOptions(**{**base, **kw})


@pytest.mark.integration
def test_three_members_get_the_version_bit_exact_over_gloo_without_http(origin: Origin, tmp_path: Path) -> None:
    assert len(buckets(origin.manifest, 2 * CHUNK)) >= 4
    res, outs, _ = run_transfer(origin, tmp_path, fast())
    assert sorted(res.delivered) == ["w1", "w2", "w3"] and res.missed == [] and res.rounds == 1
    for m, out in outs.items():
        assert out["mode"] == "broadcast", (m, out["reason"])
        assert_same(out["tensors"], big_model())
    assert origin.pub.counters.full_bytes == 0  # nothing went over HTTP


@pytest.mark.integration
def test_member_killed_mid_broadcast_the_rest_finish_in_a_second_round(origin: Origin, tmp_path: Path) -> None:
    res, outs, took = run_transfer(origin, tmp_path, fast(), kill="w2")
    assert res.rounds == 2 and sorted(res.delivered) == ["w1", "w3"] and res.missed == ["w2"]
    assert sorted(outs) == ["w1", "w3"]
    for m, out in outs.items():
        assert out["mode"] == "broadcast", (m, out["reason"])
        assert_same(out["tensors"], big_model())
    assert origin.pub.counters.full_bytes == 0
    assert took < 2 * (30 + 6)  # bounded: the trainer never waits on the dead member for long


@pytest.mark.integration
def test_member_killed_mid_broadcast_survivors_fall_back_to_http(origin: Origin, tmp_path: Path) -> None:
    res, outs, _ = run_transfer(origin, tmp_path, fast(max_rounds=1), kill="w2")
    assert res.delivered == [] and res.missed == ["w1", "w2", "w3"] and res.rounds == 1
    assert sorted(outs) == ["w1", "w3"]
    for m, out in outs.items():
        assert out["mode"] == "http", m
        assert "broadcast failed" in out["reason"]
        assert_same(out["tensors"], big_model())  # verified chunk by chunk against the same manifest
    assert origin.pub.counters.full_bytes >= 2 * origin.manifest.total_bytes


def test_receive_refuses_what_it_cannot_do(origin: Origin) -> None:
    transfer = Transfer(origin.manifest, ["w1"], fast())
    try:
        plan = transfer.plan
        with pytest.raises(BroadcastError, match="not in the broadcast"):
            receive(plan, "w9", HostBuffer(plan.manifest.total_bytes, shareable=False))
        with pytest.raises(BroadcastError, match="receive buffer"):
            receive(plan, "w1", HostBuffer(10, shareable=False))
    finally:
        transfer.close()
    dead = plan.model_copy(update={"port": plan.port, "timeout_s": 0.5})
    with pytest.raises(BroadcastError):  # the store is gone: no rendezvous, within the timeout
        receive(dead, "w1", HostBuffer(plan.manifest.total_bytes, shareable=False))


def test_plan_is_validated(origin: Origin) -> None:
    good = {
        "version": origin.manifest.version,
        "manifest": origin.manifest.model_dump(),
        "backend": "gloo",
        "host": "127.0.0.1",
        "port": 1234,
        "members": ["a", "b"],
        "bucket_bytes": 1,
        "timeout_s": 1.0,
        "regroup_s": 1.0,
    }
    assert BroadcastPlan.model_validate(good).rendezvous == "tcp://127.0.0.1:1234"
    for bad in ({"version": 99}, {"members": ["a", "a"]}, {"backend": "mpi"}, {"extra": 1}, {"members": []}):
        with pytest.raises(ValidationError):
            BroadcastPlan.model_validate({**good, **bad})


def test_buckets_are_whole_chunks_covering_the_buffer(origin: Origin) -> None:
    m = origin.manifest
    for size in (1, CHUNK, 3 * CHUNK, 10**9):
        bs = buckets(m, size)
        assert [c for b in bs for c in b.chunks] == m.chunks
        assert all(b.size <= max(size, CHUNK) for b in bs)
        assert sum(b.size for b in bs) == m.total_bytes


def test_auto_transport_only_for_gpu_members_in_the_trainers_network() -> None:
    gpu = Site("aws", "us-east-1", cuda=True)
    assert suits(gpu, [gpu, gpu], one_host=False)
    assert not suits(gpu, [gpu, Site("aws", "us-west-2", cuda=True)], one_host=False)
    assert not suits(gpu, [gpu, Site("gcp", "us-east-1", cuda=True)], one_host=False)
    assert not suits(gpu, [gpu, Site("aws", "us-east-1", cuda=False)], one_host=False)
    assert not suits(gpu, [], one_host=False)
    local_cpu = Site("local", None, cuda=False)
    assert not suits(local_cpu, [local_cpu], one_host=True)  # CPU CI stays on HTTP
    local_gpu = Site("local", None, cuda=True)
    assert suits(local_gpu, [local_gpu], one_host=True)
    # on one host the members are in the trainer's network whatever they report
    assert suits(local_gpu, [Site(None, None, cuda=True)], one_host=True)
    assert not suits(local_gpu, [Site(None, None, cuda=True)], one_host=False)
    assert backend_for(gpu, [gpu], one_host=False) == "nccl"
    assert backend_for(local_cpu, [local_cpu], one_host=True) == "gloo"
    assert backend_for(local_gpu, [local_gpu], one_host=True) == "gloo"  # one machine: ranks would share a GPU
    assert backend_for(gpu, [gpu, Site("aws", "us-east-1", cuda=False)], one_host=False) == "gloo"


def test_the_trainer_broadcasts_to_remote_engines_only_where_auto_allows() -> None:
    pub = WeightPublisher()

    def transport(setting: str, site: Site, one_host: bool = False) -> TorchBroadcast | None:
        """The trainer's transport for `setting`: the broadcast, or None for the pull."""
        t = trainer_transport(TrainerEnd(setting=setting, publisher=pub, site=site, one_host=one_host))
        return t if isinstance(t, TorchBroadcast) else None

    gpu_trainer = Site("aws", "us-east-1", cuda=True)
    east = Receiver("w1", "spot", cuda=True, cloud="aws", region="us-east-1")
    reserved = Receiver("r", "reserved", cuda=True, cloud="aws", region="us-east-1")
    west = Receiver("w2", "spot", cuda=True, cloud="aws", region="us-west-2")
    unknown = Receiver("w3", "spot", cuda=True)  # a worker that did not say where it runs
    auto = transport("auto", gpu_trainer)
    assert auto is not None
    assert auto.decide([east, reserved]) == ([east], "nccl")  # the reserved engine maps memory instead
    assert auto.decide([east, west]) is None
    assert auto.decide([east, unknown]) is None
    assert auto.decide([reserved]) is None
    forced = transport("torch", gpu_trainer)
    assert forced is not None and forced.decide([east, unknown]) == ([east, unknown], "nccl")
    assert transport("http", gpu_trainer) is None  # the pull: nothing is broadcast
    # the local provider: its workers share the trainer's machine, whatever they report; gloo
    local = transport("auto", Site("local", None, cuda=True), one_host=True)
    assert local is not None and local.decide([unknown]) == ([unknown], "gloo")
    cpu_local = transport("auto", Site("local", None, cuda=False), one_host=True)
    assert cpu_local is not None and cpu_local.decide([Receiver("w", "spot", cuda=False)]) is None


def test_a_worker_receives_into_its_store_and_pulls_when_the_broadcast_fails(origin: Origin) -> None:
    """WeightNode.pull (the agent's path): by broadcast into the store it serves peers from, and over
    HTTP when the broadcast cannot happen (here: its rendezvous is gone)."""
    import aiohttp

    from rlboost.weights.peer_server import WeightNode
    from rlboost.weights.pull import PullOptions

    v = origin.manifest.version
    transfer = Transfer(origin.manifest, ["w1"], fast())
    plan = transfer.plan.model_dump(mode="json")
    offer = Offer(transport="torch", plan=plan)
    sender, box = send_in_thread(transfer, origin.buffer())

    async def by_broadcast() -> tuple[dict, PullStats]:
        async with aiohttp.ClientSession() as s:
            node = WeightNode(PullOptions(token="tok", peer_id="w1"), serve=None)
            got = await node.pull(origin.url, v, s, offer=offer)
            held = node.store.latest_complete()
            assert held is not None and held.manifest.version == v and node.offers_taken == 1
            assert node.last is not None
            await node.close()
            return {k: t.clone() for k, t in got.items()}, node.last

    got, st = asyncio.run(asyncio.wait_for(by_broadcast(), 60))
    sender.join(60)
    transfer.close()
    assert_same(got, big_model())
    assert st.mode == "broadcast"
    assert box[0].delivered == ["w1"] and origin.pub.counters.full_bytes == 0

    dead = Offer(transport="torch", plan={**plan, "timeout_s": 1.0})  # the same plan, its store closed: no rendezvous

    async def fallback() -> tuple[dict, int]:
        async with aiohttp.ClientSession() as s:
            node = WeightNode(PullOptions(token="tok", peer_id="w1"), serve=None)
            got = await node.pull(origin.url, v, s, offer=dead)
            await node.close()
            return {k: t.clone() for k, t in got.items()}, node.offers_failed

    got, fallbacks = asyncio.run(asyncio.wait_for(fallback(), 60))
    assert_same(got, big_model())
    assert fallbacks == 1 and origin.pub.counters.full_bytes == origin.manifest.total_bytes
