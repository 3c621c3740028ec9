"""Delta transfer: version v as XOR with v-1, byte-shuffled, zstd-compressed, chunk by chunk.

Why XOR + shuffle: one optimizer step moves each weight a little, so old XOR new keeps the sign and
exponent bytes (and, in bf16, often the whole value) at zero; grouping byte k of every element
together (the "shuffle" of blosc/HDF5) turns those into long zero runs that zstd squeezes to almost
nothing, while the noisy low mantissa bytes stay as they are. Decoding is exact by construction
(XOR is its own inverse) and every rebuilt chunk is checked against the full manifest's digest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import zstandard

if TYPE_CHECKING:
    from trainer.weights import ChunkInfo, TensorInfo

CODEC = "xor-shuffle-zstd"
LEVEL = 1  # level 1 already takes the zero runs; higher levels cost CPU on the trainer for ~nothing


def shuffle_widths(tensors: Sequence[TensorInfo], chunks: Sequence[ChunkInfo]) -> list[int]:
    """Per chunk, the element size of the tensor that covers most of it (the shuffle width)."""
    from trainer.weights import itemsize

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


def decode_into(old: memoryview, payload: bytes | memoryview, out: memoryview, width: int = 1) -> None:
    """out = old XOR unshuffle(decompress(payload)); raises ValueError on a malformed payload."""
    n = len(old)
    if len(out) != n:
        raise ValueError("delta output size differs from its base")
    try:
        raw = zstandard.ZstdDecompressor().decompress(bytes(payload), max_output_size=n)
    except zstandard.ZstdError as e:
        raise ValueError(f"bad delta payload: {e}") from e
    if len(raw) != n:
        raise ValueError(f"delta payload decodes to {len(raw)} bytes, want {n}")
    x = _unshuffle(np.frombuffer(raw, np.uint8), width)
    np.bitwise_xor(np.frombuffer(old, np.uint8), x, out=np.frombuffer(out, np.uint8))
