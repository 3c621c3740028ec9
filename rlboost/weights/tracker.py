"""Swarm tracker: which worker holds which chunks of which version, and who fetches what from origin.

Why a tracker: with N newcomers pulling at once, the trainer's uplink would carry N copies. Every
puller announces what it holds (a bitmap of verified chunks) a few times a second and gets back the
other holders plus a few exclusive *origin grants*: chunks nobody holds yet and nobody is fetching.
So each chunk leaves the trainer about once per version, and the rest flows between peers.

A grant lapses when its holder stops announcing (`lease_s`), so a dead puller costs others at most
that long; a peer reported bad (dead, or serving wrong bytes) leaves the swarm at once. Peers are
plain workers: they are only useful where workers can reach each other (a region or a VPC), so the
swarm is split by the region each puller reports (rlboost/weights/region_fanout.py): a chunk is granted
from the trainer once per region, and peers are offered only within a region.

    POST /v1/weights/{version}/swarm  {"peer_id", "url", "n_chunks", "have" (base64 bitmap),
                                       "want" (grants wanted), "bad" [urls], "done" (bool),
                                       "region" (cloud/region, optional)}
        -> {"peers": [{"url", "have", "region"}], "origin": [chunk indices granted to the caller]}
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlboost.weights.region_fanout import REGION_PATTERN, RegionView, group_of, may_trade, origin_grants

MAX_CHUNKS = 1 << 22


class Announce(BaseModel):
    model_config = ConfigDict(extra="forbid")
    peer_id: str = Field(min_length=1, max_length=128)
    # None: pulls but does not serve. Relayed to other pullers, so it must be an http(s) base URL
    # (optionally pinned: #sha256=<hex>, see rlboost/weights/peer_server.py), never anything they cannot parse
    url: str | None = Field(
        default=None, max_length=512, pattern=r"^https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/-]*)?(#sha256=[0-9a-f]{64})?$"
    )
    n_chunks: int = Field(ge=0, le=MAX_CHUNKS)
    have: str = Field(default="", max_length=MAX_CHUNKS // 6 + 8)
    want: int = Field(default=0, ge=0, le=4096)
    bad: list[str] = Field(default_factory=list, max_length=256)
    done: bool = False
    region: str | None = Field(default=None, pattern=REGION_PATTERN)  # None: the region-blind group


def encode_bits(bits: Iterable[int], n: int) -> str:
    b = bytearray((n + 7) // 8)
    for i in bits:
        b[i >> 3] |= 1 << (i & 7)
    return base64.b64encode(bytes(b)).decode()


def decode_bits(s: str, n: int) -> set[int]:
    raw = base64.b64decode(s.encode(), validate=True) if s else b""
    if len(raw) > (n + 7) // 8:
        raise ValueError("bitmap longer than the chunk count")
    return {i * 8 + k for i, byte in enumerate(raw) if byte for k in range(8) if byte >> k & 1 and i * 8 + k < n}


@dataclass
class _Peer:
    url: str | None
    have: set[int]
    done: bool
    seen: float
    group: str  # the swarm group (region) it trades in
    region: str | None  # as reported


@dataclass
class _Swarm:
    n_chunks: int
    peers: dict[str, _Peer] = field(default_factory=dict)
    # (group, chunk) -> (peer_id, expiry): a chunk is fetched from the trainer once per region
    leases: dict[tuple[str, int], tuple[str, float]] = field(default_factory=dict)
    granted: dict[str, int] = field(default_factory=dict)  # origin grants per group


class SwarmTracker:
    """`by_region=False` is the region-blind swarm (one group for all): the benchmark's baseline."""

    def __init__(
        self,
        lease_s: float = 3.0,
        peer_ttl_s: float = 8.0,
        clock: Callable[[], float] = time.monotonic,
        by_region: bool = True,
    ) -> None:
        self.lease_s, self.peer_ttl_s, self.clock, self.by_region = lease_s, peer_ttl_s, clock, by_region
        self._lock = threading.Lock()
        self._swarms: dict[int, _Swarm] = {}
        self._banned: dict[str, float] = {}  # url -> until; reported dead or lying

    def announce(self, version: int, a: Announce) -> dict:
        now = self.clock()
        have = decode_bits(a.have, a.n_chunks)
        with self._lock:
            sw = self._swarms.get(version)
            if sw is None or sw.n_chunks != a.n_chunks:
                sw = self._swarms[version] = _Swarm(a.n_chunks)
            for url in a.bad:  # a bad peer leaves every swarm for a while
                self._banned[url] = now + 4 * self.peer_ttl_s
                for s in self._swarms.values():
                    for pid in [p for p, peer in s.peers.items() if peer.url == url]:
                        self._drop(s, pid)
            self._expire(sw, now)
            url = a.url if a.url and self._banned.get(a.url, 0) <= now else None
            group = group_of(a.region, by_region=self.by_region)
            me = sw.peers[a.peer_id] = _Peer(url, have, a.done or len(have) == a.n_chunks, now, group, a.region)
            for key in list(sw.leases):  # leases the caller now holds are done; its others are renewed
                pid, _ = sw.leases[key]
                if pid == a.peer_id:
                    if key[1] in have or key[0] != group:  # (a puller that moved group keeps none)
                        del sw.leases[key]
                    else:
                        sw.leases[key] = (pid, now + self.lease_s)
            mates = [p for p in sw.peers.values() if p.group == group]
            view = RegionView(
                n_chunks=sw.n_chunks,
                held=frozenset().union(*(p.have for p in mates if p.url is not None or p is me)),
                leased={c: pid for (g, c), (pid, _) in sw.leases.items() if g == group},
                pullers=sum(1 for p in mates if not p.done and now - p.seen <= self.lease_s),
            )
            grants = origin_grants(view, a.peer_id, a.want)
            for c in grants:
                if (group, c) not in sw.leases:
                    sw.granted[group] = sw.granted.get(group, 0) + 1
                sw.leases[(group, c)] = (a.peer_id, now + self.lease_s)
            peers = [
                {"url": p.url, "have": encode_bits(p.have, sw.n_chunks), "region": p.region}
                for pid, p in sw.peers.items()
                if pid != a.peer_id and p.url and p.have and may_trade(group, p.group)
            ]
        return {"peers": peers, "origin": grants}

    def versions_in_use(self) -> set[int]:
        """Versions that a live worker is still pulling: garbage collection keeps them."""
        now = self.clock()
        with self._lock:
            out = set()
            for v, sw in self._swarms.items():
                self._expire(sw, now)
                if any(not p.done for p in sw.peers.values()):
                    out.add(v)
            return out

    def forget(self, version: int) -> None:
        with self._lock:
            self._swarms.pop(version, None)

    def stats(self) -> dict:
        with self._lock:
            return {
                str(v): {
                    "peers": sum(1 for p in sw.peers.values() if p.url),
                    "complete": sum(1 for p in sw.peers.values() if p.done),
                    "origin_grants": sum(sw.granted.values()),
                    # per region: about n_chunks each when every chunk crossed into it once
                    "origin_grants_by_region": dict(sorted(sw.granted.items())),
                }
                for v, sw in sorted(self._swarms.items())
            }

    def _expire(self, sw: _Swarm, now: float) -> None:
        for pid in [pid for pid, p in sw.peers.items() if now - p.seen > self.peer_ttl_s]:
            self._drop(sw, pid)
        for key in [key for key, (_, until) in sw.leases.items() if until < now]:
            del sw.leases[key]

    @staticmethod
    def _drop(sw: _Swarm, pid: str) -> None:
        sw.peers.pop(pid, None)
        for key in [key for key, (p, _) in sw.leases.items() if p == pid]:
            del sw.leases[key]


def add_swarm_route(app: web.Application, tracker: SwarmTracker, on_change: Callable[[], None] | None = None) -> None:
    async def swarm(request: web.Request) -> web.Response:
        raw = request.match_info.get("version", "")
        if not raw.isdigit() or len(raw) > 19:
            return web.json_response({"error": "version must be a non-negative integer"}, status=400)
        try:
            a = Announce.model_validate_json(await request.read())
            view = tracker.announce(int(raw), a)
        except (ValidationError, ValueError) as e:
            return web.json_response({"error": f"bad announce: {e}"[:500]}, status=400)
        if a.done and on_change is not None:
            on_change()  # a finished pull may let an old version go
        return web.json_response(view)

    app.router.add_post("/v1/weights/{version}/swarm", swarm)
