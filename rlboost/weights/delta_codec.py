"""Delta transfer: version v against v-1, chunk by chunk, in one of two encodings.

Dense ("xor-shuffle"): old XOR new, byte-shuffled, zstd-compressed. One optimizer step moves each
weight a little, so old XOR new keeps the sign and exponent bytes (and, in bf16, often the whole
value) at zero; grouping byte k of every element together (the "shuffle" of blosc/HDF5) turns those
into long zero runs that zstd squeezes to almost nothing, while the noisy low mantissa bytes stay.

Sparse ("sparse"): only the elements that changed. At a small learning rate most bf16 weights round
to the same value after a step, and zstd still spends bits on every zero run of the dense form; the
sparse form sends the changed elements' positions (uint32 gaps or a bitmap, whichever compresses
smaller) and each changed element's difference from its old value: the new bit pattern minus the old,
as an unsigned integer of the element's width, wrapping, then zigzagged (0, -1, 1, -2 ... as 0, 1, 2,
3 ...). Float bit patterns are ordered by magnitude, so an element that moved by one ulp, the common
case at a small learning rate, differs by +-1: one byte plane of 1s and 2s and the others all zero,
where the XOR with the old value keeps the carry bits of every rounding. The differences go ordered by
the old element's magnitude (the 8 bits after its sign: a float's exponent), because how far a
weight moves in ulps depends on it: a small-lr step moves a large weight by at most one ulp and a
tiny one by many, and zstd codes each run of like differences tightly (on a real 0.5B model's first
step, 0.24 B per changed element, against 0.33 B in position order and 0.45 B as XOR). The decoder
recomputes that order from its own copy of the chunk; the few elements whose magnitude bits the
step itself changed are listed apart (their indices) and go last, so the order is the same whether
the delta is applied to the old chunk or taken back from the new one.

The publisher encodes each changed chunk both ways and sends the smaller (`encode_best`); the
delta manifest records which per chunk (codec CODEC_SPARSE; the codec and encoding names, like the
delta manifest itself, are in rlboost/contracts/weight_manifest.py).

Decoding is exact by construction (XOR is its own inverse; the difference is added back modulo the
element's width) and every rebuilt chunk is checked against the full manifest's digest. Both can be
taken back (`decode_chunk(..., undo=True)`: the old chunk from the new one), which is how deltas of
several steps compose (rlboost/weights/delta_chain.py). A malformed payload raises ValueError before anything
is written out of place: the worker then fetches that chunk in full.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import zstandard

from rlboost.contracts.weight_manifest import DENSE, SPARSE, ChunkInfo, Encoding, TensorInfo, itemsize

# The sparse form must be this much smaller to be chosen: when nearly every element changes the two
# are within bytes of each other, and the dense XOR decodes faster than a scatter of every element.
SPARSE_MARGIN = 0.99
LEVEL = 1  # level 1 already takes the zero runs; higher levels cost CPU on the trainer for ~nothing

# Sparse payload: this header, then the positions, the elements listed apart (values kind _BY_SIZE;
# else none) and the values, each one zstd frame. magic, positions kind, element width, values kind,
# changed elements, positions bytes, elements listed apart, their bytes, values bytes
_HEADER = struct.Struct("<4sBBHIIIII")
_MAGIC = b"RBS2"
_GAPS, _BITMAP = 0, 1  # positions kinds
# values kinds: new XOR old (widths numpy has no integer for); zigzagged (new - old) modulo
# 2**(8 * width), in position order (single bytes) or in the old elements' magnitude order
_XOR, _DIFF, _BY_SIZE = 0, 1, 2
_MAX_SPARSE_BYTES = 1 << 31  # the header's counts and sizes are uint32; chunks are MiBs, far below this


def shuffle_widths(tensors: Sequence[TensorInfo], chunks: Sequence[ChunkInfo]) -> list[int]:
    """Per chunk, the element size of the tensor that covers most of it (the shuffle width)."""
    widths = []
    t = 0
    for c in chunks:
        cover: dict[int, int] = {}
        end = c.offset + c.size
        while t < len(tensors) and tensors[t].offset + tensors[t].nbytes <= c.offset:
            t += 1
        j = t
        while j < len(tensors) and tensors[j].offset < end:
            ti = tensors[j]
            overlap = min(end, ti.offset + ti.nbytes) - max(c.offset, ti.offset)
            if overlap > 0:
                w = itemsize(ti.dtype)
                cover[w] = cover.get(w, 0) + overlap
            j += 1
        widths.append(max(cover, key=lambda w: cover[w]) if cover else 1)
    return widths


def _shuffle(x: np.ndarray, width: int) -> np.ndarray:
    if width == 1 or len(x) % width:
        return x
    return x.reshape(-1, width).T.copy().reshape(-1)


def _unshuffle(x: np.ndarray, width: int) -> np.ndarray:
    if width == 1 or len(x) % width:
        return x
    return x.reshape(width, -1).T.copy().reshape(-1)


def encode(old: memoryview, new: memoryview, width: int = 1, level: int = LEVEL) -> bytes | None:
    """The compressed delta of one chunk, or None when it did not change."""
    if len(old) != len(new):
        raise ValueError("delta needs equal-sized chunks")
    x = np.bitwise_xor(np.frombuffer(old, np.uint8), np.frombuffer(new, np.uint8))
    if not x.any():
        return None
    return zstandard.ZstdCompressor(level=level).compress(_shuffle(x, width).tobytes())


def _decompress(data: bytes | memoryview, want: int) -> np.ndarray:
    """One whole zstd frame that decodes to exactly `want` bytes, else ValueError.

    The frame must state its size up front (our encoder always does): zstandard ignores
    max_output_size when it does, so a forged size would otherwise allocate what it asks for."""
    data = bytes(data)
    try:
        size = zstandard.get_frame_parameters(data).content_size
        if size != want:
            raise ValueError(f"delta payload section decodes to {size} bytes, want {want}")
        d = zstandard.ZstdDecompressor().decompressobj()
        raw = d.decompress(data)
    except zstandard.ZstdError as e:
        raise ValueError(f"bad delta payload: {e}") from e
    if not d.eof or d.unused_data or len(raw) != want:
        raise ValueError("delta payload section is truncated or has trailing bytes")
    return np.frombuffer(raw, np.uint8)


def decode_into(old: memoryview, payload: bytes | memoryview, out: memoryview, width: int = 1) -> None:
    """out = old XOR unshuffle(decompress(payload)); raises ValueError on a malformed payload."""
    n = len(old)
    if len(out) != n:
        raise ValueError("delta output size differs from its base")
    x = _unshuffle(_decompress(payload, n), width)
    np.bitwise_xor(np.frombuffer(old, np.uint8), x, out=np.frombuffer(out, np.uint8))


# ---- sparse -----------------------------------------------------------------------------------


def element_width(nbytes: int, width: int) -> int:
    """The element size a sparse chunk is cut into: the shuffle width where it tiles the chunk
    (it always does but for a model's odd-sized last chunk), else single bytes."""
    return width if width >= 1 and nbytes % width == 0 else 1


def _elements(x: np.ndarray, w: int) -> np.ndarray:
    """x (bytes) as one item per w-byte element: an unsigned int where numpy has one of that size
    (gathers and scatters on it run ~8x faster than on rows of bytes), else rows of w bytes."""
    return x.view(f"u{w}") if w in (1, 2, 4, 8) else x.reshape(-1, w)


def _changed(x: np.ndarray, w: int) -> np.ndarray:
    """Indices of the w-byte elements of x (an XOR) that are not all zero."""
    e = _elements(x, w)
    return np.flatnonzero(e) if e.ndim == 1 else np.flatnonzero(e.any(axis=1))


def _gaps(idx: np.ndarray, cz: zstandard.ZstdCompressor) -> bytes:
    """Strictly increasing indices as one zstd frame of uint32 gaps (gap - 1), byte-shuffled."""
    gaps = (np.diff(idx, prepend=-1) - 1).astype("<u4")  # gap - 1 >= 0: strictly increasing by design
    return cz.compress(_shuffle(gaps.view(np.uint8), 4).tobytes())


def _positions(idx: np.ndarray, n_elems: int, level: int) -> tuple[int, bytes]:
    """The changed positions as (kind, zstd frame): gaps or a bitmap, whichever compresses smaller."""
    cz = zstandard.ZstdCompressor(level=level)
    by_gaps = _gaps(idx, cz)
    bits = np.zeros(n_elems, np.uint8)
    bits[idx] = 1
    by_bitmap = cz.compress(np.packbits(bits, bitorder="little").tobytes())
    return (_GAPS, by_gaps) if len(by_gaps) <= len(by_bitmap) else (_BITMAP, by_bitmap)


def encode_sparse(old: memoryview, new: memoryview, width: int = 1, level: int = LEVEL) -> bytes | None:
    """The sparse delta of one chunk (header, positions, XOR values), or None when it did not change."""
    if len(old) != len(new):
        raise ValueError("delta needs equal-sized chunks")
    x = np.bitwise_xor(np.frombuffer(old, np.uint8), np.frombuffer(new, np.uint8))
    return _sparse_of_xor(x, old, width, level)


# element width -> the signed type of its difference (numpy integers wrap, which the encoding relies on)
_ZIGZAG = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def _zigzag(new: np.ndarray, old: np.ndarray, w: int) -> np.ndarray:
    """(new - old) modulo 2**(8w), small magnitudes of either sign as small unsigned numbers."""
    d = (new - old).view(_ZIGZAG[w])
    return ((d << 1) ^ (d >> (8 * w - 1))).view(new.dtype)


def _unzigzag(z: np.ndarray) -> np.ndarray:
    """The wrapping difference (as the unsigned type of z) that _zigzag encoded."""
    return (z >> 1) ^ np.negative(z & 1)


def _magnitude(e: np.ndarray, w: int) -> np.ndarray:
    """The 8 bits after the sign of each w-byte element (w >= 2): a float's exponent (bf16, fp32,
    fp64's top bits; fp16's exponent and 3 mantissa bits), so a coarse magnitude of any format."""
    return ((e >> (8 * w - 9)) & 0xFF).astype(np.uint8)


def _size_order(magnitude: np.ndarray, apart: np.ndarray) -> np.ndarray:
    """The order the values go in: the changed elements by magnitude (stable: by position within
    one), then those listed apart, by position."""
    key = magnitude.astype(np.uint16)
    key[apart] = 256  # past every magnitude
    return np.argsort(key, kind="stable")


def _sparse_of_xor(x: np.ndarray, old: memoryview, width: int, level: int) -> bytes | None:
    if len(x) >= _MAX_SPARSE_BYTES:
        return None  # not representable; the dense encoding takes it
    w = element_width(len(x), width)
    n_elems = len(x) // w
    idx = _changed(x, w)
    if not len(idx):
        return None
    kind, pos = _positions(idx, n_elems, level)
    cz = zstandard.ZstdCompressor(level=level)
    flips = _elements(x, w)[idx]
    apart, listed = np.empty(0, np.int64), b""
    if w == 1:
        before = _elements(np.frombuffer(old, np.uint8), w)[idx]
        vkind, vals = _DIFF, _zigzag(before ^ flips, before, w).view(np.uint8)
    elif w in _ZIGZAG:
        before = _elements(np.frombuffer(old, np.uint8), w)[idx]
        after, size = before ^ flips, _magnitude(before, w)
        apart = np.flatnonzero(size != _magnitude(after, w))
        order = _size_order(size, apart)
        vkind, vals = _BY_SIZE, _zigzag(after, before, w)[order].view(np.uint8)
        if len(apart):
            listed = _gaps(apart, cz)
    else:
        vkind, vals = _XOR, flips.view(np.uint8).reshape(-1)
    vz = cz.compress(_shuffle(vals, w).tobytes())
    head = _HEADER.pack(_MAGIC, kind, w, vkind, len(idx), len(pos), len(apart), len(listed), len(vz))
    return head + pos + listed + vz


def encode_best(old: memoryview, new: memoryview, width: int = 1, level: int = LEVEL) -> tuple[Encoding, bytes] | None:
    """The sparse delta of one chunk where it is smaller (SPARSE_MARGIN), else the dense one; None:
    the chunk did not change."""
    if len(old) != len(new):
        raise ValueError("delta needs equal-sized chunks")
    x = np.bitwise_xor(np.frombuffer(old, np.uint8), np.frombuffer(new, np.uint8))
    if not x.any():
        return None
    dense = zstandard.ZstdCompressor(level=level).compress(_shuffle(x, width).tobytes())
    sparse = _sparse_of_xor(x, old, width, level)
    if sparse is not None and len(sparse) < SPARSE_MARGIN * len(dense):
        return SPARSE, sparse
    return DENSE, dense


def _read_positions(kind: int, data: memoryview, count: int, n_elems: int) -> np.ndarray:
    """Strictly increasing element indices, all < n_elems, exactly `count` of them; else ValueError."""
    if kind == _GAPS:
        gaps = _unshuffle(_decompress(data, 4 * count), 4).view("<u4").astype(np.int64)
        if gaps.max() >= n_elems:  # checked before the sum, which then cannot overflow int64
            raise ValueError("sparse delta position out of range")
        idx = np.cumsum(gaps + 1) - 1
    elif kind == _BITMAP:
        bits = np.unpackbits(_decompress(data, -(-n_elems // 8)), bitorder="little")
        if bits[n_elems:].any():
            raise ValueError("sparse delta bitmap marks elements past the chunk")
        idx = np.flatnonzero(bits[:n_elems])
        if len(idx) != count:
            raise ValueError(f"sparse delta bitmap marks {len(idx)} elements, header says {count}")
    else:
        raise ValueError(f"unknown sparse delta positions kind {kind}")
    if idx[-1] >= n_elems:
        raise ValueError("sparse delta position out of range")
    return idx


def decode_sparse_into(
    old: memoryview, payload: bytes | memoryview, out: memoryview, width: int = 1, undo: bool = False
) -> None:
    """out = old with the payload's changed elements applied (undo: taken back, so `old` is the newer
    chunk and `out` the one the delta was made from); ValueError on a malformed payload."""
    n = len(old)
    if len(out) != n:
        raise ValueError("delta output size differs from its base")
    payload = memoryview(payload).cast("B")
    if len(payload) < _HEADER.size:
        raise ValueError("sparse delta payload is shorter than its header")
    magic, kind, w, vkind, count, pos_len, n_apart, apart_len, val_len = _HEADER.unpack_from(payload)
    n_elems = n // max(w, 1)
    if magic != _MAGIC or w != element_width(n, width) or vkind != _values_kind(w):
        raise ValueError("not a sparse delta payload for this chunk (magic, width or values kind)")
    if not 1 <= count <= n_elems:
        raise ValueError(f"sparse delta counts {count} changed elements of {n_elems}")
    if (n_apart > 0) != (apart_len > 0) or n_apart > count or (n_apart and vkind != _BY_SIZE):
        raise ValueError("sparse delta lists elements apart that it cannot have")
    if _HEADER.size + pos_len + apart_len + val_len != len(payload):
        raise ValueError("sparse delta payload length does not match its header")
    body = payload[_HEADER.size :]
    idx = _read_positions(kind, body[:pos_len], count, n_elems)
    vals = _elements(_unshuffle(_decompress(body[pos_len + apart_len :], count * w), w), w)
    dst = np.frombuffer(out, np.uint8)
    dst[:] = np.frombuffer(old, np.uint8)
    elems = _elements(dst, w)
    if vkind == _XOR:
        elems[idx] ^= vals
        return
    diff = _unzigzag(vals)
    if vkind == _BY_SIZE:  # back into position order; the magnitudes are the same on both sides
        apart = _read_positions(_GAPS, body[pos_len : pos_len + apart_len], n_apart, count) if n_apart else None
        order = _size_order(_magnitude(elems[idx], w), np.empty(0, np.int64) if apart is None else apart)
        in_order = np.empty_like(diff)
        in_order[order] = diff
        diff = in_order
    if undo:
        elems[idx] -= diff
    else:
        elems[idx] += diff


def _values_kind(w: int) -> int:
    """What the encoder sends for elements of w bytes (the decoder accepts nothing else)."""
    return _DIFF if w == 1 else _BY_SIZE if w in _ZIGZAG else _XOR


def decode_chunk(
    old: memoryview, payload: bytes | memoryview, out: memoryview, width: int, encoding: Encoding, undo: bool = False
) -> None:
    """Rebuild one chunk from a delta in either encoding (the delta manifest names it); undo: the
    chunk the delta was made from, out of the one it rebuilds."""
    if encoding == SPARSE:
        decode_sparse_into(old, payload, out, width, undo)
    elif encoding == DENSE:
        decode_into(old, payload, out, width)
    else:
        raise ValueError(f"unknown delta encoding {encoding!r}")
