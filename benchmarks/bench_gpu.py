"""The CUDA paths, run by hand on a machine with one NVIDIA GPU (never by the test suite).

    python benchmarks/bench_gpu.py parts --out parts.json   # components, one process
    python benchmarks/bench_gpu.py job --policy predictive    # a whole local job on the GPU

The model is Qwen2.5-0.5B's architecture (24 layers, hidden 896, 14 heads / 2 KV heads, MLP 4864,
vocabulary 151,936, tied embeddings: 494 M parameters) with random weights and a tokenizer trained
here (nothing is downloaded); `--small` swaps in a 2-layer model so the script can be tried on a CPU.
Without a CUDA GPU (and without `--small`) it prints that it skipped and exits 0; `--smoke` runs either
command at its smallest size (the CI smoke tier, tests/test_benchmarks_smoke.py).

`parts` measures, on the GPU:
- the torch engine in bf16: generated tokens/s at two batch sizes, and whether a response continued
  from a half-way prefix (a migration) gets the tokens of its uninterrupted run;
- the hf learner (fp32 master weights, bf16 autocast): the streamed update (begin_step / add_groups /
  finish_step, groups fed in four chunks) against the whole-batch train_step from the same weights:
  time, trained tokens/s and the largest parameter difference;
- a weight version into GPU memory: the learner's published bf16 tensors (host) -> engine.load_weights,
  and the same bytes through safetensors (what a pull hands the engine);
- NCCL between two processes: on one GPU both ranks share the device, which NCCL refuses (the reason
  weights.transports.torch_broadcast.backend_for picks gloo for the local provider); this records what happens.

`--profile FILE` adds a torch.profiler table of 16 decode steps at batch 256 (FILE) and a cProfile
table of the same (FILE with .py.txt); `--skip-nccl` leaves out the NCCL check.

`spec` measures grouped speculative decoding in a step's tail (issue 38): G groups of S responses, the
last of each generated with `none`, `group` and `ngram` drafting while its S - 1 siblings' tokens ride
along as the coordinator sends them; seconds, tokens per row and decode pass, drafted / accepted, whether
every response equals `none`'s, and the pass cost the engine measured by tokens fed. A random model is
not confident, so the final norm is scaled (`--alphas`) and the sampled tokens' mean entropy reported.

    python benchmarks/bench_gpu.py spec --new-tokens 128 --alphas 20 40 --dtypes bfloat16 float32 --full-step

`job` runs `rlboost launch` on a local job with this model: the trainer (hf learner on the GPU, its own
torch engine) and two local "spot" workers (torch engine on the same GPU), weights to the workers over
the chosen transport, the built-in spot trace with preemptions (time_scale 360). It prints the launch's
output and the cost report, and writes `rlboost status --json`, the cost report and every process's log
to `job-<policy>.txt` under `--out`. A launch past `--timeout` is killed and `rlboost gc` ends its processes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QWEN05 = {  # Qwen/Qwen2.5-0.5B-Instruct config.json
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
}
SMALL = QWEN05 | {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2}
SMALL |= {"num_key_value_heads": 1, "vocab_size": 4096}


def make_model(out: Path, small: bool) -> Path:
    """A random Qwen2 of the chosen shape, saved in bf16 with a locally trained tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from testkit.hf_fixtures import make_tokenizer

    tok = make_tokenizer()
    cfg = Qwen2Config(
        **(SMALL if small else QWEN05),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(engine, reqs, on_tokens) -> float:
    """Seconds of one generate call, the GPU's queue drained before and after."""
    _sync()
    t0 = time.perf_counter()
    engine.generate(reqs, on_tokens, lambda rid: False)
    _sync()
    return time.perf_counter() - t0


def _prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(10, min(vocab, 300), size=length).tolist() for _ in range(n)]


def engine_parts(spec, new_tokens: int, batches: list[int]) -> tuple[dict, object]:
    from rlboost.contracts.engine import GenRequest
    from rlboost.models.torch_engine import TorchEngine

    out: dict = {}
    engine = TorchEngine(spec, dtype="bfloat16", max_batch=max(batches))
    out["engine_device"] = str(engine.device)
    vocab = engine.model.config.vocab_size
    for b in batches:
        reqs = [GenRequest(f"r{i}", p, new_tokens, seed=i) for i, p in enumerate(_prompts(b, 64, vocab))]
        got: dict[str, list[int]] = {r.rid: [] for r in reqs}

        def on_tokens(rid, offset, ids, lps, got=got):
            got[rid].extend(ids)

        warm = [GenRequest(r.rid, r.prompt, 8, r.seed) for r in reqs]
        engine.generate(warm, lambda *a: None, lambda rid: False)  # warm-up at this batch's shape
        dt = _timed(engine, reqs, on_tokens)
        n = sum(len(v) for v in got.values())
        out[f"batch{b}"] = {"tokens": n, "seconds": round(dt, 3), "tokens_per_s": round(n / dt, 1)}
        if b == batches[-1]:  # a migration: continue each response from its first half
            half = new_tokens // 2
            moved = [
                GenRequest(r.rid, r.prompt, len(got[r.rid]) - half, r.seed, prefix=got[r.rid][:half])
                for r in reqs
                if len(got[r.rid]) > half
            ]
            cont: dict[str, list[int]] = {r.rid: list(r.prefix) for r in moved}
            engine.generate(moved, lambda rid, off, ids, lps, cont=cont: cont[rid].extend(ids), lambda rid: False)
            same = sum(cont[r.rid] == got[r.rid] for r in moved)
            first_diff = [
                next((i for i, (a, c) in enumerate(zip(got[r.rid], cont[r.rid])) if a != c), None) for r in moved
            ]
            out["migration"] = {
                "responses": len(moved),
                "identical": same,
                "first_divergence_positions": sorted(d for d in first_diff if d is not None)[:20],
            }
    return out, engine


def learner_parts(spec, groups: int, group_size: int, resp_len: int) -> tuple[dict, object]:
    import numpy as np
    import torch

    from rlboost.contracts.spec import AlgorithmSpec, TaskSpec
    from rlboost.trainer.grpo import Sample
    from rlboost.trainer.learner import Learner

    task = TaskSpec(name="jsonl", path=ROOT / "examples/data/math-sample.jsonl", reward="math_boxed")
    algo = AlgorithmSpec(learning_rate=1e-5, max_new_tokens=resp_len, micro_batch_size=16, seed=0)

    def fresh() -> Learner:
        torch.manual_seed(0)
        learner = Learner(spec, algo, task, seed=0)
        # SGD for the comparison: Adam's first steps are ~lr * sign(grad), which turns float noise in a
        # near-zero gradient into a full-size step (tests/test_streaming_learner.py does the same)
        learner.optimizer = torch.optim.SGD(learner.model.parameters(), lr=1e-2)
        return learner

    rng = np.random.default_rng(0)
    vocab = 300
    samples = []
    for g in range(groups):
        prompt = rng.integers(10, vocab, size=64).tolist()
        for k in range(group_size):
            n = int(rng.integers(resp_len // 4, resp_len + 1))
            samples.append(Sample(prompt, rng.integers(10, vocab, size=n).tolist(), float((g + k) % 3 == 0), g))
    tokens = sum(len(s.response_ids) for s in samples)
    out: dict = {}
    whole, streamed = fresh(), fresh()
    out["learner_device"] = str(whole.device)
    start = {k: v.detach().clone() for k, v in whole.model.state_dict().items()}
    for learner in (whole, streamed):  # warm-up at the timed shapes (kernels, allocator)
        learner.train_step(samples)
        learner.model.load_state_dict(start)
    _sync()
    t0 = time.perf_counter()
    m_whole = whole.train_step(samples)
    _sync()
    dt_whole = time.perf_counter() - t0
    t0 = time.perf_counter()
    streamed.begin_step(token_budget=len(samples) * resp_len)
    for chunk in np.array_split(np.arange(groups), 4):
        streamed.add_groups([s for s in samples if s.group in set(chunk.tolist())])
    m_streamed = streamed.finish_step()
    _sync()
    dt_streamed = time.perf_counter() - t0
    a, b = whole.model.state_dict(), streamed.model.state_dict()
    diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    moved = max(float((a[k].float() - v.float()).abs().max()) for k, v in start.items())
    out["train"] = {
        "responses": len(samples),
        "response_tokens": tokens,
        "whole_s": round(dt_whole, 3),
        "streamed_s": round(dt_streamed, 3),
        "whole_tokens_per_s": round(tokens / dt_whole, 1),
        "streamed_tokens_per_s": round(tokens / dt_streamed, 1),
        "max_param_diff_streamed_vs_whole": diff,
        "max_param_change_from_init": moved,
        "loss_whole": m_whole["loss"],
        "loss_streamed": m_streamed["loss"],
        "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20) if torch.cuda.is_available() else None,
    }
    return out, streamed


def load_parts(learner, engine) -> dict:
    import safetensors.torch
    import torch

    _sync()
    t0 = time.perf_counter()  # how Learner.state_dict published before (cast on the way to the host)
    old = {k: v.detach().to("cpu", learner.publish_dtype).clone() for k, v in learner.model.named_parameters()}
    dt_old = time.perf_counter() - t0
    t0 = time.perf_counter()
    tensors = learner.state_dict()  # what the trainer publishes
    dt_publish = time.perf_counter() - t0
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    same_publish = all(torch.equal(old[k], tensors[k]) for k in tensors)

    def timed_loads(src: dict) -> list[float]:
        times = []
        for v in range(3):
            _sync()
            t0 = time.perf_counter()
            engine.load_weights(v + 1, src)
            _sync()
            times.append(time.perf_counter() - t0)
        return times

    pageable = timed_loads(tensors)
    pinned = timed_loads({k: v.pin_memory() for k, v in tensors.items()}) if torch.cuda.is_available() else []
    blob = safetensors.torch.save(tensors)
    _sync()
    t0 = time.perf_counter()
    engine.load_weights(9, safetensors.torch.load(blob))
    _sync()
    dt_st = time.perf_counter() - t0
    same = all(bool((p.detach().cpu() == tensors[k]).all()) for k, p in engine.model.named_parameters() if k in tensors)
    return {
        "weights_mib": round(nbytes / 2**20, 1),
        "publish_cast_on_host_s": round(dt_old, 3),
        "publish_s": round(dt_publish, 3),
        "publish_identical": same_publish,
        "load_s": [round(t, 3) for t in pageable],
        "load_gb_per_s": round(nbytes / min(pageable) / 1e9, 2),
        "load_pinned_gb_per_s": round(nbytes / min(pinned) / 1e9, 2) if pinned else None,
        "safetensors_decode_and_load_s": round(dt_st, 3),
        "engine_holds_published_weights": same,
    }


def profile_decode(engine, path: Path, batch: int = 256, new_tokens: int = 16) -> dict:
    """Where a decode step's time goes: torch.profiler over one generate call (prefill + new_tokens),
    written to `path`, and cProfile over another (the Python side), written beside it (.py.txt)."""
    import cProfile
    import io
    import pstats

    import torch
    from torch.profiler import ProfilerActivity, profile

    from rlboost.contracts.engine import GenRequest

    vocab = engine.model.config.vocab_size
    reqs = [GenRequest(f"p{i}", p, new_tokens, seed=i) for i, p in enumerate(_prompts(batch, 64, vocab, seed=1))]
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    _sync()
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        engine.generate(reqs, lambda *a: None, lambda rid: False)
        _sync()
    wall = time.perf_counter() - t0
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    with cProfile.Profile() as py:  # the Python side: where the step's non-kernel time goes
        engine.generate(reqs, lambda *a: None, lambda rid: False)
        _sync()
    stats = io.StringIO()
    pstats.Stats(py, stream=stats).sort_stats("tottime").print_stats(30)
    path.with_suffix(".py.txt").write_text(stats.getvalue())
    path.write_text(
        f"batch {batch}, {new_tokens} tokens, {wall:.3f} s under the profiler\n"
        + prof.key_averages().table(sort_by=key, row_limit=25)
        + "\n"
        + prof.key_averages().table(sort_by="cpu_time_total", row_limit=25)
    )
    return {"profiled_batch": batch, "profiled_tokens": new_tokens, "profiled_wall_s": round(wall, 3)}


NCCL_CHILD = """
import os, torch, torch.distributed as dist
rank = int(os.environ["RANK"])
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", 0))
t = torch.full((1 << 20,), float(rank), device="cuda")
dist.broadcast(t, src=0)
torch.cuda.synchronize()
print("rank", rank, "broadcast ok", float(t[0]))
dist.destroy_process_group()
"""


def nccl_part(timeout: float = 45.0) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "no GPU"}
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533", "NCCL_DEBUG": "WARN"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", NCCL_CHILD],
            env=env | {"RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    res = {}
    for r, p in enumerate(procs):
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            text = "timed out"
        res[f"rank{r}"] = {"rc": p.returncode, "tail": text.strip().splitlines()[-3:] if text else []}
    return res


def parts(args: argparse.Namespace) -> None:
    import torch

    from rlboost.contracts.spec import ModelSpec

    info = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        spec = ModelSpec(kind="hf", path=str(make_model(Path(d) / "m", args.small)), dtype="bfloat16")
        info["make_model_s"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(info), flush=True)
        eng, engine = engine_parts(spec, args.new_tokens, args.batches)
        print(json.dumps(eng), flush=True)
        info |= eng
        lrn, learner = learner_parts(spec, args.groups, args.group_size, args.new_tokens)
        print(json.dumps(lrn), flush=True)
        info |= lrn
        info["load"] = load_parts(learner, engine)
        print(json.dumps(info["load"]), flush=True)
        if args.profile:
            info["profile"] = profile_decode(engine, args.profile)
            print(json.dumps(info["profile"]), flush=True)
        del learner, engine
    if not args.skip_nccl:
        info["nccl_two_ranks_one_gpu"] = nccl_part()
        print(json.dumps(info["nccl_two_ranks_one_gpu"]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(info, indent=2))


def _spec_engine(spec, dtype: str, method: str, max_tokens: int, rows: int, alpha: float):
    """A torch engine whose final norm is scaled by alpha, so that its random weights sample with a trained
    policy's confidence (the mean per-token entropy is measured and reported, not assumed); the decode
    passes are counted."""
    import torch

    from rlboost.contracts.spec import SpeculativeSpec
    from rlboost.models.torch_engine import TorchEngine

    drafting = SpeculativeSpec(method=method, max_tokens=max_tokens)
    engine = TorchEngine(spec, dtype=dtype, max_batch=rows, speculative=drafting)
    norm = next(p for n, p in engine.model.named_parameters() if n.endswith("norm.weight") and ".layers." not in n)
    with torch.no_grad():
        norm.mul_(alpha)
    engine.passes = 0  # type: ignore[attr-defined]
    forward = engine._forward

    def counted(*a, **k):
        engine.passes += 1  # type: ignore[attr-defined]
        return forward(*a, **k)

    engine._forward = counted  # type: ignore[method-assign]
    return engine


def _timed_generate(engine, reqs) -> dict:
    got: dict[str, list[int]] = {r.rid: [] for r in reqs}
    nll: list[float] = []

    def on_tokens(rid, offset, ids, lps):
        got[rid].extend(ids)
        nll.extend(-lp for lp in lps)

    engine.passes = 0
    dt = _timed(engine, reqs, on_tokens)
    n = sum(len(v) for v in got.values())
    drafted = sum(c.drafted for c in engine.drafts.values())
    accepted = sum(c.accepted for c in engine.drafts.values())
    engine.drafts.clear()
    return {
        "tokens": got,
        "seconds": round(dt, 3),
        "tokens_per_s": round(n / dt, 1),
        "passes": engine.passes,
        # per row and decode pass (the first pass is the prefill): 1.0 without drafts
        "tokens_per_row_pass": round(n / len(reqs) / max(1, engine.passes - 1), 2),
        "drafted": drafted,
        "accepted": accepted,
        "entropy_nats": round(sum(nll) / max(1, len(nll)), 3),
    }


def spec_parts(args: argparse.Namespace) -> None:
    """Grouped speculative decoding on the GPU (issue 38, part 7); see `_spec_config`."""
    import torch

    from rlboost.contracts.spec import ModelSpec

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    info: dict = {"torch": torch.__version__, "gpu": gpu, "groups": args.groups, "group_size": args.group_size}
    info |= {"new_tokens": args.new_tokens, "max_tokens": args.max_tokens}
    with tempfile.TemporaryDirectory() as d:
        spec = ModelSpec(kind="hf", path=str(make_model(Path(d) / "m", args.small)), dtype="bfloat16")
        for dtype in args.dtypes:
            for alpha in args.alphas if dtype == args.dtypes[0] else args.alphas[:1]:
                info[f"{dtype}-alpha{alpha:g}"] = _spec_config(spec, dtype, alpha, args)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps(info, indent=2))


def _spec_config(spec, dtype: str, alpha: float, args: argparse.Namespace) -> dict:
    """G groups of S responses; a step's tail is the last response of each group, its S - 1 siblings
    already generated (plain, one batch) and sent with it as GenRequest.siblings, as the coordinator
    sends them. The tail (G rows) is generated with each method on a fresh engine (its pass costs
    measured from nothing), then, at the first alpha, the whole step (G x S rows, no sibling done) with
    --step-methods (none twice: whether two fresh engines give the same tokens). Reports seconds, tokens
    per row and decode pass, drafted / accepted, whether every response equals `none`'s, and the pass
    cost the engine measured by tokens fed."""
    from rlboost.contracts.engine import GenRequest

    g, s, new, key = args.groups, args.group_size, args.new_tokens, f"{dtype}-alpha{alpha:g}"
    res: dict = {}
    eng = _spec_engine(spec, dtype, "none", args.max_tokens, g * s, alpha)
    prompts = _prompts(g, 64, eng.model.config.vocab_size, seed=1)

    def req(i: int, j: int, sib: list[list[int]] | None = None) -> GenRequest:
        return GenRequest(f"g{i}s{j}", prompts[i], new, seed=1000 * i + j, group=f"g{i}", siblings=sib or [])

    def fresh(method: str):
        e = _spec_engine(spec, dtype, method, args.max_tokens, g * s, alpha)
        e.generate([GenRequest("w", prompts[0], 4, seed=0)], lambda *a: None, lambda rid: False)
        return e

    def record(name: str, out: dict, base: dict) -> None:
        same = [out["tokens"][r] == base["tokens"][r] for r in base["tokens"]]
        row = {k: v for k, v in out.items() if k != "tokens"}
        row |= {"identical_to_none": f"{sum(same)}/{len(same)}"}
        row |= {"speedup_vs_none": round(base["seconds"] / out["seconds"], 2)}
        res[name] = row
        print(json.dumps({key: {name: row}}), flush=True)

    # warm-up at the full batch's shape (CUDA's lazy loading and kernel choice: the first config's
    # timings were 3x slow without it)
    warm = [GenRequest(f"w{i}", prompts[i % g], 32, seed=i) for i in range(g * s)]
    eng.generate(warm, lambda *a: None, lambda rid: False)
    sib = _timed_generate(eng, [req(i, j) for i in range(g) for j in range(s - 1)])
    res["siblings_plain"] = {k: v for k, v in sib.items() if k != "tokens"}
    siblings = {i: [sib["tokens"][f"g{i}s{j}"] for j in range(s - 1)] for i in range(g)}
    tail = [req(i, s - 1, siblings[i]) for i in range(g)]
    base = None
    for method in args.methods:
        e = eng if method == "none" else fresh(method)
        out = _timed_generate(e, tail)
        if args.again:  # the same tail again on this engine: every shape met once already
            out = _timed_generate(e, tail)
        base = base or out
        record(f"tail-{method}", out, base)
        res[f"tail-{method}"]["pass_cost_ms"] = {n: round(1000 * t, 2) for n, t in sorted(e.pass_cost.seen.items())}
    if args.full_step and alpha == args.alphas[0]:
        step_base = None
        for n, method in enumerate(args.step_methods):
            out = _timed_generate(fresh(method), [req(i, j) for i in range(g) for j in range(s)])
            step_base = step_base or out
            record(f"step{n}-{method}", out, step_base)
    return res


REWARD = """
def score(prompt, response, row):
    # a random model answers nothing right: reward length up to 40 characters, so groups differ
    return min(len(response), 40) / 40
"""


def job(args: argparse.Namespace) -> None:
    import yaml

    tmp = Path(tempfile.mkdtemp(prefix="bench-gpu-job-"))
    make_model(tmp / "model", args.small)
    (tmp / "pkg").mkdir()
    (tmp / "pkg" / "gpu_bench_reward.py").write_text(REWARD)
    spec = {
        "name": f"gpu-{args.policy}",
        "provider": "local",
        "model": {"kind": "hf", "path": str(tmp / "model"), "dtype": "bfloat16", "max_model_len": 1024},
        "algorithm": {
            "prompts_per_step": args.prompts,
            "group_size": args.group_size,
            "max_new_tokens": args.new_tokens,
            "steps": args.steps,
            "warm_start_steps": 0,
            "learning_rate": 1e-6,
            "micro_batch_size": 16,
            "temperature": 1.0,
        },
        "task": {
            "name": "jsonl",
            "path": str(ROOT / "examples/data/math-sample.jsonl"),
            "reward": "gpu_bench_reward:score",
        },
        "trainer": {"cloud": "local", "accelerators": "A100:8", "hourly_price": 32.7726},
        "rollout": {
            "engine": "torch",
            "engine_batch": args.engine_batch,
            "max_workers": args.workers,
            "offload_policy": args.policy,
            "candidates": [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.443, "on_demand_price": 3.673}],
        },
        "weights": {"transport": args.transport},
        "local": {"time_scale": 360, "notice_seconds": 1.0, "notice_fraction": 0.5},
    }
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    home = tmp / "home"
    env = {**os.environ, "RLBOOST_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(tmp / "pkg"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cli = [sys.executable, "-m", "rlboost.cli.main"]
    t0 = time.perf_counter()
    launch = subprocess.Popen(
        [*cli, "launch", str(path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        text, _ = launch.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(launch.pid, signal.SIGKILL)
        text = launch.communicate()[0] + f"\n(cut off after {args.timeout:.0f} s)"
        # the trainer and workers run in sessions of their own: the job's orphans now, as a user would
        gc = subprocess.run([*cli, "gc", "--wait", "60"], env=env, capture_output=True, text=True)
        text += "\n" + gc.stdout + gc.stderr
    wall = time.perf_counter() - t0
    print(text[-4000:], flush=True)
    status = subprocess.run([*cli, "status", spec["name"], "--json"], env=env, capture_output=True, text=True)
    report = subprocess.run([*cli, "cost-report", spec["name"]], env=env, capture_output=True, text=True)
    print(report.stdout, flush=True)
    print(f"launch rc {launch.returncode}, {wall:.1f} s wall", flush=True)
    if args.out:  # one file per run
        logs = "\n".join(f"==== {p.relative_to(home)}\n{p.read_text()[-6000:]}" for p in sorted(home.rglob("log")))
        (args.out / f"job-{args.policy}.txt").write_text(f"{status.stdout}\n==== cost-report\n{report.stdout}\n{logs}")


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("parts")
    p.add_argument("--small", action="store_true")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    p.add_argument("--groups", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--out", type=Path)
    p.add_argument("--profile", type=Path, help="write a torch.profiler table of decode steps here")
    p.add_argument("--skip-nccl", action="store_true")
    j = sub.add_parser("job")
    j.add_argument("--small", action="store_true")
    j.add_argument("--policy", default="predictive")
    j.add_argument("--transport", default="auto")
    j.add_argument("--prompts", type=int, default=32)
    j.add_argument("--group-size", type=int, default=8)
    j.add_argument("--new-tokens", type=int, default=256)
    j.add_argument("--steps", type=int, default=5)
    j.add_argument("--workers", type=int, default=2)
    j.add_argument("--engine-batch", type=int, default=128)
    j.add_argument("--timeout", type=float, default=600)
    j.add_argument("--out", type=Path)
    sp_ = sub.add_parser("spec", help="grouped speculative decoding in a step's tail (issue 38 part 7)")
    sp_.add_argument("--small", action="store_true")
    sp_.add_argument("--groups", type=int, default=8)
    sp_.add_argument("--group-size", type=int, default=8)
    sp_.add_argument("--new-tokens", type=int, default=256)
    sp_.add_argument("--max-tokens", type=int, default=8, help="rollout.speculative.max_tokens (K)")
    sp_.add_argument("--alphas", type=float, nargs="+", default=[12.0, 24.0], help="final-norm scales (confidence)")
    sp_.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], help="float32: the first alpha only")
    sp_.add_argument("--methods", nargs="+", default=["none", "group", "ngram"])
    sp_.add_argument("--full-step", action="store_true", help="also the whole step (G x S rows), first alpha")
    sp_.add_argument("--step-methods", nargs="+", default=["none", "none", "group"], help="(none twice: determinism)")
    sp_.add_argument("--again", action="store_true", help="time each tail's second run on its engine")
    sp_.add_argument("--out", type=Path)
    for sp in (p, j, sp_):
        sp.add_argument("--smoke", action="store_true", help="the smallest sizes (CI's smoke tier); needs a GPU too")
    args = ap.parse_args()
    import torch

    if not args.small and not torch.cuda.is_available():
        # CI and CPU machines: nothing to measure, and not a failure (`--small` tries it on the CPU)
        print("bench_gpu: no CUDA GPU here (torch.cuda.is_available() is False): skipped", flush=True)
        return
    if args.smoke:
        args.small = True
        args.new_tokens, args.group_size = 8, 2
        if args.cmd == "parts":
            args.batches, args.groups, args.skip_nccl = [2, 4], 2, True
        elif args.cmd == "spec":
            args.groups, args.alphas, args.dtypes = 2, args.alphas[:1], args.dtypes[:1]
        else:
            args.prompts, args.steps, args.engine_batch, args.timeout = 2, 2, 8, min(args.timeout, 300)
    {"parts": parts, "job": job, "spec": spec_parts}[args.cmd](args)


if __name__ == "__main__":
    main()
