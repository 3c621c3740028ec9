"""The torch.distributed weight broadcast (gloo, rlboost/weights/broadcast.py) against the HTTP pull
(rlboost/weights/pull.py) of the same version, on loopback: N member processes hold the version
(verified chunk by chunk) either way; medians of several runs, ratio broadcast / HTTP.

    .venv/bin/python benchmarks/bench_weight_broadcast.py --mib 256 --members 4 --runs 5

Each run starts the members, waits until they have imported torch and are idle, then times from
"go" to the last member holding the version (the broadcast's time includes its rendezvous: one per
transfer). HTTP members pull from the trainer alone (no peers, no delta), as the first pull of a
version does. Both receive into paged-in buffers and verify every chunk's digest. All processes
share this machine's cores and one loopback, so this compares the two transports' CPU and copy
costs, not a network: no NCCL or GPU here.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MiB = 1 << 20


def member(mode: str, plan_file: str, name: str, base_url: str) -> int:
    """A member process: import, say ready, wait for go, receive or pull, say done."""
    import torch

    from rlboost.weights.broadcast import BroadcastPlan, receive
    from rlboost.weights.buffers import HostBuffer
    from rlboost.weights.pull import PullOptions, pull_weights
    from rlboost.weights.store import WeightStore

    torch.set_num_threads(1)
    plan = BroadcastPlan.model_validate_json(Path(plan_file).read_text())
    # both land in paged-in memory, as a worker's recycled buffers (first-touch faults would dominate)
    buf = HostBuffer(plan.manifest.total_bytes, shareable=False).page_in()
    store = WeightStore()
    store.reserve(plan.manifest.total_bytes)
    print("ready", flush=True)
    sys.stdin.readline()
    if mode == "torch":
        receive(plan, name, buf)
    else:
        asyncio.run(pull_weights(base_url, plan.version, PullOptions(swarm=False, delta=False), store=store))
    print("done", flush=True)
    return 0


def one_run(mode: str, n: int, origin: object, transfer_opts: object, tmp: Path) -> float:
    from rlboost.weights.broadcast import Transfer

    names = [f"w{i}" for i in range(n)]
    transfer = Transfer(origin.manifest, names, transfer_opts)  # type: ignore[attr-defined]
    plan_file = tmp / "plan.json"
    plan_file.write_text(transfer.plan.model_dump_json())
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--member", mode, str(plan_file), name, origin.url],  # type: ignore[attr-defined]
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in names
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        sender = None
        if mode == "torch":
            box: list = []
            sender = threading.Thread(target=lambda: box.append(transfer.send(origin.buffer())))  # type: ignore[attr-defined]
            sender.start()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "done", f"a {mode} member failed"
        took = time.monotonic() - t0
        if sender is not None:
            sender.join()
            assert sorted(box[0].delivered) == names, box[0]
        return took
    finally:
        for p in procs:
            p.wait(60)
        transfer.close()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--member":
        return member(*sys.argv[2:6])
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--bucket-mib", type=int, default=64)
    args = ap.parse_args()

    import torch

    from benchmarks.bench_weights import synthetic_model
    from rlboost.weights.broadcast import BroadcastOptions
    from testkit.weight_origin import Origin

    torch.set_num_threads(1)
    origin = Origin(synthetic_model(args.mib * MiB), chunk_bytes=4 * MiB)  # the publisher's default
    opts = BroadcastOptions(bucket_bytes=args.bucket_mib * MiB, timeout_s=120.0, regroup_s=5.0)
    times: dict[str, list[float]] = {"torch": [], "http": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.runs):
                for mode in ("torch", "http"):  # interleaved: drift on the shared cores hits both
                    times[mode].append(one_run(mode, args.members, origin, opts, Path(tmp)))
    finally:
        origin.close()
    med = {m: statistics.median(v) for m, v in times.items()}
    for m, v in times.items():
        print(f"{m:5s} runs: {' '.join(f'{t:.2f}' for t in v)} s; median {med[m]:.2f} s")
    print(
        f"{args.members} members x {args.mib} MiB: broadcast (gloo) {med['torch']:.2f} s, "
        f"HTTP pull {med['http']:.2f} s, ratio broadcast/HTTP {med['torch'] / med['http']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
