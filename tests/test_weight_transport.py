"""The weight-transport interface and its factory (rlboost/weights/transports/): a transport defined
and registered here, outside the package, is picked for the job that names it and for the worker
it is offered to, and carries a version end to end in this process; an offer a worker cannot take
falls back to the pull."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import aiohttp
import pytest
import torch

from rlboost.contracts import digest
from rlboost.contracts import protocol as P
from rlboost.contracts.spec import WeightsSpec
from rlboost.contracts.transport_names import transport_names
from rlboost.contracts.weight_manifest import Manifest
from rlboost.weights.buffers import tensor_views
from rlboost.weights.peer_server import WeightNode
from rlboost.weights.publisher import PublishOptions, WeightPublisher
from rlboost.weights.pull import PullOptions
from rlboost.weights.transports import (
    AUTO,
    BUILTIN,
    TRANSPORTS,
    Fetch,
    Receiver,
    Site,
    TrainerEnd,
    TransportError,
    UnknownTransportError,
    WeightTransport,
    register_transport,
    trainer_transport,
    unregister_transport,
    worker_transport,
)
from testkit.weight_origin import Origin
from tests.test_weights import assert_same, model
from tests.torch_threads import one_thread  # noqa: F401 - fixture

WIRE: dict[str, tuple[Manifest, bytes]] = {}  # the toy's "network": what its trainer end sent, by key


class ToyTransport(WeightTransport):
    """Hands each version's bytes over in this process's memory."""

    name = "toy"

    async def publish(self, version: int, receivers: Sequence[Receiver]) -> dict[str, P.Offer]:
        pub = self.end.publisher
        m = await pub.wait_manifest(version)
        got = pub.chunk_buffer(version, 0)
        assert m is not None and got is not None
        WIRE[f"v{version}"] = (m, bytes(got[1].view))
        self.carried(version, len(receivers), 0)
        return {r.id: self.offer({"key": f"v{version}"}) for r in receivers}

    async def fetch(self, job: Fetch, plan: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        sent = WIRE.get(str(plan.get("key")))
        if sent is None:
            raise TransportError(f"nothing sent under {plan.get('key')!r}")
        m, data = sent
        buf = job.store.buffer(m.total_bytes)
        mark = job.store.begin(m, buf)
        buf.view[:] = data
        for c in m.chunks:  # a transport checks what it received against the manifest
            if digest.hexdigest(m.digest, buf.view[c.offset : c.offset + c.size]) != c.digest:
                job.store.abandon(job.version)
                raise TransportError(f"chunk {c.index} arrived corrupt")
            mark(c.index)
        job.store.complete(job.version)
        job.stats.mode, job.stats.total_bytes = "toy", m.total_bytes
        return tensor_views(buf.view, m.tensors)


@pytest.fixture
def toy() -> Iterator[type[ToyTransport]]:
    register_transport(ToyTransport)
    yield ToyTransport
    unregister_transport(ToyTransport.name)
    WIRE.clear()


def trainer_end(setting: str, pub: WeightPublisher) -> TrainerEnd:
    return TrainerEnd(setting=setting, publisher=pub, site=Site("local", None, cuda=False), one_host=True)


def test_a_transport_registered_from_outside_carries_a_version_end_to_end(toy: type[ToyTransport]) -> None:
    tensors = model(seed=3)
    pub = WeightPublisher(PublishOptions(chunk_bytes=4096))
    pub.publish(3, tensors)
    sender = trainer_transport(trainer_end("toy", pub))  # the job's weights.transport names it
    assert isinstance(sender, toy)

    async def run() -> tuple[dict[str, torch.Tensor], WeightNode]:
        offers = await sender.publish(3, [Receiver("w1", "spot", cuda=False)])
        # as the coordinator sends it and the agent reads it
        msg = P.coord_msg.validate_json(P.NewVersion(version=3, offer=offers["w1"]).model_dump_json())
        assert isinstance(msg, P.NewVersion) and msg.offer is not None and msg.offer.transport == "toy"
        node = WeightNode(PullOptions(token="tok", peer_id="w1"), serve=None)
        async with aiohttp.ClientSession() as session, node:
            # nothing listens at this trainer URL: the version can only come through the toy
            got = await node.pull("http://127.0.0.1:9", msg.version, session, offer=msg.offer)
            return {k: t.clone() for k, t in got.items()}, node

    got, node = asyncio.run(asyncio.wait_for(run(), 60))
    assert_same(got, tensors)
    held = node.store.latest_complete()
    assert held is not None and held.manifest.version == 3  # in the store: served to peers, the next delta's base
    assert node.offers_taken == 1 and node.offers_failed == 0 and node.last is not None and node.last.mode == "toy"
    assert sender.stats() == {
        "transport": "toy",
        "versions": 1,
        "delivered": 1,
        "missed": 0,
        "last": {"version": 3, "delivered": 1, "missed": 0},
    }
    assert pub.counters.total == 0  # nothing went over HTTP


def test_an_offer_the_worker_cannot_take_falls_back_to_the_pull(toy: type[ToyTransport]) -> None:
    tensors = model(seed=4)
    origin = Origin(tensors)
    v = origin.manifest.version

    async def pull(offer: P.Offer) -> tuple[dict[str, torch.Tensor], WeightNode]:
        node = WeightNode(PullOptions(token="tok", peer_id="w1", swarm=False), serve=None)
        async with aiohttp.ClientSession() as session, node:
            got = await node.pull(origin.url, v, session, offer=offer)
            return {k: t.clone() for k, t in got.items()}, node

    try:
        for offer, why in (
            (P.Offer(transport="toy", plan={"key": "never-sent"}), "nothing sent"),
            (P.Offer(transport="nonesuch"), "unknown transport 'nonesuch'"),  # a transport this worker lacks
        ):
            got, node = asyncio.run(asyncio.wait_for(pull(offer), 60))
            assert_same(got, tensors)
            assert node.offers_taken == 0 and node.offers_failed == 1 and why in node.last_fallback
            assert node.last is not None and node.last.mode == "full"
        assert origin.pub.counters.full_bytes == 2 * origin.manifest.total_bytes
    finally:
        origin.close()


def test_the_factory_picks_by_name_and_registration_is_checked(toy: type[ToyTransport]) -> None:
    pub = WeightPublisher()
    assert type(trainer_transport(trainer_end("http", pub))).name == "http"
    assert type(trainer_transport(trainer_end(AUTO, pub))).name == "torch"  # where it suits; else everyone pulls
    assert isinstance(worker_transport("toy"), toy) and worker_transport("toy").trainer is None
    with pytest.raises(RuntimeError, match="made for a worker"):
        asyncio.run(worker_transport("toy").publish(0, []))
    with pytest.raises(UnknownTransportError, match=r"unknown transport 'nccl' \(known: auto, http, torch, toy\)"):
        trainer_transport(trainer_end("nccl", pub))
    with pytest.raises(ValueError, match="registered already"):
        register_transport(type("OtherToy", (ToyTransport,), {}))
    with pytest.raises(ValueError, match="a name of its own"):
        register_transport(type("Auto", (ToyTransport,), {"name": AUTO}))
    register_transport(toy)  # the same class again: nothing changes
    assert TRANSPORTS["toy"] is toy


def test_the_job_file_names_the_builtin_transports() -> None:
    """`weights.transport` in the job file (rlboost/contracts/transport_names.py) knows what the factory knows."""
    assert set(transport_names()) == {AUTO, *(c.name for c in BUILTIN)}


def test_a_job_file_may_name_a_transport_registered_from_outside(toy: type[ToyTransport]) -> None:
    """Registered, `weights.transport: toy` validates; unregistered, it is an error naming the known ones."""
    assert WeightsSpec(transport="toy").transport == "toy"
    unregister_transport("toy")
    with pytest.raises(ValueError, match="invalid value 'toy'; input should be 'auto', 'http' or 'torch'"):
        WeightsSpec(transport="toy")
