"""Chains and jumps: a worker several versions behind pulls version v as one composed delta.

The trainer keeps each version's delta from the one before (small after a real step: the changed
elements only) instead of whole old versions. Every delta can be taken back (a dense XOR is its own
inverse, a sparse difference is subtracted), so for a worker holding base b the trainer rebuilds
b's chunk from v's by undoing the chain v..b+1, and encodes v against it once
(rlboost/weights/delta_codec.py, the smaller of sparse and dense). Each chunk goes the
cheaper way: a chunk whose composed delta is no smaller than the chunk itself goes in full
(DeltaChunk size 0 while its digest differs between the two manifests, so the worker fetches it in
full, from peers or the trainer), and one with no net change is not sent at all.

The history is bounded by a byte budget (the oldest deltas go first): it decides how far behind a
worker may be and still get a delta. The trainer says how far: `oldest_base` in /v1/weights/latest
and in the weights status.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from rlboost.contracts.digest import hexdigest
from rlboost.contracts.weight_manifest import CODEC, CODEC_SPARSE, DENSE, DeltaChunk, DeltaManifest, Encoding, Manifest
from rlboost.weights import delta_codec

Step = tuple[DeltaManifest, list[bytes | None]]  # a version's delta from the one before
MapFn = Callable[[Callable[[Any], Any], Iterable[Any]], Iterable[Any]]


def compose_chunk(
    steps: list[tuple[bytes, Encoding]], newest: memoryview, width: int, sparse: bool
) -> tuple[Encoding, bytes] | None:
    """One chunk's delta from the chain's base to `newest` (that chunk in the chain's last version),
    given the chain's per-step deltas, oldest first. None: no net change. Raises ValueError when a
    step's payload is malformed (the caller offers no delta then)."""
    base = bytearray(newest)
    view = memoryview(base)
    for payload, encoding in reversed(steps):
        delta_codec.decode_chunk(view, payload, view, width, encoding, undo=True)
    if sparse:
        return delta_codec.encode_best(view, newest, width)
    p = delta_codec.encode(view, newest, width)
    return (DENSE, p) if p is not None else None


class DeltaHistory:
    """Each version's delta from the one before, newest first, while they fit `budget_bytes`."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._steps: dict[int, Step] = {}  # version -> its delta from version - 1

    def add(self, step: Step) -> None:
        dm = step[0]
        if dm.base != dm.version - 1:
            raise ValueError(f"a history step is a delta from the version before, not {dm.base} -> {dm.version}")
        with self._lock:
            if self._steps and max(self._steps) != dm.base:
                self._steps.clear()  # a gap (a version without a delta): older bases cannot reach past it
            self._steps[dm.version] = step
            while self._steps and self._bytes() > self.budget_bytes:
                del self._steps[min(self._steps)]

    def oldest_base(self, version: int) -> int | None:
        """The oldest version from which `version` can be composed (None: not even version - 1)."""
        with self._lock:
            v = version
            while v in self._steps:
                v -= 1
            return v if v < version else None

    def stats(self) -> dict:
        with self._lock:
            return {
                "bytes_by_version": {str(v): _size(self._steps[v]) for v in sorted(self._steps)},
                "bytes": self._bytes(),
                "budget_bytes": self.budget_bytes,
            }

    def compose(self, m: Manifest, data: memoryview, base: int, sparse: bool, map_fn: MapFn = map) -> Step | None:
        """Version m.version (its bytes: `data`) as one delta from `base`, or None when the chain does
        not reach back to `base` (the worker then pulls in full)."""
        with self._lock:
            chain = [self._steps.get(v) for v in range(base + 1, m.version + 1)]
        if base >= m.version or any(s is None for s in chain) or any(len(s[0].chunks) != len(m.chunks) for s in chain):  # type: ignore[index]
            return None
        steps: list[Step] = chain  # type: ignore[assignment]

        def one(i: int) -> tuple[Encoding, bytes] | None:
            parts = [(p[i], dm.chunks[i].encoding) for dm, p in steps if p[i] is not None]
            c = m.chunks[i]
            newest = data[c.offset : c.offset + c.size]
            return compose_chunk(parts, newest, steps[-1][0].chunks[i].shuffle, sparse) if parts else None

        try:
            encoded = list(map_fn(one, range(len(m.chunks))))
        except ValueError:
            return None
        # where the composed delta is no smaller than the chunk, the chunk goes in full
        encoded = [e if e is None or len(e[1]) < m.chunks[i].size else None for i, e in enumerate(encoded)]
        payloads: list[bytes | None] = [e[1] if e else None for e in encoded]
        chunks = [
            DeltaChunk(
                index=i,
                size=len(e[1]) if e else 0,
                digest=hexdigest(m.digest, e[1]) if e else None,
                shuffle=steps[-1][0].chunks[i].shuffle,
                encoding=e[0] if e else DENSE,
            )
            for i, e in enumerate(encoded)
        ]
        dm = DeltaManifest(
            version=m.version,
            base=base,
            codec=CODEC_SPARSE if sparse else CODEC,
            total_bytes=sum(d.size for d in chunks),
            chunks=chunks,
        )
        return dm, payloads

    def _bytes(self) -> int:
        return sum(_size(step) for step in self._steps.values())


def _size(step: Step) -> int:
    return sum(len(p) for p in step[1] if p)
