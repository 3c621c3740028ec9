"""The versions a worker holds: the one being pulled and the last complete one.

`WeightStore` holds the version being pulled (its verified chunks are served to peers as they land,
so a swarm of newcomers trades chunks before any of them is complete) and the last complete version
(the base for a delta, and what newcomers fetch from this worker). The pull (rlboost/weights/pull.py)
and the other transports (rlboost/weights/transports/) write into it; the peer server
(rlboost/weights/peer_server.py) serves it. It imports none of them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from rlboost.contracts.weight_manifest import ChunkInfo, Manifest
from rlboost.weights.buffers import HostBuffer


@dataclass
class Held:
    manifest: Manifest
    buf: HostBuffer
    have: set[int] = field(default_factory=set)
    complete: bool = False


class WeightStore:
    """Versions this worker holds. Thread-safe: fetch threads mark chunks, the loop serves them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, Held] = {}
        self._spare: list[HostBuffer] = []  # paged-in buffers: of dropped versions, or reserved ahead

    def buffer(self, size: int) -> HostBuffer:
        """A buffer for the next pull: a recycled one when it fits (first-touch page faults cost
        about as much as the transfer itself on a busy host), else a new one."""
        with self._lock:
            for b in self._spare:
                if b.size == size and b.sending == 0:
                    self._spare.remove(b)
                    return b
        return HostBuffer(size, shareable=False)

    def has_spare(self, size: int) -> bool:
        with self._lock:
            return any(b.size == size for b in self._spare)

    def reserve(self, size: int) -> None:
        """Allocate and page in a receive buffer ahead of a pull (on a thread): at boot while the
        engine builds, and after each pull for the next one. The pull then lands in memory that is
        already mapped: first-touch faults cost as much as the transfer on the VMs measured here."""
        buf = HostBuffer(size, shareable=False).page_in()
        with self._lock:
            self._keep_spare(buf)

    def _keep_spare(self, buf: HostBuffer) -> None:  # under the lock
        self._spare = [*self._spare, buf][-2:]

    def begin(self, m: Manifest, buf: HostBuffer) -> Callable[[int], None]:
        held = Held(m, buf)
        with self._lock:
            old = self._held.get(m.version)
            if old is not None and old.buf is not buf:
                self._keep_spare(old.buf)
            self._held[m.version] = held

        def mark(i: int) -> None:
            with self._lock:
                held.have.add(i)

        return mark

    def complete(self, version: int) -> None:
        """`version` is whole: it becomes the one served and the delta base; older ones go."""
        with self._lock:
            held = self._held.get(version)
            if held is None:
                return
            held.complete = True
            for v in [v for v, h in self._held.items() if v != version and (h.complete or v < version)]:
                self._keep_spare(self._held.pop(v).buf)  # reused only once no chunk of it is being sent

    def abandon(self, version: int) -> None:
        with self._lock:
            h = self._held.get(version)
            if h is not None and not h.complete:
                self._keep_spare(self._held.pop(version).buf)

    def base_for(self, m: Manifest) -> Held | None:
        """A complete held version laid out like `m`: a delta from it can rebuild `m`."""
        with self._lock:
            cands = [h for v, h in self._held.items() if h.complete and v < m.version]
        for h in sorted(cands, key=lambda h: -h.manifest.version):
            if h.manifest.tensors == m.tensors and h.manifest.chunk_bytes == m.chunk_bytes:
                return h
        return None

    def latest_complete(self) -> Held | None:
        with self._lock:
            done = [h for h in self._held.values() if h.complete]
        return max(done, key=lambda h: h.manifest.version) if done else None

    # ChunkSource, for the routes
    def manifest(self, version: int) -> Manifest | None:
        with self._lock:
            h = self._held.get(version)
        return h.manifest if h else None

    def chunk_buffer(self, version: int, index: int) -> tuple[ChunkInfo, HostBuffer] | None:
        with self._lock:
            h = self._held.get(version)
            if h is None or index not in h.have:
                return None
        return h.manifest.chunks[index], h.buf
