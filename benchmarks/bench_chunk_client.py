"""The hand-written chunk client (rlboost/weights/chunk_http.py) against aiohttp and httpx, pulling the same
weight chunks from the real publisher over loopback (issue 16: keep it only if a library costs more
than 5 % of pull throughput).

    .venv/bin/python benchmarks/bench_chunk_client.py --mib 512 --runs 5

The trainer's publisher (rlboost/weights/publisher.py, the chunk routes a worker pulls from) runs in its own
process, as in a job (bench_weights.Trainer). Each client pulls every chunk of version 0 on
--parallel keep-alive connections (a worker's default, 4) into one paged-in buffer and checks each
chunk's BLAKE3 digest, as a worker's pull does. The clients take turns within each run, so a busy
machine slows all of them alike; the figure is the median of --runs, with the client's CPU seconds
(all threads) per GiB beside it.

- raw: weights.chunk_http.HttpConn + weights.pull.fetch_into on a thread per connection (the pull's own code).
- aiohttp: one event loop, a coroutine per connection, bodies read with readany() and hashed as they land.
- aiohttp+threads: the same, with each chunk hashed on a worker thread after it landed (BLAKE3 frees the GIL).
- httpx: a thread per connection, each with its own httpx.Client, bodies read with iter_raw().
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import aiohttp  # noqa: E402
import httpx  # noqa: E402

from rlboost.contracts import digest  # noqa: E402
from rlboost.contracts.weight_manifest import Manifest  # noqa: E402
from rlboost.weights.chunk_http import PIECE, HttpConn, Partial  # noqa: E402
from rlboost.weights.pull import fetch_into  # noqa: E402

MiB = 1 << 20


def _queue(m: Manifest) -> Callable[[], int | None]:
    """The next chunk index to fetch (None: all handed out), shared by the connections."""
    todo, lock = list(range(len(m.chunks)))[::-1], threading.Lock()

    def take() -> int | None:
        with lock:
            return todo.pop() if todo else None

    return take


def _check(m: Manifest, c: int, got: str) -> None:
    if got != m.chunks[c].digest:
        raise SystemExit(f"chunk {c}: digest mismatch")


def pull_raw(url: str, m: Manifest, dest: memoryview, parallel: int) -> None:
    take = _queue(m)

    def loop() -> None:
        conn = HttpConn(url, None, 30.0)
        try:
            while (c := take()) is not None:
                info = m.chunks[c]
                view = dest[info.offset : info.offset + info.size]
                fetch_into(conn, f"/v1/weights/{m.version}/chunks/{c}", info.digest, view, Partial.new(m.digest))
        finally:
            conn.close()

    with ThreadPoolExecutor(parallel) as pool:
        for f in [pool.submit(loop) for _ in range(parallel)]:
            f.result()


async def _pull_aiohttp(url: str, m: Manifest, dest: memoryview, parallel: int, hash_in_thread: bool) -> None:
    take = _queue(m)

    async def loop(s: aiohttp.ClientSession) -> None:
        while (c := take()) is not None:
            info = m.chunks[c]
            async with s.get(f"{url}/v1/weights/{m.version}/chunks/{c}") as r:
                if r.status != 200:
                    raise SystemExit(f"chunk {c}: HTTP {r.status}")
                o, end = info.offset, info.offset + info.size
                h = None if hash_in_thread else digest.hasher(m.digest)
                while o < end:
                    piece = await r.content.readany()
                    if not piece:
                        raise SystemExit(f"chunk {c}: body cut short")
                    dest[o : o + len(piece)] = piece
                    if h is not None:
                        h.update(piece)
                    o += len(piece)
            view = dest[info.offset : end]
            got = await asyncio.to_thread(digest.hexdigest, m.digest, view) if h is None else h.hexdigest()
            _check(m, c, got)

    conn = aiohttp.TCPConnector(limit=parallel)
    # read_bufsize: the stream's buffer, as large as the raw client's reads
    async with aiohttp.ClientSession(connector=conn, read_bufsize=PIECE) as s:
        await asyncio.gather(*(loop(s) for _ in range(parallel)))


def pull_aiohttp(url: str, m: Manifest, dest: memoryview, parallel: int) -> None:
    asyncio.run(_pull_aiohttp(url, m, dest, parallel, hash_in_thread=False))


def pull_aiohttp_threads(url: str, m: Manifest, dest: memoryview, parallel: int) -> None:
    asyncio.run(_pull_aiohttp(url, m, dest, parallel, hash_in_thread=True))


def pull_httpx(url: str, m: Manifest, dest: memoryview, parallel: int) -> None:
    take = _queue(m)

    def loop() -> None:
        with httpx.Client(timeout=30.0) as client:
            while (c := take()) is not None:
                info = m.chunks[c]
                h, o = digest.hasher(m.digest), info.offset
                with client.stream("GET", f"{url}/v1/weights/{m.version}/chunks/{c}") as r:
                    if r.status_code != 200:
                        raise SystemExit(f"chunk {c}: HTTP {r.status_code}")
                    for piece in r.iter_raw(PIECE):
                        dest[o : o + len(piece)] = piece
                        h.update(piece)
                        o += len(piece)
                _check(m, c, h.hexdigest())

    with ThreadPoolExecutor(parallel) as pool:
        for f in [pool.submit(loop) for _ in range(parallel)]:
            f.result()


CLIENTS: dict[str, Callable[[str, Manifest, memoryview, int], None]] = {
    "raw": pull_raw,
    "aiohttp": pull_aiohttp,
    "aiohttp+threads": pull_aiohttp_threads,
    "httpx": pull_httpx,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=512, help="model size pulled per run")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--parallel", type=int, default=4, help="connections per pull (a worker's default)")
    ap.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=list(CLIENTS))
    ap.add_argument("--out", type=Path, help="write the per-run figures here as JSON")
    args = ap.parse_args()

    from bench_weights import Trainer

    trainer = Trainer(args.mib * MiB)
    try:
        m = Manifest.model_validate(httpx.get(f"{trainer.url}/v1/weights/0/manifest").json())
        buf = bytearray(m.total_bytes)  # paged in once: every client lands in warm memory
        dest = memoryview(buf)
        rates: dict[str, list[float]] = {k: [] for k in args.clients}
        cpu: dict[str, list[float]] = {k: [] for k in args.clients}
        CLIENTS[args.clients[0]](trainer.url, m, dest, args.parallel)  # warm-up: server caches, imports
        for r in range(args.runs):
            order = args.clients[r % len(args.clients) :] + args.clients[: r % len(args.clients)]
            for name in order:  # a different client first in each run
                t0, c0 = time.perf_counter(), time.process_time()
                CLIENTS[name](trainer.url, m, dest, args.parallel)
                wall, used = time.perf_counter() - t0, time.process_time() - c0
                rates[name].append(m.total_bytes / wall / 1e6)
                cpu[name].append(used / (m.total_bytes / (1 << 30)))
            print(f"run {r + 1}: " + ", ".join(f"{k} {rates[k][-1]:.0f} MB/s" for k in args.clients), flush=True)
    finally:
        trainer.close()

    base = statistics.median(rates["raw"]) if "raw" in rates else None
    print(f"\n{args.mib} MiB, {len(m.chunks)} chunks of {m.chunk_bytes // MiB} MiB, {args.parallel} connections")
    # "vs raw": the median over runs of (this client's rate / raw's in the same run): paired, so a run
    # that the machine's load slowed for everyone still compares like with like
    print(f"{'client':<16} {'median MB/s':>12} {'vs raw':>7} {'CPU s/GiB':>10}  runs (MB/s)")
    for k in args.clients:
        med = statistics.median(rates[k])
        paired = [x / b for x, b in zip(rates[k], rates["raw"], strict=True)] if base else []
        ratio = f"{statistics.median(paired):.2f}" if paired else "-"
        runs = ", ".join(f"{x:.0f}" for x in rates[k])
        print(f"{k:<16} {med:>12.0f} {ratio:>7} {statistics.median(cpu[k]):>10.2f}  {runs}")
    if args.out:
        args.out.write_text(json.dumps({"mib": args.mib, "parallel": args.parallel, "rates": rates, "cpu": cpu}))


if __name__ == "__main__":
    main()
