"""Weight buffers: one contiguous, 64-byte aligned host buffer per version, and tensors viewed in it.

Shared by the publisher (rlboost/weights/publisher.py), a worker's store (rlboost/weights/store.py) and the broadcast
(rlboost/weights/broadcast.py); the layout is the manifest's tensor table (rlboost/contracts/weight_manifest.py).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING

import numpy as np

from rlboost.contracts.weight_manifest import TensorInfo, itemsize

if TYPE_CHECKING:
    import torch

ALIGN = 64  # tensor offsets: lets a receiver view any dtype in place (torch.frombuffer + view)


# torch is imported lazily: a worker's transfer path (and the peer server) does not need it, and
# importing it costs seconds of CPU on a small node.
def dtype_of(name: str) -> torch.dtype:
    import torch

    itemsize(name)
    return getattr(torch, name)


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    itemsize(name)  # rejects what a receiver could not rebuild
    return name


def layout(tensors: Mapping[str, torch.Tensor]) -> tuple[list[TensorInfo], int]:
    """Where each tensor goes in the buffer (sorted by name, so two versions of one model align)."""
    infos, off = [], 0
    for name in sorted(tensors):
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        infos.append(TensorInfo(name=name, dtype=dtype_name(t.dtype), shape=list(t.shape), offset=off, nbytes=nbytes))
        off += -(-nbytes // ALIGN) * ALIGN
    return infos, off


def tensor_views(buf: object, infos: list[TensorInfo]) -> dict[str, torch.Tensor]:
    """Tensors that are views into `buf` (no copy); they keep `buf` alive."""
    import torch

    flat = torch.frombuffer(buf, dtype=torch.uint8) if len(memoryview(buf)) else torch.empty(0, dtype=torch.uint8)
    out = {}
    for ti in infos:
        dt = dtype_of(ti.dtype)
        if ti.nbytes == 0:
            out[ti.name] = torch.empty(ti.shape, dtype=dt)
        else:
            out[ti.name] = flat[ti.offset : ti.offset + ti.nbytes].view(dt).view(ti.shape)
    return out


class HostBuffer:
    """A writable contiguous byte buffer.

    `shareable` (the publisher's): memfd-backed on Linux, so it can be sendfile'd and mapped by
    another process. Otherwise (a worker's receive buffer, served to peers by plain writes):
    anonymous memory, asking for transparent huge pages, which cut first-touch faults 512-fold where
    the kernel grants them (shmem huge pages are usually off, so a memfd would not get them). On
    this project's VMs it does not grant them, and first touch costs 0.5-3 s per GiB: see `page_in`."""

    def __init__(self, size: int, name: str = "rlboost-weights", *, shareable: bool = True) -> None:
        self.size = size
        self.file: IO[bytes] | None = None
        self.path: str | None = None
        self.sending = 0  # responses still sending from it: it must not be reused before they end
        n = max(size, 1)  # mmap refuses length 0
        if shareable and hasattr(os, "memfd_create"):
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            os.ftruncate(fd, n)
            self.file = open(fd, "rb", buffering=0)  # noqa: SIM115 - lives as long as the buffer
            self._mm = mmap.mmap(fd, n)
            self.path = f"/proc/{os.getpid()}/fd/{fd}"
        else:
            self._mm = mmap.mmap(-1, n)
            if hasattr(mmap, "MADV_HUGEPAGE"):
                self._mm.madvise(mmap.MADV_HUGEPAGE)
        self.view = memoryview(self._mm)[:size]

    def __len__(self) -> int:
        return self.size

    def page_in(self) -> HostBuffer:
        """Fault every page in now (one write per page; numpy releases the GIL meanwhile), so a
        later copy into the buffer runs at memory speed: first-touch faults cost seconds per GiB on
        the VMs measured here."""
        if self.size:
            np.frombuffer(self.view, np.uint8)[:: mmap.PAGESIZE] = 0
        return self
