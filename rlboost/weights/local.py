"""Same-machine weight transfer: the trainer's own (reserved) engines map the publisher's buffer.

The publisher keeps each version in a memfd; `Manifest.local_path` names it as /proc/<pid>/fd/<n>,
which a process of the same user on the same machine can open and map. That is shared memory with
no socket and no copy besides the engine's own load. The path is only a hint: the fd may have been
closed and reused, or the reader may be elsewhere, so the mapping is checked against every chunk's
digest before use, and None (pull over HTTP instead) is the answer to anything unexpected.
"""

from __future__ import annotations

import concurrent.futures as cf
import mmap
import os

from rlboost.contracts import digest
from rlboost.contracts.weight_manifest import Manifest


def open_local(m: Manifest, threads: int = 4) -> mmap.mmap | None:
    """A private (copy-on-write) mapping of version `m`, verified chunk by chunk; None if unusable."""
    if not m.local_path or m.total_bytes == 0:
        return None
    try:
        fd = os.open(m.local_path, os.O_RDONLY)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size < m.total_bytes:
            return None
        mm = mmap.mmap(fd, m.total_bytes, access=mmap.ACCESS_COPY)  # writable view, never written back
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    view = memoryview(mm)

    def ok(i: int) -> bool:
        c = m.chunks[i]
        return digest.hexdigest(m.digest, view[c.offset : c.offset + c.size]) == c.digest

    with cf.ThreadPoolExecutor(max_workers=threads) as pool:  # both digests release the GIL
        good = all(pool.map(ok, range(len(m.chunks))))
    view.release()
    return mm if good else None
