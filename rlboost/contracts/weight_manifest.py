"""The weight transfer's wire schema: what a published version and a delta between two look like.

A published version (rlboost/weights/publisher.py) is one contiguous buffer described by a `Manifest`: the
tensor table (`TensorInfo`: name, dtype, shape, offset) and the chunk list with a digest each
(`ChunkInfo`, rlboost/contracts/digest.py). A delta from an older version (rlboost/weights/delta_codec.py encodes it,
rlboost/weights/delta_chain.py composes several) is a `DeltaManifest` with a `DeltaChunk` per chunk; its
codec and encoding names are defined here, so the publisher, the delta codec and the puller
(rlboost/weights/pull.py) share one schema without importing each other.

Imports nothing of the weight modules: they all import it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlboost.contracts.digest import DEFAULT as DEFAULT_DIGEST
from rlboost.contracts.digest import HEX_PATTERN, Algorithm, hexdigest

CODEC = "xor-shuffle-zstd"  # every chunk dense (what publishers before the sparse encoding send)
CODEC_SPARSE = "sparse-or-xor-shuffle-zstd"  # per chunk, DeltaChunk.encoding says which
DENSE: Literal["xor-shuffle"] = "xor-shuffle"
SPARSE: Literal["sparse"] = "sparse"
Encoding = Literal["xor-shuffle", "sparse"]

# dtype name -> bytes per element. No torch here: a worker's transfer path (and the peer server)
# does not need it, and importing it costs seconds of CPU on a small node.
ITEMSIZE = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


class TensorInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=1024)
    dtype: str
    shape: list[int]
    offset: int = Field(ge=0)
    nbytes: int = Field(ge=0)


class ChunkInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    index: int = Field(ge=0)
    offset: int = Field(ge=0)
    size: int = Field(ge=1)
    digest: str = Field(pattern=HEX_PATTERN)


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=0)
    format: Literal["raw"] = "raw"
    total_bytes: int = Field(ge=0)
    chunk_bytes: int = Field(ge=1)
    digest: Algorithm = DEFAULT_DIGEST  # of every chunk, of the root, of delta payloads
    root: str = Field(pattern=HEX_PATTERN)  # digest of the chunk digests, in order
    tensors: list[TensorInfo]
    chunks: list[ChunkInfo]
    local_path: str | None = None  # same-machine readers may map the buffer here (rlboost/weights/local.py)


class DeltaChunk(BaseModel):
    model_config = ConfigDict(extra="forbid")
    index: int = Field(ge=0)
    # compressed bytes on the wire; 0: the chunk did not change, or (when its digest differs between
    # the two manifests) it goes in full
    size: int = Field(ge=0)
    digest: str | None = Field(default=None, pattern=HEX_PATTERN)  # of the compressed bytes
    shuffle: int = Field(default=1, ge=1, le=8)  # element width (dense: the shuffle; sparse: the element)
    encoding: Encoding = DENSE


class DeltaManifest(BaseModel):
    """Version `version` as a difference from `base`; rebuilt chunks are checked against the full
    manifest's digests, so a delta can never produce weights other than the published ones."""

    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=0)
    base: int = Field(ge=0)
    # "xor-shuffle-zstd": every chunk dense; "sparse-or-xor-shuffle-zstd": each chunk's `encoding`
    # says which (a worker that knows only the first rejects the second and pulls in full)
    codec: Literal["xor-shuffle-zstd", "sparse-or-xor-shuffle-zstd"] = CODEC_SPARSE
    total_bytes: int = Field(ge=0)  # compressed bytes of all changed chunks
    chunks: list[DeltaChunk]

    @model_validator(mode="after")
    def _encodings_match_codec(self) -> DeltaManifest:
        if self.codec == CODEC and any(d.encoding != DENSE for d in self.chunks):
            raise ValueError(f"codec {self.codec} has dense chunks only")
        return self


def root_of(chunks: list[ChunkInfo], alg: Algorithm) -> str:
    """The manifest's root: the digest of its chunk digests, in order."""
    return hexdigest(alg, b"".join(bytes.fromhex(c.digest) for c in chunks))


def itemsize(name: str) -> int:
    if name not in ITEMSIZE:
        raise ValueError(f"unsupported weight dtype {name!r}")
    return ITEMSIZE[name]
