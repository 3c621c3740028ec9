"""Hugging Face causal LMs (`model: {kind: hf}`): learner and torch engine agree, chat-template
prompts, the jsonl task's reward, and the job-file rules for hf models and datasets."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("transformers")

from rlboost.contracts.engine import GenRequest
from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, SpecError, TaskSpec, load_spec, parse_spec
from rlboost.trainer.grpo import Sample
from rlboost.trainer.learner import Learner
from rlboost.trainer.tasks import JsonlTask, make_task
from rlboost.worker.engines import make_engine
from testkit.hf_fixtures import make_tiny_model, write_math_jsonl
from tests.torch_threads import one_thread  # noqa: F401  (autouse: single-threaded torch)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("hf")
    return make_tiny_model(tmp / "m"), make_tiny_model(tmp / "tied", tie=True), write_math_jsonl(tmp / "d.jsonl")


def specs(model_dir: Path, data: Path) -> tuple[ModelSpec, TaskSpec]:
    return ModelSpec(kind="hf", path=str(model_dir), dtype="float32"), TaskSpec(
        name="jsonl", path=data, reward="math_boxed"
    )


def generate(engine, requests):
    ids = {r.rid: [] for r in requests}
    lps = {r.rid: [] for r in requests}

    def on_tokens(rid, off, new, lp):
        ids[rid].extend(new)
        lps[rid].extend(lp)

    engine.generate(requests, on_tokens, lambda rid: False, 1.0)
    return ids, lps


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_published_weights_are_host_copies_in_the_model_dtype(files, dtype: str) -> None:
    """state_dict casts, then copies: what the trainer serves never aliases the master weights (a
    float32 model's cast is a no-op, so without the copy a later update would rewrite a served version)."""
    _, task_spec = specs(files[0], files[2])
    learner = Learner(ModelSpec(kind="hf", path=str(files[0]), dtype=dtype), AlgorithmSpec(), task_spec, device="cpu")
    published = learner.state_dict()
    params = dict(learner.model.named_parameters())
    assert published.keys() == params.keys()
    for name, t in published.items():
        assert t.device.type == "cpu" and t.dtype == getattr(torch, dtype) and t.is_contiguous()
        assert torch.equal(t, params[name].detach().to(t.dtype))
    before = {k: v.clone() for k, v in published.items()}
    with torch.no_grad():
        for p in params.values():
            p.add_(1.0)
    assert all(torch.equal(published[k], before[k]) for k in published)


@pytest.mark.parametrize("tied", [False, True])
def test_engine_logprobs_match_the_learner(files, tied: bool) -> None:
    model_spec, task_spec = specs(files[1] if tied else files[0], files[2])
    learner = Learner(model_spec, AlgorithmSpec(), task_spec, device="cpu")
    weights = learner.state_dict()
    assert ("lm_head.weight" in weights) != tied  # a tied head is published once, as the embedding
    engine = make_engine("torch", model_spec.model_dump(mode="json"), "auto", 8)
    assert engine.dtype == torch.float32
    engine.load_weights(0, weights)
    task = learner.task
    requests = [
        GenRequest(f"r{i}", p.prompt_ids, 12, seed=i) for i, p in enumerate(task.sample(np.random.default_rng(1), 6))
    ]
    ids, lps = generate(engine, requests)
    for r in requests:
        np.testing.assert_allclose(lps[r.rid], learner.logprobs(r.prompt, ids[r.rid]), rtol=0, atol=1e-4)


def test_left_padded_batches_have_finite_loss_and_a_grpo_step_moves_toward_reward(files) -> None:
    model_spec, task_spec = specs(files[0], files[2])
    learner = Learner(model_spec, AlgorithmSpec(learning_rate=1e-2), task_spec, device="cpu")
    task = learner.task
    probs = task.sample(np.random.default_rng(0), 2)
    good, bad = [40, 41, 42, task.eos_id], [50, 51]
    samples = [
        Sample(p.prompt_ids, r, reward=float(r is good), group=i) for i, p in enumerate(probs) for r in (good, bad)
    ]
    before = [learner.logprobs(p.prompt_ids, good) for p in probs]
    metrics = learner.train_step(samples)
    assert np.isfinite(metrics["loss"]) and metrics["tokens"] == 12
    after = [learner.logprobs(p.prompt_ids, good) for p in probs]
    assert all(sum(a) > sum(b) for a, b in zip(after, before, strict=True))


def test_jsonl_task_uses_the_chat_template_and_scores_boxed_answers(files) -> None:
    model_spec, task_spec = specs(files[0], files[2])
    task = make_task(task_spec, model_spec)
    assert isinstance(task, JsonlTask)
    p = task.sample(np.random.default_rng(0), 1)[0]
    text = task.decode(p.prompt_ids)
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
    assert "\\boxed{}" in text  # the instruction
    right = task.tokenizer.encode(f"so \\boxed{{{p.answer}}}", add_special_tokens=False)
    assert task.reward(p, [*right, task.eos_id]) == 1.0
    assert task.reward(p, task.tokenizer.encode("\\boxed{nope}", add_special_tokens=False)) == 0.0
    plain = make_task(task_spec.model_copy(update={"chat_template": "off", "instruction": None}), model_spec)
    assert plain.decode(plain.sample(np.random.default_rng(0), 1)[0].prompt_ids) == p.text


def test_task_needs_an_hf_model(files) -> None:
    with pytest.raises(ValueError, match="needs an hf model"):
        make_task(specs(files[0], files[2])[1])


def job(**over) -> dict:
    base = {
        "name": "hf-job",
        "model": {"kind": "hf", "path": "org/model"},
        "task": {"name": "jsonl", "path": "d.jsonl"},
        "rollout": {"max_workers": 0},
    }
    for k, v in over.items():
        base[k] = {**base[k], **v} if k == "rollout" else v
    return base


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (job(model={"kind": "hf"}), "model: kind: hf needs path"),
        (job(model={"kind": "hf", "path": "x/y", "n_layer": 4}), "n_layer: tiny-gpt sizes do not apply"),
        (job(model={"kind": "tiny-gpt", "path": "x/y"}), "path: apply to kind: hf only"),
        (job(task={"name": "reverse"}), "kind: hf trains on a jsonl dataset"),
        (job(task={"name": "jsonl"}), "task: name: jsonl needs path"),
        (job(task={"name": "reverse", "reward": "math_boxed"}), "reward math_boxed scores a jsonl dataset"),
        ({"name": "x1", "rollout": {"engine": "vllm", "max_workers": 0}}, "vLLM runs Hugging Face models"),
        (job(rollout={"engine": "vllm", "engine_dtype": "float64"}), "float64 is a torch-engine option"),
    ],
)
def test_job_file_rules(raw: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(raw)


def test_paths_resolve_next_to_the_job_file(files, tmp_path: Path) -> None:
    model_dir, _, data = files
    (tmp_path / "data.jsonl").write_text(data.read_text())
    shutil.copytree(model_dir, tmp_path / "model")
    path = tmp_path / "job.yaml"
    path.write_text(
        yaml.safe_dump(job(model={"kind": "hf", "path": "./model"}, task={"name": "jsonl", "path": "data.jsonl"}))
    )
    spec = load_spec(path)
    assert spec.model.path == str(tmp_path / "model") and spec.task.path == tmp_path / "data.jsonl"
    path.write_text(yaml.safe_dump(job(task={"name": "jsonl", "path": "data.jsonl"})))
    assert load_spec(path).model.path == "org/model"  # a hub id stays as it is
    path.write_text(
        yaml.safe_dump(job(model={"kind": "hf", "path": "./nope"}, task={"name": "jsonl", "path": "data.jsonl"}))
    )
    with pytest.raises(SpecError, match=r"model\.path: directory \./nope not found"):
        load_spec(path)
    path.write_text(yaml.safe_dump(job(task={"name": "jsonl", "path": "missing.jsonl"})))
    with pytest.raises(SpecError, match=r"task\.path: file missing\.jsonl not found"):
        load_spec(path)


def test_chat_template_auto_on_off(files) -> None:
    """auto/on render `[{"role": "user", ...}]` with the generation prompt; off (or auto on a tokenizer
    without a template) encodes the plain text; on without a template is an error naming the field."""
    from testkit.hf_fixtures import make_tokenizer

    _, task_spec = specs(files[0], files[2])
    task_spec = task_spec.model_copy(update={"instruction": None})
    tok = make_tokenizer()
    task = JsonlTask(task_spec, tok)
    assert task_spec.chat_template == "auto" and task.use_chat_template
    first = task.records[0].prompt
    rendered = tok.apply_chat_template([{"role": "user", "content": first}], add_generation_prompt=True, tokenize=False)
    assert rendered == f"<|im_start|>user\n{first}<|im_end|>\n<|im_start|>assistant\n"
    ids = task._prompts[0]
    assert ids == tok.encode(rendered, add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and ids.count(tok.eos_token_id) == 1
    assert JsonlTask(task_spec.model_copy(update={"chat_template": "on"}), tok)._prompts == task._prompts
    plain = tok.encode(first, add_special_tokens=True)
    assert JsonlTask(task_spec.model_copy(update={"chat_template": "off"}), tok)._prompts[0] == plain

    bare = make_tokenizer()
    bare.chat_template = None
    assert JsonlTask(task_spec, bare)._prompts[0] == plain  # auto: no template, plain text
    with pytest.raises(ValueError, match=r"task\.chat_template: on, but the tokenizer .* has no chat template"):
        JsonlTask(task_spec.model_copy(update={"chat_template": "on"}), bare)


def test_the_reward_sees_the_raw_prompt_and_engines_get_the_templated_ids(files) -> None:
    model_spec, task_spec = specs(files[0], files[2])
    learner = Learner(model_spec, AlgorithmSpec(), task_spec, device="cpu")
    task = learner.task
    seen = []
    task.custom = lambda prompt, response, row: seen.append((prompt, response, row)) or 0.0
    p = task.sample(np.random.default_rng(3), 1)[0]
    record = task.records[p.index]
    assert p.prompt_text == record.prompt and p.row == record.row  # raw, not the rendered template
    assert task.decode(p.prompt_ids).startswith("<|im_start|>user\n")
    # the torch engine generates from exactly the ids the learner scores
    engine = make_engine("torch", model_spec.model_dump(mode="json"), "auto", 8)
    engine.load_weights(0, learner.state_dict())
    ids, lps = generate(engine, [GenRequest("r0", p.prompt_ids, 6, seed=0)])
    np.testing.assert_allclose(lps["r0"], learner.logprobs(p.prompt_ids, ids["r0"]), rtol=0, atol=1e-4)
    task.reward(p, ids["r0"])
    assert seen == [(record.prompt, task.decode_response(ids["r0"]), record.row)]


@pytest.mark.parametrize("fmt", ["parquet", "datasets-dir"])
def test_a_task_reads_parquet_and_datasets_directories_as_it_reads_jsonl(files, tmp_path: Path, fmt: str) -> None:
    from testkit.hf_fixtures import MATH_ROWS
    from tests.test_datasets import save_dataset, write_parquet

    rows = [r for r in MATH_ROWS if "question" in r]  # one schema: the same row dicts in every format
    model_spec, task_spec = specs(files[0], write_math_jsonl(tmp_path / "d.jsonl", rows))
    if fmt == "parquet":
        path = write_parquet(tmp_path / "d.parquet", rows)
        split = None
    else:
        path, split = save_dataset(tmp_path / "dir", {"train": rows, "test": rows[:1]}), "train"
    from_jsonl = make_task(task_spec, model_spec)
    other = make_task(task_spec.model_copy(update={"path": path, "split": split}), model_spec)
    assert [(r.prompt, r.answer, r.demonstration, r.row) for r in other.records] == [
        (r.prompt, r.answer, r.demonstration, r.row) for r in from_jsonl.records
    ]
    assert other._prompts == from_jsonl._prompts
    if fmt == "datasets-dir":  # the same directory's test split held out (task.eval_split's default)
        spec = task_spec.model_copy(update={"path": path, "eval_every": 1, "eval_path": path})
        held = make_task(spec, model_spec).eval_problems(0, 10)
        assert [p.prompt_text for p in held] == [rows[0]["question"]]


@pytest.mark.parametrize("tied", [False, True])
def test_the_learner_knows_its_vocabulary(files, tied: bool) -> None:
    """The vocabulary the coordinator checks every worker's token ids against (issue 56): the embedding
    rows, the id one past which the learner's lookup fails; tiny-gpt's is its 41 ids."""
    model_spec, task_spec = specs(files[1] if tied else files[0], files[2])
    learner = Learner(model_spec, AlgorithmSpec(), task_spec, device="cpu")
    rows = learner.model.get_input_embeddings().num_embeddings
    assert learner.vocab_size == rows
    prompt = learner.task.sample(np.random.default_rng(0), 1)[0].prompt_ids
    learner.logprobs(prompt, [rows - 1])
    with pytest.raises((IndexError, RuntimeError)):  # what the coordinator now refuses instead
        learner.logprobs(prompt, [rows])
    tiny = Learner(ModelSpec(), AlgorithmSpec(), TaskSpec(), device="cpu")
    assert tiny.vocab_size == 41
