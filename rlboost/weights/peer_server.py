"""A worker's side of peer fan-out: hold pulled weights, serve them to other workers, announce them.

The `WeightStore` (rlboost/weights/store.py) holds the version being pulled (its verified chunks are
served as they land, so a swarm of newcomers trades chunks before any of them is complete) and the
last complete version (the base for a delta, and what newcomers fetch from this worker).
`PeerServer` serves the store with the same routes as the trainer, behind the same job token, as
`ServeOptions` say. `WeightNode` is what the agent uses: it starts the server, gets each version
into the store (by the transport the trainer offered, rlboost/weights/transports/, else by the pull,
rlboost/weights/pull.py, with the node's `PullOptions`), and keeps announcing what it holds.

Reachability: a worker advertises http://RLBOOST_PEER_HOST:port (bind host, default 127.0.0.1;
RLBOOST_PEER_URL overrides what is advertised); in a TLS job it serves https with its own self-signed
certificate and advertises https://host:port#sha256=<fingerprint>, which pullers pin (the URL reaches
them from the tracker over the trainer's pinned connection). Workers dial home, so nothing else needs to reach
them; peers do. On clouds, bind to the private address: a worker reports its region
(RLBOOST_CLOUD/RLBOOST_REGION, set by the controller) and the tracker offers it peers of that
region only; where they still cannot connect, pullers drop them and fetch from the trainer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from rlboost.contracts.env_names import Env
from rlboost.contracts.protocol import Offer
from rlboost.weights.pull import PullOptions, PullStats
from rlboost.weights.pull_control import WeightPullError, get_manifest
from rlboost.weights.region_fanout import region_key
from rlboost.weights.serving import RateLimit, ServeCounters, add_chunk_routes
from rlboost.weights.store import WeightStore
from rlboost.weights.tracker import encode_bits
from rlboost.weights.transports import (
    PULL,
    Fetch,
    TransportError,
    UnknownTransportError,
    WeightTransport,
    worker_transport,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger("rlboost.weights")


def _auth(token: str) -> Callable:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        got = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(got, expected):
            return web.json_response({"error": "missing or wrong job token"}, status=401)
        return await handler(request)

    return check


@dataclass(frozen=True)
class ServeOptions:
    """How a worker serves the weights it holds to other workers."""

    host: str = "127.0.0.1"  # bind address
    port: int = 0  # 0: any free port
    advertise: str | None = None  # the URL the tracker relays to pullers (None: scheme://host:port)
    tls: bool = False  # a TLS job: https with a self-signed certificate, pinned through the URL
    max_uploads: int = 4  # chunk bodies sent at once; beyond that, 429 (the puller asks another holder)
    egress_bps: float | None = None  # benchmarks: an emulated NIC


class PeerServer:
    def __init__(self, store: WeightStore, token: str, opts: ServeOptions | None = None) -> None:
        self.store, self.token = store, token
        self.opts = opts if opts is not None else ServeOptions()
        self._tls_dir: tempfile.TemporaryDirectory | None = None
        self.counters = ServeCounters()
        self.limit = RateLimit(self.opts.egress_bps) if self.opts.egress_bps else None
        self._runner: web.AppRunner | None = None
        self.url: str | None = None

    async def start(self) -> str:
        """Bind and serve; returns the URL to advertise."""
        host, port, advertise = self.opts.host, self.opts.port, self.opts.advertise
        app = web.Application(middlewares=[_auth(self.token)])
        add_chunk_routes(app, self.store, self.counters, self.limit, self.opts.max_uploads)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        ssl_ctx, pin = None, ""
        if self.opts.tls:  # a TLS job: peers get this worker's own self-signed certificate, pinned via the URL
            from rlboost.contracts.tls import make_self_signed, server_context

            self._tls_dir = tempfile.TemporaryDirectory(prefix="rlboost-peer-tls-")
            files = make_self_signed(Path(self._tls_dir.name), [host if host not in ("0.0.0.0", "::") else "127.0.0.1"])
            ssl_ctx, pin = server_context(files.cert, files.key), f"#sha256={files.fingerprint}"
        await web.TCPSite(self._runner, host, port, ssl_context=ssl_ctx).start()
        bound_host, bound_port = self._runner.addresses[0][:2]
        url_host = bound_host if bound_host not in ("0.0.0.0", "::") else "127.0.0.1"
        scheme = "https" if ssl_ctx else "http"
        self.url = (advertise.split("#", 1)[0] + pin) if advertise else f"{scheme}://{url_host}:{bound_port}{pin}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._tls_dir is not None:
            self._tls_dir.cleanup()
            self._tls_dir = None


class WeightNode:
    """The agent's weight transfer: pull through the store, serve peers, announce, report."""

    def __init__(
        self, pull: PullOptions, serve: ServeOptions | None = ServeOptions(), *, seed_every_s: float = 2.0
    ) -> None:
        """`pull`: how every version is pulled; it must name the job token and this worker's peer
        id (its `peer_url` and `as_tensors` are set per pull). `serve`: how verified chunks are
        served to peers (None: not at all)."""
        if pull.token is None or pull.peer_id is None:
            raise ValueError("a weight node needs the job token and its peer id (PullOptions.token, .peer_id)")
        self.opts = pull
        self.token, self.peer_id = pull.token, pull.peer_id
        self.store = WeightStore()
        self.server = PeerServer(self.store, self.token, serve) if serve is not None else None
        self.seed_every_s = seed_every_s
        self.last: PullStats | None = None
        self._base_url: str | None = None
        self._seeder: asyncio.Task | None = None
        self._reserving: asyncio.Future | None = None
        self._preparing: asyncio.Future | None = None
        self.pull_via = worker_transport(PULL)  # every version the trainer offered no other way, and the fallback
        self._transports: dict[str, WeightTransport] = {}  # the worker ends of the transports offered so far
        self.offers_taken = 0  # versions received by the transport the trainer offered (e.g. its broadcast)
        self.offers_failed = 0  # offers that failed here (then pulled over HTTP)
        self.last_fallback = ""  # why the last one failed

    @classmethod
    def from_env(cls, token: str, peer_id: str, kind: str) -> WeightNode:
        env = os.environ
        reserved = kind == "reserved"  # on the trainer's machine: shared memory, nothing to serve
        pull = PullOptions(
            token=token,
            peer_id=peer_id,
            parallel=int(env.get(Env.PULL_PARALLEL, "4")),
            local=env.get(Env.WEIGHTS_LOCAL, "1" if reserved else "0") == "1",
            region=region_key(env.get(Env.CLOUD), env.get(Env.REGION)),
        )
        serve = ServeOptions(
            host=env.get(Env.PEER_HOST, "127.0.0.1"),
            port=int(env.get(Env.PEER_PORT, "0")),
            advertise=env.get(Env.PEER_URL) or None,
            max_uploads=int(env.get(Env.PEER_UPLOADS, "4")),
            tls=bool(env.get(Env.TLS_FINGERPRINT)),  # a TLS job: the job token never crosses in clear
        )
        return cls(pull, serve if env.get(Env.PEER_SERVE, "0" if reserved else "1") == "1" else None)

    async def __aenter__(self) -> WeightNode:
        return self  # the server starts with the first pull

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def peer_url(self) -> str | None:
        return self.server.url if self.server else None

    async def start(self) -> None:
        if self.server is not None and self.server.url is None:
            try:
                await self.server.start()
            except OSError as e:  # serving is an optimisation: pull without it
                log.warning("peer server could not start (%s); not serving weights to peers", e)
                self.server = None

    async def close(self) -> None:
        if self._preparing is not None and not self._preparing.done():
            self._preparing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._preparing
        if self._seeder is not None:
            self._seeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._seeder
        for t in self._transports.values():
            await t.close()
        if self.server is not None:
            await self.server.close()

    async def prepare(self, base_url: str, version: int, session: aiohttp.ClientSession) -> None:
        """Read `version`'s manifest and page in a receive buffer of its size in the background.

        The agent calls this as soon as it knows the version to pull, before building its engine,
        so the buffer's first-touch cost overlaps the engine's start instead of the pull. Failure
        is harmless: the pull allocates its own buffer and reports any real error itself."""
        if self.opts.local or self._reserving is not None:
            return
        try:
            m = await get_manifest(base_url, version, token=self.token, session=session)
        except WeightPullError as e:
            log.info("not preparing a weight buffer: %s", e)
            return
        self._reserving = asyncio.ensure_future(asyncio.to_thread(self.store.reserve, m.total_bytes))

    def prepare_soon(self, base_url: str, version: int, session: aiohttp.ClientSession) -> None:
        """`prepare` as a background task: the caller goes on building its engine at once (a slow
        trainer costs the boot nothing); the first pull waits for it."""
        if self._preparing is None:
            self._preparing = asyncio.ensure_future(self.prepare(base_url, version, session))

    async def pull(
        self,
        base_url: str,
        version: int,
        session: aiohttp.ClientSession,
        as_tensors: bool = True,
        offer: Offer | None = None,
    ) -> dict[str, torch.Tensor]:
        """Get `version`; the tensors are views into the store's buffer, valid until the pull after
        next reuses it (the engine copies them at once). `offer`: the trainer's offer of another
        transport for it (e.g. its torch.distributed broadcast), tried first; when it fails the
        version is pulled as usual."""
        if self._preparing is not None:
            with contextlib.suppress(Exception):
                await self._preparing
            self._preparing = None
        if self._reserving is not None:  # a buffer being paged in: use it rather than a second one
            with contextlib.suppress(Exception):
                await self._reserving
            self._reserving = None
        await self.start()
        self._base_url = base_url
        job = Fetch(
            version=version,
            base_url=base_url,
            member=self.peer_id,
            store=self.store,
            session=session,
            pull=replace(self.opts, peer_url=self.peer_url, as_tensors=as_tensors),
            stats=PullStats(version=version),
        )
        got = await self._by_offer(offer, job) if offer is not None and offer.transport != PULL else None
        if got is not None:
            tensors = got
        else:
            job.stats = PullStats()  # a failed offer's counts are not the pull's
            bar = _ProgressBar(version) if sys.stderr.isatty() else None
            job.on_progress = bar.update if bar else None
            try:
                tensors = await self.pull_via.fetch(job, {})
            finally:
                if bar:
                    bar.close()
        stats = self.last = job.stats
        log.info("pulled weights %s", stats.summary())
        if stats.mode != "local" and not self.store.has_spare(stats.total_bytes):
            # The next pull needs a second buffer (this one stays the delta base and is served to
            # peers): page it in now, while the engine generates, not during that pull.
            self._reserving = asyncio.ensure_future(asyncio.to_thread(self.store.reserve, stats.total_bytes))
        if self.server is not None and stats.mode != "local":
            await self._announce(session)
            if self._seeder is None or self._seeder.done():
                self._seeder = asyncio.create_task(self._seed(session))
        return tensors

    async def _by_offer(self, offer: Offer, job: Fetch) -> dict[str, torch.Tensor] | None:
        """`job.version` by the transport the trainer offered, or None (then pull it) when that fails."""
        t0 = time.monotonic()
        try:
            via = self._transports.get(offer.transport)
            if via is None:
                via = self._transports[offer.transport] = worker_transport(offer.transport)
            tensors = await via.fetch(job, offer.plan)
        except (TransportError, UnknownTransportError) as e:
            self.offers_failed += 1
            self.last_fallback = str(e)
            log.warning("weights v%d: %s transport failed (%s); pulling over HTTP", job.version, offer.transport, e)
            return None
        self.offers_taken += 1
        job.stats.seconds = time.monotonic() - t0
        return tensors

    async def _announce(self, session: aiohttp.ClientSession) -> None:
        held = self.store.latest_complete()
        if held is None or self._base_url is None:
            return
        n = len(held.manifest.chunks)
        body = {
            "peer_id": self.peer_id,
            "url": self.peer_url,
            "n_chunks": n,
            "have": encode_bits(range(n), n),
            "done": True,
            "region": self.opts.region,
        }
        url = f"{self._base_url.rstrip('/')}/v1/weights/{held.manifest.version}/swarm"
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            async with session.post(
                url,
                json=body,
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=aiohttp.ClientTimeout(total=5),
            ) as resp:
                await resp.read()

    async def _seed(self, session: aiohttp.ClientSession) -> None:
        """Keep the tracker's view of this seeder fresh (it forgets silent peers)."""
        while True:
            await asyncio.sleep(self.seed_every_s)
            await self._announce(session)

    def metrics(self) -> dict:
        s = self.last
        return {
            "peer_url": self.peer_url,
            "served_bytes": self.server.counters.total if self.server else 0,
            "offers_taken": self.offers_taken,
            "offers_failed": self.offers_failed,
            "last_pull": None if s is None else {k: getattr(s, k) for k in s.__dataclass_fields__},
        }


class _ProgressBar:
    """A one-line progress bar on an interactive terminal (metrics are logged either way)."""

    def __init__(self, version: int) -> None:
        from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

        self.p = Progress(f"weights v{version}", BarColumn(), DownloadColumn(), TransferSpeedColumn(), transient=True)
        self.task = self.p.add_task("pull", total=None)
        self.p.start()

    def update(self, done: int, total: int) -> None:
        self.p.update(self.task, completed=done, total=total)

    def close(self) -> None:
        self.p.stop()
