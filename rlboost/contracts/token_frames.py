"""Binary token frames: the hot path of the protocol (worker -> coordinator), columnar and vectorised.

A JSON `tokens` frame costs a parse and a model object per chunk; at a thousand workers that is what
bounds the coordinator. A binary frame carries the same content as columns that numpy reads in place:

    magic   4s   b"RBT1"
    version u32  weight version of every token in the frame
    k       u32  number of chunks
    n       u32  number of tokens (sum of counts)
    handles u32[k]  the request handle the coordinator gave in `generate` (GenSpec.handle)
    offsets u32[k]  response position of each chunk's first token
    counts  u32[k]
    ids     u32[n]  token ids (< 2**31)
    lps     f64[n]  logprobs (float64: the same values as the JSON path)

All little-endian. `decode` validates sizes and ranges (the same caps as the JSON path) and raises
FrameError; control messages stay JSON.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"RBT1"
_HEADER = struct.Struct("<4sIII")
MAX_CHUNKS = 100_000
MAX_TOKENS = 1 << 20


class FrameError(ValueError):
    pass


@dataclass(frozen=True)
class TokenColumns:
    version: int
    handles: np.ndarray  # uint32[k]
    offsets: np.ndarray  # uint32[k]
    counts: np.ndarray  # uint32[k]
    ids: np.ndarray  # uint32[n]
    lps: np.ndarray  # float64[n]


def encode(version: int, handles, offsets, counts, ids, lps) -> bytes:
    h = np.ascontiguousarray(handles, dtype="<u4")
    o = np.ascontiguousarray(offsets, dtype="<u4")
    c = np.ascontiguousarray(counts, dtype="<u4")
    i = np.ascontiguousarray(ids, dtype="<u4")
    lp = np.ascontiguousarray(lps, dtype="<f8")
    if not (h.shape == o.shape == c.shape) or i.shape != lp.shape or int(c.sum()) != i.shape[0]:
        raise FrameError("column lengths do not agree")
    return b"".join((_HEADER.pack(MAGIC, version, h.shape[0], i.shape[0]), h.data, o.data, c.data, i.data, lp.data))


def decode(data: bytes | bytearray | memoryview) -> TokenColumns:
    if len(data) < _HEADER.size:
        raise FrameError("frame shorter than its header")
    magic, version, k, n = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise FrameError("bad magic (not a token frame)")
    if k > MAX_CHUNKS or n > MAX_TOKENS:
        raise FrameError(f"frame too large ({k} chunks, {n} tokens)")
    if len(data) != _HEADER.size + 12 * k + 12 * n:
        raise FrameError(f"frame size {len(data)} does not match {k} chunks and {n} tokens")
    off = _HEADER.size
    handles = np.frombuffer(data, "<u4", k, off)
    offsets = np.frombuffer(data, "<u4", k, off + 4 * k)
    counts = np.frombuffer(data, "<u4", k, off + 8 * k)
    off += 12 * k
    ids = np.frombuffer(data, "<u4", n, off)
    lps = np.frombuffer(data, "<f8", n, off + 4 * n)
    if int(counts.sum(dtype=np.int64)) != n:
        raise FrameError("chunk counts do not add up to the token count")
    if n and int(ids.max()) >= 1 << 31:
        raise FrameError("token id out of range")
    if version >= 1 << 31 or (k and int(offsets.max()) >= 1 << 31):
        raise FrameError("version or offset out of range")
    if n and not np.isfinite(lps).all():
        raise FrameError("logprob not finite")
    return TokenColumns(version, handles, offsets, counts, ids, lps)
