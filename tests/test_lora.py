"""LoRA adapters (`model.lora`, rlboost/models/lora.py): only the adapters train and are published; an
engine merges them into the base weights it loaded, which must equal peft's own merge; a version's
delta/pull path carries the adapters only; checkpoints hold the adapters and resume exactly."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import torch

pytest.importorskip("peft")

from rlboost.contracts.engine import GenRequest
from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, SpecError, TaskSpec, parse_spec
from rlboost.models import lora
from rlboost.trainer.grpo import Sample
from rlboost.trainer.learner import Learner
from rlboost.weights.peer_server import WeightNode
from rlboost.weights.publisher import PublishOptions, WeightPublisher
from rlboost.weights.pull import PullOptions
from rlboost.worker.engines import make_engine
from testkit.hf_fixtures import make_tiny_model, write_math_jsonl
from tests.test_hf_model import generate
from tests.test_weight_delta import assert_same, serve
from tests.torch_threads import one_thread  # noqa: F401  (autouse: single-threaded torch)

LORA = {"rank": 4, "alpha": 16.0}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("lora")
    return make_tiny_model(tmp / "m"), write_math_jsonl(tmp / "d.jsonl")


def lora_learner(files, **algo) -> Learner:
    spec = ModelSpec(kind="hf", path=str(files[0]), dtype="float32", lora=LORA)
    task = TaskSpec(name="jsonl", path=files[1], reward="math_boxed")
    return Learner(spec, AlgorithmSpec(learning_rate=1e-2, **algo), task, device="cpu")


def randomise_b(learner: Learner, seed: int = 1) -> None:
    """peft starts lora_B at zero (the merge is then the base): give it values, as training would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in learner.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def engine_for(learner_files) -> object:
    spec = ModelSpec(kind="hf", path=str(learner_files[0]), dtype="float32", lora=LORA)
    return make_engine("torch", spec.model_dump(mode="json"), "auto", 8)


def some_samples(learner: Learner) -> list[Sample]:
    probs = learner.task.sample(np.random.default_rng(0), 2)
    good, bad = [40, 41, 42, learner.task.eos_id], [50, 51]
    return [Sample(p.prompt_ids, r, reward=float(r is good), group=i) for i, p in enumerate(probs) for r in (good, bad)]


def test_the_engine_merge_equals_peft_merge_and_unload(files) -> None:
    learner = lora_learner(files)
    randomise_b(learner)
    engine = engine_for(files)
    engine.load_weights(1, learner.state_dict())
    merged = copy.deepcopy(learner.model).merge_and_unload().state_dict()
    got = dict(engine.model.named_parameters())
    assert got.keys() <= merged.keys()
    changed = 0
    for name, p in got.items():
        assert torch.allclose(p, merged[name], rtol=0, atol=1e-6), name
        changed += not torch.equal(p, lora_base(files)[name])
    assert changed == 2 * 7  # 2 layers x (q, k, v, o, gate, up, down): all-linear, the head left out
    # and the engine generates what the learner scores, adapters included
    requests = [GenRequest(f"r{i}", p.prompt_ids, 10, seed=i) for i, p in
                enumerate(learner.task.sample(np.random.default_rng(1), 4))]
    ids, lps = generate(engine, requests)
    for r in requests:
        np.testing.assert_allclose(lps[r.rid], learner.logprobs(r.prompt, ids[r.rid]), rtol=0, atol=1e-4)


_BASE: dict = {}


def lora_base(files) -> dict[str, torch.Tensor]:
    if not _BASE:
        from transformers import AutoModelForCausalLM

        _BASE.update(AutoModelForCausalLM.from_pretrained(files[0], dtype=torch.float32).state_dict())
    return _BASE


@pytest.mark.filterwarnings("ignore:fan_in_fan_out is set to False")
def test_a_transposed_layer_merges_as_peft_does() -> None:
    """GPT-2's Conv1D stores its weight (in, out) (peft's fan_in_fan_out): published so that B @ A fits."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=32))
    model = lora.wrap(copy.deepcopy(base), lora.LoraSpec(rank=2, target_modules=["c_attn", "c_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    merger = lora.AdapterMerger(base, scale=2.0)
    merger.load(lora.adapter_tensors(model))
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    for name, p in base.named_parameters():
        assert torch.allclose(p, want[name], rtol=0, atol=1e-6), name


def test_version_zero_is_the_base_and_only_adapters_train_and_publish(files) -> None:
    learner = lora_learner(files)
    published = learner.state_dict()
    assert published and all(k.endswith((lora.A_SUFFIX, lora.B_SUFFIX)) for k in published)
    trained = [p for group in learner.optimizer.param_groups for p in group["params"]]
    assert sum(p.numel() for p in trained) == sum(t.numel() for t in published.values())
    engine = engine_for(files)
    engine.load_weights(0, published)
    base = lora_base(files)
    assert all(torch.equal(p, base[n]) for n, p in engine.model.named_parameters())  # B = 0: the base
    with pytest.raises(ValueError, match="not a LoRA adapter"):
        engine.load_weights(1, {"model.norm.weight": torch.ones(128)})
    bad = dict(published)
    bad.pop(next(k for k in bad if k.endswith(lora.B_SUFFIX)))
    with pytest.raises(ValueError, match="pairs"):
        engine.load_weights(1, bad)
    assert engine.version == 0


def test_a_version_is_far_smaller_than_the_model_and_its_delta_pulls_exactly(files) -> None:
    """Publish v0 and v1 (after a real GRPO step), pull v0 in full and v1 as a sparse delta, and load
    each into an engine: its weights are the learner's merged ones."""
    learner = lora_learner(files)
    v0 = learner.state_dict()
    learner.train_step(some_samples(learner))
    v1 = learner.state_dict()
    full_bytes = sum(t.numel() * t.element_size() for t in lora_base(files).values())
    pub = WeightPublisher(PublishOptions(chunk_bytes=16 * 1024))
    m0 = pub.publish(0, v0)
    m1 = pub.publish(1, v1)
    assert {t.name for t in m1.tensors} == set(v1)
    assert m1.total_bytes == sum(t.numel() * 4 for t in v1.values()) and m1.total_bytes * 10 < full_bytes

    async def go() -> tuple:
        async with serve(pub) as url, aiohttp.ClientSession() as s:
            node = WeightNode(PullOptions(token="t", peer_id="w"), serve=None)
            got0 = await node.pull(url, 0, s)
            got1 = await node.pull(url, 1, s)
            return got0, got1, node.last

    got0, got1, st = asyncio.run(go())
    assert_same(v1, got1)
    assert st.mode == "delta" and 0 < st.delta_bytes < m0.total_bytes
    engine = engine_for(files)
    engine.load_weights(0, got0)
    engine.load_weights(1, got1)
    merged = copy.deepcopy(learner.model).merge_and_unload().state_dict()
    for name, p in engine.model.named_parameters():
        assert torch.allclose(p, merged[name], rtol=0, atol=1e-6), name


def test_kl_reference_is_the_base_and_a_checkpoint_holds_adapters_and_resumes_exactly(files) -> None:
    learner = lora_learner(files, kl_coef=0.1)
    samples = some_samples(learner)
    assert learner.train_step(samples)["kl"] == 0.0  # B = 0: the policy is the base at first
    m = learner.train_step(samples)
    assert np.isfinite(m["loss"]) and m["kl"] > 0  # the adapters moved off the base
    ref = learner.reference
    assert ref is not None and not list(ref.parameters())  # no second copy of the weights
    s = samples[0]
    with torch.no_grad():
        got, _, _ = learner._response_logp([s.prompt_ids], [s.response_ids], 1.0, model=ref)
    base_learner = Learner(ModelSpec(kind="hf", path=str(files[0]), dtype="float32"), AlgorithmSpec(),
                           TaskSpec(name="jsonl", path=files[1], reward="math_boxed"), device="cpu")
    want = base_learner.logprobs(s.prompt_ids, s.response_ids)
    np.testing.assert_allclose(got[0, -len(s.response_ids):].tolist(), want, rtol=0, atol=1e-5)

    state = learner.checkpoint_state()
    assert set(state["model"]) == {k for k, p in learner.model.named_parameters() if p.requires_grad}
    resumed = lora_learner(files, kl_coef=0.1)
    resumed.load_checkpoint_state(state)
    assert_same(learner.state_dict(), resumed.state_dict())
    a, b = learner.train_step(samples), resumed.train_step(samples)
    assert a["loss"] == b["loss"]
    assert_same(learner.state_dict(), resumed.state_dict())


HF_JOB = {
    "name": "lora-job",
    "model": {"kind": "hf", "path": "m", "lora": {"rank": 8}},
    "task": {"name": "jsonl", "path": "d.jsonl"},
    "rollout": {"max_workers": 0},
}


@pytest.mark.parametrize(
    "over,message",
    [
        ({"model": {"kind": "tiny-gpt", "lora": {"rank": 8}}, "task": {"name": "add"}},
         "model: lora: apply to kind: hf only"),
        ({"rollout": {"engine": "vllm", "max_workers": 0}}, "model.lora with rollout.engine vllm: not yet"),
        ({"trainer": {"strategy": "fsdp"}}, "model.lora with trainer.strategy fsdp"),
        ({"model": {"kind": "hf", "path": "m", "lora": {"rank": 0}}}, "model.lora.rank"),
        ({"model": {"kind": "hf", "path": "m", "lora": {"rank": 4, "target_modules": []}}}, "target_modules"),
    ],
)
def test_job_file_rules(over: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec({**HF_JOB, **over})
    spec = parse_spec(HF_JOB)
    assert spec.model.lora is not None and spec.model.lora.scale == 2.0
