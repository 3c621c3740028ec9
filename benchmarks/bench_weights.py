"""Weight transfer benchmarks on loopback (issue 4). Every figure is a ratio against a baseline
measured in the same run, and a median of several runs: this machine's 2 cores are shared.

    .venv/bin/python benchmarks/bench_weights.py single --gib 1 4 --runs 3
    .venv/bin/python benchmarks/bench_weights.py publish --gib 1 2 --runs 3
    .venv/bin/python benchmarks/bench_weights.py fanout --mib 32 --link-mbps 16 --workers 1 4 16 --chunk-kib 1024
    .venv/bin/python benchmarks/bench_weights.py delta --runs 3
    .venv/bin/python benchmarks/bench_weights.py delta-hf --layers 24 --steps 3 --runs 3 --link-mbps 0 100
    .venv/bin/python benchmarks/bench_weights.py kill --mib 32 --link-mbps 16 --runs 3 --chunk-kib 1024
    .venv/bin/python benchmarks/bench_weights.py regions --mib 16 --link-mbps 16 --cross-mbps 2 --runs 3
    .venv/bin/python benchmarks/bench_weights.py jump --layers 2 --steps 8 --behind 1 2 4 8 --runs 3 --link-mbps 100

The trainer (publisher + tracker) and every worker are separate processes, as in a job. `fanout`
and `kill` give every node (trainer included) a token-bucket link of --link-mbps each way, which
is what a real network gives each machine; without it, all nodes share one loopback and two cores,
so N pulls simply take N times as long (measured too: --link-mbps 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MiB = 1 << 20


# ---- child processes -----------------------------------------------------------------------------


def synthetic_model(nbytes: int, dtype: str = "bfloat16", seed: int = 0) -> dict:
    """Random bf16 tensors of 32 MiB (the last smaller): a model-shaped blob of `nbytes`."""
    import torch

    g = torch.Generator().manual_seed(seed)
    per = 32 * MiB
    out, left, i = {}, nbytes, 0
    while left > 0:
        n = min(per, left) // 2
        out[f"layers.{i}.weight"] = torch.randint(-(1 << 15), 1 << 15, (n,), dtype=torch.int16, generator=g).view(
            getattr(torch, dtype)
        )
        left -= n * 2
        i += 1
    return out


def mlp_steps(n_params: int, dtype: str) -> tuple[dict, dict]:
    """A synthetic MLP of ~n_params trained for one real AdamW step (after a warm-up step)."""
    import torch

    torch.manual_seed(0)
    width = 2048
    layers = max(1, n_params // (width * width))
    net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.AdamW(net.parameters(), lr=1e-5)

    def step() -> None:
        x = torch.randn(16, width)
        loss = net(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    before = {k: v.detach().to(getattr(torch, dtype)).clone() for k, v in net.state_dict().items()}
    step()
    after = {k: v.detach().to(getattr(torch, dtype)).clone() for k, v in net.state_dict().items()}
    return before, after


def local_model_steps() -> tuple[dict, dict]:
    """The default job's model (examples/local.yaml) before and after one real GRPO update."""
    import torch

    from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, TaskSpec
    from rlboost.models.vocab import EOS
    from rlboost.trainer.grpo import Sample
    from rlboost.trainer.learner import Learner

    torch.set_num_threads(1)
    learner = Learner(ModelSpec(), AlgorithmSpec(), TaskSpec(), seed=0)
    learner.warm_start(5)
    before = learner.state_dict()
    prompt = [1, 14, 15, 3]
    learner.train_step([Sample(prompt, [15, 14, EOS], 1.0, group=0), Sample(prompt, [16, 17, EOS], 0.0, group=0)])
    return before, learner.state_dict()


QWEN25_05B = {  # Qwen/Qwen2.5-0.5B's config.json (the architecture's published shape)
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


def hf_model_dir(out: Path, layers: int) -> Path:
    """A Qwen2.5-0.5B-shaped model (`layers` of its 24 layers) with the architecture's own random
    init, saved with the tiny byte-level tokenizer of the tests (nothing is downloaded; the prompts
    use only its ids, the rest of the vocabulary is there for the embedding's real size)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from testkit.hf_fixtures import make_tokenizer

    tok = make_tokenizer()
    config = Qwen2Config(
        **{**QWEN25_05B, "num_hidden_layers": layers},
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def hf_learner_versions(pub: object, layers: int, steps: int, lr: float, tmp: Path) -> list[dict]:
    """Train the hf model with the project's learner (fp32 master weights, published in bf16) for
    `steps` GRPO updates at `lr`, publishing version 0 (the init) and one version per step.
    Returns, per step, what the trainer sees: changed elements, the delta's encodings and sizes."""
    import numpy as np

    from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, TaskSpec
    from rlboost.trainer.grpo import Sample
    from rlboost.trainer.learner import Learner
    from testkit.hf_fixtures import write_math_jsonl

    model_dir = hf_model_dir(tmp / "model", layers)
    learner = Learner(
        ModelSpec(kind="hf", path=str(model_dir), dtype="bfloat16"),
        AlgorithmSpec(learning_rate=lr, seed=0),
        TaskSpec(name="jsonl", path=write_math_jsonl(tmp / "math.jsonl"), reward="math_boxed"),
        device="cpu",
    )
    shutil.rmtree(model_dir)
    pub.publish(0, learner.state_dict())  # type: ignore[attr-defined]
    rng = np.random.default_rng(0)
    out = []
    for k in range(1, steps + 1):
        problems = learner.task.sample(rng, 2)
        answers = [learner.task.demo_ids(p)[len(p.prompt_ids) :] for p in problems]
        samples = []
        for g, p in enumerate(problems):  # per prompt: its own answer (reward 1) and the other's (0)
            samples += [Sample(p.prompt_ids, answers[g], 1.0, g), Sample(p.prompt_ids, answers[1 - g], 0.0, g)]
        t0 = time.monotonic()
        learner.train_step(samples)
        train_s = time.monotonic() - t0
        pub.publish(k, learner.state_dict())  # type: ignore[attr-defined]
        out.append({"step": k, "train_s": round(train_s, 1), **delta_report(pub, k)})
        print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def sparse_values_bytes(old: memoryview, new: memoryview, width: int) -> dict[str, int]:
    """The sparse encoding's values section as sent (zigzagged differences in the old elements'
    magnitude order), and the alternatives compressed the same way: the differences in position
    order, the XOR with the old value, the new value."""
    import numpy as np
    import zstandard

    from rlboost.weights import delta_codec as wd

    a, b = np.frombuffer(old, np.uint8), np.frombuffer(new, np.uint8)
    w = wd.element_width(len(a), width)
    x = np.bitwise_xor(a, b)
    idx = wd._changed(x, w)
    if not len(idx) or w not in wd._ZIGZAG or w == 1:
        return {}
    cz = zstandard.ZstdCompressor(level=wd.LEVEL)

    def size(v: np.ndarray) -> int:
        return len(cz.compress(wd._shuffle(v.view(np.uint8).reshape(-1), w).tobytes()))

    ea, eb = wd._elements(a, w)[idx], wd._elements(b, w)[idx]
    diff = wd._zigzag(eb, ea, w)
    apart = np.flatnonzero(wd._magnitude(ea, w) != wd._magnitude(eb, w))
    order = wd._size_order(wd._magnitude(ea, w), apart)
    return {"by_size": size(diff[order]), "diff": size(diff), "xor": size(ea ^ eb), "new": size(eb)}


def delta_report(pub: object, version: int) -> dict:
    """For version-1 -> version: the fraction of elements that changed, the delta's chunks by
    encoding, its size, and what the dense-only encoding (the codec before sparse) would send."""
    import numpy as np

    from rlboost.contracts.weight_manifest import DENSE, SPARSE, itemsize
    from rlboost.weights import delta_codec

    t0 = time.monotonic()
    new_p, old_p = pub._get(version), pub._get(version - 1)  # type: ignore[attr-defined]
    dm, _ = new_p.delta.result()
    encode_s = time.monotonic() - t0  # after the manifest: what the delta adds before pullers get it
    m = new_p.manifest
    changed = elems = 0
    for t in m.tensors:
        w = itemsize(t.dtype)
        a = np.frombuffer(old_p.buf.view[t.offset : t.offset + t.nbytes], f"u{w}")
        b = np.frombuffer(new_p.buf.view[t.offset : t.offset + t.nbytes], f"u{w}")
        changed += int(np.count_nonzero(a != b))
        elems += len(a)
    widths = delta_codec.shuffle_widths(m.tensors, m.chunks)
    dense, values = 0, {"by_size": 0, "diff": 0, "xor": 0, "new": 0}
    for c, w in zip(m.chunks, widths):
        sl = slice(c.offset, c.offset + c.size)
        p = delta_codec.encode(old_p.buf.view[sl], new_p.buf.view[sl], w)
        dense += len(p) if p else 0
        for k, v in sparse_values_bytes(old_p.buf.view[sl], new_p.buf.view[sl], w).items():
            values[k] += v
    return {
        "changed_fraction": changed / elems,
        "sparse_chunks": sum(d.encoding == SPARSE for d in dm.chunks if d.size),
        "dense_chunks": sum(d.encoding == DENSE for d in dm.chunks if d.size),
        "unchanged_chunks": sum(d.size == 0 for d in dm.chunks),
        "delta_bytes": dm.total_bytes,
        "dense_only_bytes": dense,
        "values_bytes": values["by_size"],  # as sent
        "values_as_diff_bytes": values["diff"],
        "values_as_xor_bytes": values["xor"],
        "values_as_new_bytes": values["new"],
        "model_bytes": m.total_bytes,
        "delta_wait_after_manifest_s": round(encode_s, 3),
    }


def serve_main(args: argparse.Namespace) -> None:
    """The trainer: publish, then serve weights + a stats route until killed."""
    from aiohttp import web

    from rlboost.weights.publisher import PublishOptions, WeightPublisher, add_routes
    from rlboost.weights.serving import RateLimit

    # no next-buffer paging in the background: it would run during the measurements (see `publish`)
    pub = WeightPublisher(
        PublishOptions(chunk_bytes=args.chunk_kib * 1024, egress_bps=args.link_bps or None, keep=4, prepare_next=False)
    )
    timings: dict = {}
    if args.model == "hf":
        pub.keep = args.steps + 1  # every version stays: a worker pulls them in a chain
        timings["steps"] = hf_learner_versions(pub, args.layers, args.steps, args.lr, Path(args.ready).parent)
    elif args.model == "synthetic":
        t = synthetic_model(args.bytes)
        t0 = time.monotonic()
        fut = pub.stage(0, t)
        timings["stage_s"] = time.monotonic() - t0
        fut.result()
        timings["stage_and_hash_s"] = time.monotonic() - t0
        if args.sha256_copy:  # version 1: the same bytes with SHA-256 digests (the ablation)
            pub.digest_alg = "sha256"
            pub.publish(1, t)
        del t
    else:
        v0, v1 = local_model_steps() if args.model == "local" else mlp_steps(args.bytes, args.model.split("-")[1])
        pub.publish(0, v0)
        pub.publish(1, v1)
        del v0, v1

    async def stats(_: web.Request) -> web.Response:
        m0 = pub.manifest(0)
        return web.json_response({**pub.stats(), "timings": timings, "manifest0": m0.local_path if m0 else None})

    async def tracker(request: web.Request) -> web.Response:  # region-aware or region-blind, fresh swarm
        pub.tracker.by_region = request.query["by_region"] == "1"
        pub.tracker.forget(0)
        return web.json_response({"by_region": pub.tracker.by_region})

    async def link(request: web.Request) -> web.Response:  # one trained model, several link speeds
        bps = float(request.query["bps"])
        pub.limit = RateLimit(bps) if bps else None
        return web.json_response({"bps": bps})

    async def main() -> None:
        app = web.Application()
        add_routes(app, pub)
        app.router.add_get("/bench/stats", stats)
        app.router.add_get("/bench/link", link)
        app.router.add_get("/bench/tracker", tracker)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        Path(args.ready).write_text(json.dumps({"url": f"http://{host}:{port}", "pid": os.getpid()}))
        await asyncio.Event().wait()

    asyncio.run(main())


def node_main(args: argparse.Namespace) -> None:
    """A worker: wait for the start time, pull, report, keep serving peers for --hold seconds."""
    import aiohttp

    from rlboost.weights.peer_server import ServeOptions, WeightNode
    from rlboost.weights.pull import PullOptions

    async def main() -> None:
        link = args.link_bps or None
        results = []
        async with aiohttp.ClientSession() as s:
            node = None
            for r in range(args.runs):
                if node is None or not args.reuse:  # --reuse: one worker pulling again (warm buffers)
                    pull = PullOptions(
                        token="bench",
                        peer_id=args.id,
                        parallel=args.parallel,
                        region=args.region or None,
                        ingress_bps=link,
                        cross_region_bps=args.cross_bps or None,
                    )
                    node = WeightNode(pull, ServeOptions(egress_bps=link) if args.serve else None)
                    await node.start()
                prepare_s = 0.0
                if args.prepare and r == 0:  # what a booting worker does while its engine starts
                    t0 = time.time()
                    await node.prepare(args.url, args.versions[0], s)
                    if node._reserving is not None:
                        await node._reserving
                    prepare_s = time.time() - t0
                if args.start_at and r == 0:  # wait for "go <unix time>" on stdin: all start at once
                    print(json.dumps({"ready": True}), flush=True)
                    line = await asyncio.to_thread(sys.stdin.readline)
                    await asyncio.sleep(max(0.0, float(line.split()[1]) - time.time()))
                from rlboost.weights.pull import PullStats, pull_weights

                t0 = time.time()
                each = []
                if args.verify:
                    for v in args.versions:  # bytes only: these processes never import torch
                        if node._reserving is not None:  # the next buffer's page-in: not the pull's CPU
                            await node._reserving
                        c0 = time.process_time()
                        await node.pull(args.url, v, s, as_tensors=False)
                        each.append({**node.last.__dict__, "cpu_s": time.process_time() - c0})
                    st = node.last
                else:  # transport-only ablation: same path, no digest
                    st = PullStats()
                    opts = PullOptions(verify=False, swarm=False, as_tensors=False)
                    await pull_weights(args.url, args.versions[-1], opts, session=s, stats=st)
                t1 = time.time()
                assert st is not None
                ru = resource.getrusage(resource.RUSAGE_SELF)
                cpu = {"cpu_s": round(ru.ru_utime + ru.ru_stime, 2)}
                results.append(
                    {
                        "start": t0,
                        "end": t1,
                        "seconds": st.seconds,
                        "prepare_s": prepare_s,
                        "stats": st.__dict__,
                        "each": each,
                        **cpu,
                    }
                )
                print(json.dumps(results[-1]), flush=True)
                if args.hold:
                    await asyncio.sleep(args.hold)
                if not args.reuse:
                    await node.close()

    asyncio.run(main())
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: with 16 nodes on 2 cores its GC pass took minutes


# ---- orchestration -------------------------------------------------------------------------------


class Trainer:
    def __init__(
        self,
        nbytes: int,
        link_bps: float = 0,
        model: str = "synthetic",
        chunk_kib: int = 4096,
        sha256_copy: bool = False,
        extra: list[str] | None = None,
    ) -> None:
        self.tmp = tempfile.mkdtemp(prefix="bench-weights-")
        ready = Path(self.tmp) / "ready.json"
        cmd = [sys.executable, __file__, "_serve", "--bytes", str(nbytes), "--ready", str(ready)]
        cmd += ["--link-bps", str(link_bps), "--model", model, "--chunk-kib", str(chunk_kib)]
        cmd += ["--sha256-copy", str(int(sha256_copy)), *(extra or [])]
        self.proc = subprocess.Popen(cmd)
        while not ready.exists():
            if self.proc.poll() is not None:
                raise SystemExit("trainer process failed")
            time.sleep(0.1)
        time.sleep(0.05)
        info = json.loads(ready.read_text())
        self.url, self.pid = info["url"], info["pid"]

    def stats(self) -> dict:
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/bench/stats") as r:
            return json.loads(r.read())

    def set_link(self, bps: float) -> None:
        import urllib.request

        urllib.request.urlopen(f"{self.url}/bench/link?bps={bps}").read()

    def set_tracker(self, by_region: bool) -> None:
        import urllib.request

        urllib.request.urlopen(f"{self.url}/bench/tracker?by_region={int(by_region)}").read()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


def node_cmd(url: str, **kw: object) -> list[str]:
    cmd = [sys.executable, __file__, "_node", "--url", url]
    for k, v in kw.items():
        if isinstance(v, list):
            cmd += [f"--{k.replace('_', '-')}", *map(str, v)]
        else:
            cmd += [f"--{k.replace('_', '-')}", str(v)]
    return cmd


def run_node(url: str, **kw: object) -> list[dict]:
    out = subprocess.run(node_cmd(url, **kw), capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{") and "ready" not in line]


def curl_rate(url: str, runs: int, dest: str = "/dev/null") -> list[float]:
    """curl's download rate; `dest` other than /dev/null is a fresh file, removed afterwards."""
    rates = []
    for _ in range(runs):
        out = subprocess.run(["curl", "-s", "-o", dest, "-w", "%{speed_download}", url], capture_output=True, text=True)
        rates.append(float(out.stdout))
        if dest != "/dev/null":
            Path(dest).unlink(missing_ok=True)
    return rates


def static_server(path: str) -> tuple[subprocess.Popen, str]:
    """A plain static file server (aiohttp FileResponse: sendfile) over the same bytes."""
    code = (
        "import sys\nfrom aiohttp import web\napp=web.Application()\n"
        "async def f(r): return web.FileResponse(sys.argv[1])\n"
        "app.router.add_get('/blob', f)\nweb.run_app(app, host='127.0.0.1', port=int(sys.argv[2]), print=None)\n"
    )
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen([sys.executable, "-c", code, path, str(port)])
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}/blob"


def bench_single(args: argparse.Namespace) -> None:
    """One worker pulls the whole model from the trainer, against curl of the same bytes.

    Two ceilings, both measured in this run: curl to /dev/null (the transport alone), and curl into a
    fresh file on tmpfs (/dev/shm: the transport plus landing the bytes in memory never touched
    before, which every new receive buffer pays). Pulls: a fresh worker process (fresh buffer); a
    fresh worker that paged its buffer in first, as the agent does while its engine builds
    (`prepare`, timed apart); the same worker's third pull (buffers recycled: every pull after a
    worker's first); for models up to 1 GiB, that again with SHA-256 digests instead of BLAKE3."""
    variants = ("curl", "curl_fresh_mem", "pull", "prepared", "warm", "warm_sha256", "no_verify")
    for gib in args.gib:
        nbytes = int(gib * (1 << 30))
        with_sha = gib <= 1
        tr = Trainer(nbytes, sha256_copy=with_sha)
        try:
            st = tr.stats()
            static, blob_url = static_server(st["manifest0"])
            shm = f"/dev/shm/rlboost-bench-{os.getpid()}"
            rates: dict[str, list[float]] = {k: [] for k in variants}
            prepare_s: list[float] = []
            try:
                for _ in range(args.runs):  # interleave, so load changes hit all of them alike
                    rates["curl"] += curl_rate(blob_url, 1)
                    rates["curl_fresh_mem"] += curl_rate(blob_url, 1, shm)
                    rates["pull"] += [nbytes / r["seconds"] for r in run_node(tr.url, versions=[0], runs=1)]
                    # a fresh worker that paged its buffer in at boot (WeightNode.prepare), then pulls
                    rec = run_node(tr.url, versions=[0], prepare=1)
                    rates["prepared"].append(nbytes / rec[0]["seconds"])
                    prepare_s.append(rec[0]["prepare_s"])
                    # a worker's third pull: its buffers are recycled, no first-touch page faults
                    rates["warm"].append(nbytes / run_node(tr.url, versions=[0], runs=3, reuse=1)[-1]["seconds"])
                    if with_sha:
                        rec = run_node(tr.url, versions=[1], runs=3, reuse=1)
                        rates["warm_sha256"].append(nbytes / rec[-1]["seconds"])
                    rates["no_verify"] += [nbytes / r["seconds"] for r in run_node(tr.url, versions=[0], verify=0)]
            finally:
                static.kill()
                Path(shm).unlink(missing_ok=True)
            med = {k: statistics.median(v) for k, v in rates.items() if v}
            c, cf = med["curl"], med["curl_fresh_mem"]
            out = {
                "bench": "single",
                "gib": gib,
                "curl_MBps": round(c / 1e6),
                "curl_fresh_mem_MBps": round(cf / 1e6),
                "pull_MBps": round(med["pull"] / 1e6),
                "ratio": round(med["pull"] / c, 3),
                "ratio_vs_fresh_mem": round(med["pull"] / cf, 3),
                "prepared_pull_MBps": round(med["prepared"] / 1e6),
                "prepared_ratio": round(med["prepared"] / c, 3),
                "prepare_s": round(statistics.median(prepare_s), 3),
                "warm_pull_MBps": round(med["warm"] / 1e6),
                "warm_ratio": round(med["warm"] / c, 3),
                "pull_no_verify_MBps": round(med["no_verify"] / 1e6),
                "ratio_no_verify": round(med["no_verify"] / c, 3),
                "publish_stage_s": round(st["timings"]["stage_s"], 3),
                "publish_stage_and_hash_s": round(st["timings"]["stage_and_hash_s"], 3),
                "runs_MBps": {k: [round(x / 1e6) for x in v] for k, v in rates.items() if v},
            }
            if with_sha:
                out["warm_sha256_ratio"] = round(med["warm_sha256"] / c, 3)
            print(json.dumps(out), flush=True)
        finally:
            tr.close()


def bench_publish(args: argparse.Namespace) -> None:
    """How long publishing blocks training: `stage` (the copy to host memory) against a plain copy of
    the same tensors into an already paged-in buffer, same process, same run. The first version
    lands in a fresh buffer; later ones in the buffer the publisher paged in after the previous
    version (the gap stands for the training step between two publishes)."""
    import torch

    from rlboost.weights.buffers import HostBuffer, layout, tensor_views
    from rlboost.weights.publisher import PublishOptions, WeightPublisher

    for gib in args.gib:
        nbytes = int(gib * (1 << 30))
        t = synthetic_model(nbytes)
        infos, total = layout(t)

        def copy_into(buf: HostBuffer, tensors: dict = t, infos: list = infos) -> float:
            t0 = time.perf_counter()
            views = tensor_views(buf.view, infos)
            with torch.no_grad():
                for ti in infos:
                    views[ti.name].copy_(tensors[ti.name])
            return time.perf_counter() - t0

        memcpy, fresh = [], []
        for _ in range(args.runs):
            memcpy.append(copy_into(HostBuffer(total).page_in()))
            fresh.append(copy_into(HostBuffer(total)))
        pub = WeightPublisher(PublishOptions(keep=1, delta=False))
        stage = []
        for v in range(args.runs + 1):
            pub.stage(v, t).result()
            stage.append(pub.last_copy_s)  # the part of `stage` that blocks the caller
            if pub._next is not None:  # the training step between two publishes
                pub._next[1].result()
        m, f, first, later = (
            statistics.median(memcpy),
            statistics.median(fresh),
            stage[0],
            statistics.median(stage[1:]),
        )
        print(
            json.dumps(
                {
                    "bench": "publish",
                    "gib": gib,
                    "memcpy_s": round(m, 3),
                    "fresh_buffer_copy_s": round(f, 3),
                    "stage_first_s": round(first, 3),
                    "stage_later_s": round(later, 3),
                    "later_ratio": round(later / m, 2),
                    "first_ratio": round(first / m, 2),
                    "runs_s": {"memcpy": [round(x, 3) for x in memcpy], "stage": [round(x, 3) for x in stage]},
                }
            ),
            flush=True,
        )
        del t, pub, copy_into


def release(procs: list[subprocess.Popen]) -> float:
    """Wait until every node process is ready, then start them all at one instant."""
    for p in procs:
        assert p.stdout is not None and p.stdin is not None
        assert "ready" in p.stdout.readline()
    start_at = time.time() + 0.5
    for p in procs:
        p.stdin.write(f"go {start_at}\n")
        p.stdin.flush()
    return start_at


def swarm_once(url: str, link_bps: float, parallel: int, nodes: list[dict]) -> tuple[float, list[dict]]:
    """One worker process per entry of `nodes` (its extra `_node` flags), released at one instant;
    returns the time until all hold version 0 and each worker's record."""
    procs = [
        subprocess.Popen(
            node_cmd(
                url,
                versions=[0],
                runs=1,
                serve=1,
                id=f"w{i}",
                link_bps=link_bps,
                start_at=1,
                hold=4,
                parallel=parallel,
                **extra,
            ),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i, extra in enumerate(nodes)
    ]
    start_at = release(procs)
    recs = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        recs.append(next(json.loads(x) for x in out.splitlines() if x.startswith("{") and "ready" not in x))
    return max(r["end"] for r in recs) - start_at, recs


def fanout_once(url: str, n: int, link_bps: float, parallel: int) -> float:
    """Start n worker processes, release them at one instant, return when all hold the version."""
    return swarm_once(url, link_bps, parallel, [{}] * n)[0]


def bench_fanout(args: argparse.Namespace) -> None:
    nbytes = args.mib * MiB
    link = args.link_mbps * 1e6
    tr = Trainer(nbytes, link, chunk_kib=args.chunk_kib)
    try:
        base = statistics.median(fanout_once(tr.url, 1, link, args.parallel) for _ in range(args.runs))
        for n in args.workers:
            times, egress = [], []
            for _ in range(args.runs if n > 1 else 1):
                before = tr.stats()["egress_full_bytes"]
                times.append(fanout_once(tr.url, n, link, args.parallel))
                egress.append(tr.stats()["egress_full_bytes"] - before)
                time.sleep(9)  # let the tracker forget this round's seeders
            print(
                json.dumps(
                    {
                        "bench": "fanout",
                        "mib": args.mib,
                        "link_MBps": args.link_mbps,
                        "workers": n,
                        "single_s": round(base, 2),
                        "all_hold_s": round(statistics.median(times), 2),
                        "time_ratio": round(statistics.median(times) / base, 2),
                        "egress_ratio": round(statistics.median(egress) / nbytes, 2),
                        "runs_s": [round(t, 2) for t in times],
                    }
                ),
                flush=True,
            )
    finally:
        tr.close()


def bench_delta(args: argparse.Namespace) -> None:
    for model, nbytes in (("local", 0), ("mlp-float32", args.mlp_params), ("mlp-bfloat16", args.mlp_params)):
        link = args.link_mbps * 1e6
        tr = Trainer(nbytes, link, model)
        try:
            full, delta, wire_full, wire_delta = [], [], 0, 0
            for _ in range(args.runs):
                rec = run_node(tr.url, versions=[0, 1], link_bps=link)[0]["stats"]  # v0 full, then v1 delta
                assert rec["mode"] == "delta", rec
                delta.append(rec["seconds"])
                wire_delta = rec["bytes_received"]
                rec = run_node(tr.url, versions=[1], link_bps=link)[0]["stats"]
                full.append(rec["seconds"])
                wire_full = rec["bytes_received"]
            print(
                json.dumps(
                    {
                        "bench": "delta",
                        "model": model,
                        "link_MBps": args.link_mbps or None,
                        "model_MiB": round(wire_full / MiB, 2),
                        "delta_wire_MiB": round(wire_delta / MiB, 3),
                        "wire_ratio": round(wire_delta / wire_full, 3),
                        "full_s": round(statistics.median(full), 3),
                        "delta_s": round(statistics.median(delta), 3),
                        "time_ratio": round(statistics.median(delta) / statistics.median(full), 3),
                    }
                ),
                flush=True,
            )
        finally:
            tr.close()


def bench_delta_hf(args: argparse.Namespace) -> None:
    """A Qwen2.5-0.5B-shaped model trained by the project's learner (fp32 master, bf16 published) at
    --lr: per step, a worker holding v-1 pulls v (its delta), and a fresh worker pulls v in full,
    interleaved run by run; the same trainer process serves every link speed."""
    extra = ["--layers", str(args.layers), "--steps", str(args.steps), "--lr", str(args.lr)]
    tr = Trainer(0, 0, "hf", args.chunk_kib, extra=extra)
    try:
        steps = tr.stats()["timings"]["steps"]
        print(json.dumps({"bench": "delta-hf", "layers": args.layers, "lr": args.lr, "trainer": steps}), flush=True)
        versions = list(range(args.steps + 1))
        for mbps in args.link_mbps:
            link = mbps * 1e6
            tr.set_link(link)
            delta: dict[int, list[float]] = {k: [] for k in versions[1:]}
            full: dict[int, list[float]] = {k: [] for k in versions[1:]}
            wire: dict[int, int] = {}
            cpu: dict[int, list[float]] = {k: [] for k in versions[1:]}
            for _ in range(args.runs):
                chain = run_node(tr.url, versions=versions, link_bps=link)[0]["each"]  # v0 full, then deltas
                for st in chain[1:]:
                    assert st["mode"] == "delta", st
                    delta[st["version"]].append(st["seconds"])
                    cpu[st["version"]].append(st["cpu_s"])  # all threads of the worker process
                    wire[st["version"]] = st["bytes_received"]
                for k in versions[1:]:
                    full[k].append(run_node(tr.url, versions=[k], link_bps=link)[0]["stats"]["seconds"])
            for k in versions[1:]:
                f, d, model = statistics.median(full[k]), statistics.median(delta[k]), steps[k - 1]["model_bytes"]
                print(
                    json.dumps(
                        {
                            "bench": "delta-hf",
                            "link_MBps": mbps or None,
                            "step": k,
                            "changed_fraction": round(steps[k - 1]["changed_fraction"], 5),
                            "model_MiB": round(model / MiB, 1),
                            "wire_MiB": round(wire[k] / MiB, 2),
                            "wire_ratio": round(wire[k] / model, 4),
                            "dense_only_ratio": round(steps[k - 1]["dense_only_bytes"] / model, 4),
                            "full_over_wire": round(model / wire[k], 1),
                            "full_s": round(f, 3),
                            "delta_s": round(d, 3),
                            "time_ratio": round(d / f, 4),
                            "delta_cpu_s": round(statistics.median(cpu[k]), 3),
                            "runs_full_s": [round(x, 3) for x in full[k]],
                            "runs_delta_s": [round(x, 3) for x in delta[k]],
                        }
                    ),
                    flush=True,
                )
    finally:
        tr.close()


def kill_once(url: str, link_bps: float, kill: bool) -> float:
    """A seed worker holds the version; a newcomer pulls (from it: the tracker grants no origin
    chunks that a peer holds). With `kill`, the seed is SIGKILLed halfway through."""
    seed = subprocess.Popen(
        node_cmd(url, versions=[0], runs=1, serve=1, id="seed", link_bps=link_bps, hold=120),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert seed.stdout is not None
    first = json.loads(seed.stdout.readline())
    assert first["stats"]["mode"] == "full"
    newcomer = subprocess.Popen(
        node_cmd(url, versions=[0], runs=1, serve=1, id="new", link_bps=link_bps, start_at=1),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    start_at = release([newcomer])
    if kill:
        time.sleep(max(0.0, start_at - time.time()) + first["seconds"] / 2)
        seed.send_signal(signal.SIGKILL)
    out, _ = newcomer.communicate(timeout=600)
    seed.kill()
    seed.wait()
    rec = next(json.loads(x) for x in out.splitlines() if x.startswith("{") and "ready" not in x)
    return rec["end"] - start_at, rec["stats"]


def bench_kill(args: argparse.Namespace) -> None:
    link = args.link_mbps * 1e6
    tr = Trainer(args.mib * MiB, link, chunk_kib=args.chunk_kib)
    try:
        clean, killed, notes = [], [], []
        for _ in range(args.runs):
            t, st = kill_once(tr.url, link, False)
            clean.append(t)
            t, st = kill_once(tr.url, link, True)
            killed.append(t)
            notes.append({"from_peers_MiB": round(st["from_peers"] / MiB, 1), "bad": st["bad_peers"]})
            time.sleep(9)
        c, k = statistics.median(clean), statistics.median(killed)
        print(
            json.dumps(
                {
                    "bench": "kill",
                    "mib": args.mib,
                    "link_MBps": args.link_mbps,
                    "clean_s": round(c, 2),
                    "killed_s": round(k, 2),
                    "extra_ratio": round((k - c) / c, 3),
                    "runs": notes,
                }
            ),
            flush=True,
        )
    finally:
        tr.close()


def bench_jump(args: argparse.Namespace) -> None:
    """Issue 17 item 2: a worker k versions behind. The hf model trained by the project's learner
    publishes v0..v(steps); a worker holding v(steps-k) pulls v(steps) as one composed delta, against
    the two ways it had before, in the same run: the chain of k single-step deltas one after another,
    and a full pull (what it did before this item)."""
    extra = ["--layers", str(args.layers), "--steps", str(args.steps), "--lr", str(args.lr)]
    link = args.link_mbps * 1e6
    tr = Trainer(0, link, "hf", args.chunk_kib, extra=extra)
    try:
        last = args.steps
        for k in args.behind:
            rows: dict[str, list[tuple[float, int]]] = {"jump": [], "chain": [], "full": []}
            for _ in range(args.runs):  # interleaved, so load changes hit all three alike
                each = run_node(tr.url, versions=[last - k, last], link_bps=link)[0]["each"]
                assert each[1]["mode"] == "delta" and each[1]["from_origin"] == 0 == each[1]["from_peers"], each[1]
                rows["jump"].append((each[1]["seconds"], each[1]["bytes_received"]))
                each = run_node(tr.url, versions=list(range(last - k, last + 1)), link_bps=link)[0]["each"]
                rows["chain"].append((sum(e["seconds"] for e in each[1:]), sum(e["bytes_received"] for e in each[1:])))
                st = run_node(tr.url, versions=[last], link_bps=link)[0]["stats"]
                rows["full"].append((st["seconds"], st["bytes_received"]))
            med = {n: (statistics.median(t for t, _ in r), statistics.median(b for _, b in r)) for n, r in rows.items()}
            full_s, full_b = med["full"]
            print(
                json.dumps(
                    {
                        "bench": "jump",
                        "behind": k,
                        "link_MBps": args.link_mbps or None,
                        "model_MiB": round(full_b / MiB, 1),
                        **{f"{n}_s": round(t, 3) for n, (t, _) in med.items()},
                        **{f"{n}_wire_MiB": round(b / MiB, 2) for n, (_, b) in med.items()},
                        "jump_wire_ratio": round(med["jump"][1] / full_b, 4),
                        "jump_time_ratio": round(med["jump"][0] / full_s, 4),
                        "chain_time_ratio": round(med["chain"][0] / full_s, 4),
                        "runs_s": {n: [round(t, 3) for t, _ in r] for n, r in rows.items()},
                        "history": tr.stats()["delta_history"],
                    }
                ),
                flush=True,
            )
    finally:
        tr.close()


REGION_NAMES = ["aws/us-east-1", "aws/us-west-2", "gcp/us-central1", "gcp/europe-west4", "aws/eu-west-1"]


def regions_once(url: str, regions: list[str], link_bps: float, cross_bps: float, parallel: int) -> tuple[float, list]:
    """One worker process per entry of `regions`, released at one instant; returns the time until
    all hold the version and each worker's pull stats."""
    t, recs = swarm_once(url, link_bps, parallel, [{"region": r, "cross_bps": cross_bps} for r in regions])
    return t, [r["stats"] for r in recs]


def bench_regions(args: argparse.Namespace) -> None:
    """Issue 17 item 4: workers in several regions, links fast inside a region and slow across it.
    Every node has a --link-mbps NIC each way; bytes a worker receives from another region (the
    trainer sits in a region of its own, so every trainer byte counts) also pass a --cross-mbps
    bucket of that worker. The region-aware tracker against the region-blind one (the tracker before
    this item), run by run in the same trainer process; 'single' is one worker pulling alone across
    regions, the unit of time."""
    nbytes, link, cross = args.mib * MiB, args.link_mbps * 1e6, args.cross_mbps * 1e6
    names = REGION_NAMES[: args.regions]
    workers = [r for r in names for _ in range(args.per_region)]
    tr = Trainer(nbytes, link, chunk_kib=args.chunk_kib)
    single: list[float] = []
    runs: dict[str, list[dict]] = {"blind": [], "aware": []}
    try:
        for _ in range(args.runs):  # interleaved, so load changes hit every variant alike
            tr.set_tracker(True)
            single.append(regions_once(tr.url, names[:1], link, cross, args.parallel)[0])
            for mode in runs:
                tr.set_tracker(mode == "aware")
                before = tr.stats()["egress_full_bytes"]
                t, stats = regions_once(tr.url, workers, link, cross, args.parallel)
                egress = tr.stats()["egress_full_bytes"] - before
                elsewhere = sum(st["from_peers_elsewhere"] for st in stats)
                runs[mode].append({"s": t, "egress": egress, "cross": egress + elsewhere})
                print(json.dumps({"mode": mode, **runs[mode][-1]}), file=sys.stderr, flush=True)
        one = statistics.median(single)
        for mode, rs in runs.items():
            t = statistics.median(r["s"] for r in rs)
            egress = statistics.median(r["egress"] for r in rs)
            print(
                json.dumps(
                    {
                        "bench": "regions",
                        "tracker": mode,
                        "mib": args.mib,
                        "link_MBps": args.link_mbps,
                        "cross_MBps": args.cross_mbps,
                        "workers": len(workers),
                        "regions": len(names),
                        "single_cross_s": round(one, 2),
                        "all_hold_s": round(t, 2),
                        "time_ratio": round(t / one, 2),
                        "egress_ratio": round(egress / nbytes, 2),
                        "egress_per_region": round(egress / nbytes / len(names), 2),
                        "cross_region_ratio": round(statistics.median(r["cross"] for r in rs) / nbytes, 2),
                        "runs_s": [round(r["s"], 2) for r in rs],
                        "single_runs_s": [round(x, 2) for x in single],
                    }
                ),
                flush=True,
            )
    finally:
        tr.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("single")
    p.add_argument("--gib", type=float, nargs="+", default=[1.0, 4.0])
    p.add_argument("--runs", type=int, default=3)
    p = sub.add_parser("publish")
    p.add_argument("--gib", type=float, nargs="+", default=[1.0])
    p.add_argument("--runs", type=int, default=3)
    p = sub.add_parser("fanout")
    p.add_argument("--mib", type=int, default=32)
    p.add_argument("--link-mbps", type=float, default=16)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--chunk-kib", type=int, default=1024)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--parallel", type=int, default=4)
    p = sub.add_parser("delta")
    p.add_argument("--mlp-params", type=int, default=64 << 20)
    p.add_argument("--link-mbps", type=float, default=0, help="0: loopback, no link limit")
    p.add_argument("--runs", type=int, default=3)
    p = sub.add_parser("delta-hf")
    p.add_argument("--layers", type=int, default=24, help="of Qwen2.5-0.5B's 24")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--chunk-kib", type=int, default=4096)
    p.add_argument("--link-mbps", type=float, nargs="+", default=[0, 100], help="0: loopback, no link limit")
    p.add_argument("--runs", type=int, default=3)
    p = sub.add_parser("kill")
    p.add_argument("--mib", type=int, default=32)
    p.add_argument("--chunk-kib", type=int, default=1024)
    p.add_argument("--link-mbps", type=float, default=16)
    p.add_argument("--runs", type=int, default=3)
    p = sub.add_parser("jump")
    p.add_argument("--layers", type=int, default=2, help="of Qwen2.5-0.5B's 24")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--behind", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--chunk-kib", type=int, default=4096)
    p.add_argument("--link-mbps", type=float, default=100, help="0: loopback, no link limit")
    p.add_argument("--runs", type=int, default=3)
    p = sub.add_parser("regions")
    p.add_argument("--mib", type=int, default=16)
    p.add_argument("--chunk-kib", type=int, default=256)
    p.add_argument("--link-mbps", type=float, default=16, help="every node's NIC, each way (in-region speed)")
    p.add_argument("--cross-mbps", type=float, default=2, help="a node's ingress from another region")
    p.add_argument("--regions", type=int, default=4)
    p.add_argument("--per-region", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--parallel", type=int, default=4)
    p = sub.add_parser("_serve")
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--ready", required=True)
    p.add_argument("--link-bps", type=float, default=0)
    p.add_argument("--model", default="synthetic")
    p.add_argument("--chunk-kib", type=int, default=4096)
    p.add_argument("--sha256-copy", type=int, default=0)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-6)
    p = sub.add_parser("_node")
    p.add_argument("--url", required=True)
    p.add_argument("--versions", type=int, nargs="+", default=[0])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--serve", type=int, default=0)
    p.add_argument("--id", default="bench")
    p.add_argument("--link-bps", type=float, default=0)
    p.add_argument("--start-at", type=float, default=0)
    p.add_argument("--hold", type=float, default=0)
    p.add_argument("--verify", type=int, default=1)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--reuse", type=int, default=0)
    p.add_argument("--prepare", type=int, default=0)
    p.add_argument("--region", default="")
    p.add_argument("--cross-bps", type=float, default=0)
    args = ap.parse_args()
    {
        "single": bench_single,
        "publish": bench_publish,
        "fanout": bench_fanout,
        "delta": bench_delta,
        "delta-hf": bench_delta_hf,
        "kill": bench_kill,
        "regions": bench_regions,
        "jump": bench_jump,
        "_serve": serve_main,
        "_node": node_main,
    }[args.cmd](args)


if __name__ == "__main__":
    main()
