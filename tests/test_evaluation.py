"""Validation on held-out problems (task.eval_every): the split, greedy decoding, the evaluator on real
weights, and the job-file rules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from rlboost.contracts import sampling
from rlboost.contracts.spec import AlgorithmSpec, JobSpec, ModelSpec, SpecError, TaskSpec, load_spec, parse_spec
from rlboost.models import sampling_torch
from rlboost.trainer.evaluation import Evaluator, describe
from rlboost.trainer.learner import Learner
from rlboost.trainer.tasks import make_task


def test_temperature_zero_is_greedy_in_both_samplers() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(16, 41)) * 3
    seeds, pos = rng.integers(0, 2**62, 16), np.arange(16)
    tok, lp = sampling.sample(logits, seeds, pos, 0.0)
    assert (tok == logits.argmax(axis=1)).all()
    ref = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    assert np.allclose(lp, ref[np.arange(16), tok])
    ttok, tlp = sampling_torch.sample(torch.from_numpy(logits), torch.from_numpy(seeds), torch.from_numpy(pos), 0.0)
    assert ttok.tolist() == tok.tolist() and np.allclose(tlp.numpy(), lp)
    assert not (sampling.sample(logits, seeds, pos, 1.0)[0] == tok).all()  # sampling is not argmax


def job(task: dict, **extra) -> dict:
    return {"name": "ev", "task": task, "rollout": {"max_workers": 0}, **extra}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (job({"eval_size": 8}), r"task: eval_size: apply when eval_every > 0"),
        (job({"eval_every": 2, "eval_fraction": 0.2}), r"task: eval_fraction: apply to name: jsonl only .*eval_size"),
        (job({"eval_every": 2, "eval_temperature": -1.0}), r"task.eval_temperature: -1.0 is out of range"),
        (job({"eval_every": -1}), r"task.eval_every: -1 is out of range \(allowed: 0 <= eval_every"),
        (
            job({"eval_every": 2}, model={"kind": "synthetic"}, rollout={"engine": "synthetic", "max_workers": 0}),
            r"task.eval_every: a synthetic model has nothing to evaluate",
        ),
    ],
)
def test_eval_keys_are_checked(raw: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(raw)


def test_eval_path_and_fraction_exclude_each_other_and_paths_resolve(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text('{"prompt": "a", "answer": "1"}\n')
    base = {"name": "jsonl", "path": "d.jsonl", "eval_every": 1}
    hf = {"kind": "hf", "path": "org/model"}
    with pytest.raises(SpecError, match="eval_path and eval_fraction: give one held-out split"):
        parse_spec(job({**base, "eval_path": "v.jsonl", "eval_fraction": 0.1}, model=hf))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job({**base, "eval_path": "v.jsonl"}, model=hf)))
    with pytest.raises(SpecError, match=r"task.eval_path: file v.jsonl not found \(resolved to .*v.jsonl\)"):
        load_spec(path)
    (tmp_path / "v.jsonl").write_text('{"prompt": "b", "answer": "2"}\n')
    assert load_spec(path).task.eval_path == tmp_path / "v.jsonl"
    (tmp_path / "v.csv").write_text("prompt,answer\nb,2\n")
    path.write_text(yaml.safe_dump(job({**base, "eval_path": "v.csv"}, model=hf)))
    with pytest.raises(SpecError, match=r"task\.eval_path: v\.csv: rlboost reads JSON Lines .*parquet"):
        load_spec(path)


def test_jsonl_split_holds_out_a_fixed_share_never_trained_on(tmp_path: Path) -> None:
    from testkit.hf_fixtures import make_tiny_model

    model = ModelSpec(kind="hf", path=str(make_tiny_model(tmp_path / "m")), dtype="float32")
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(20)))
    spec = TaskSpec(name="jsonl", path=data, eval_every=5, eval_fraction=0.25)
    task = make_task(spec, model)
    held = {p.prompt_text for p in task.eval_problems(0, 100)}
    assert len(held) == 5
    trained = {p.prompt_text for p in task.sample(np.random.default_rng(0), 300)}
    assert trained == {f"q{i}" for i in range(20)} - held  # every other record, epoch after epoch
    assert {p.prompt_text for p in make_task(spec, model).eval_problems(0, 100)} == held  # the same split
    assert len(task.eval_problems(0, 3)) == 3  # eval_size caps it
    off = make_task(TaskSpec(name="jsonl", path=data), model)
    assert (
        off.eval_problems(0, 100) == []
        and len({p.prompt_text for p in off.sample(np.random.default_rng(0), 300)}) == 20
    )
    val = tmp_path / "v.jsonl"
    val.write_text(json.dumps({"prompt": "held", "answer": "7"}) + "\n")
    separate = make_task(TaskSpec(name="jsonl", path=data, eval_every=5, eval_path=val), model)
    assert [p.answer for p in separate.eval_problems(0, 100)] == ["7"]
    assert len({p.prompt_text for p in separate.sample(np.random.default_rng(0), 300)}) == 20


def tiny_job(**task) -> JobSpec:
    return JobSpec(
        name="ev",
        algorithm=AlgorithmSpec(max_new_tokens=8, seed=4),
        task=TaskSpec(name="reverse", min_len=3, max_len=4, eval_every=1, eval_size=32, **task),
        rollout={"max_workers": 0},
    )


def test_evaluator_scores_greedy_responses_of_the_given_weights() -> None:
    torch.set_num_threads(1)
    spec = tiny_job()
    task = make_task(spec.task, spec.model)
    learner = Learner(spec.model, spec.algorithm, spec.task, seed=0)
    ev = Evaluator(spec, task)
    before = ev.run(0, learner.state_dict())
    assert before["problems"] == 32 and before["temperature"] == 0.0
    assert before["pass@1"] == 0.0  # random weights do not reverse strings
    learner.warm_start(150)
    after = ev.run(1, learner.state_dict())
    assert after["pass@1"] >= 0.3, after  # supervised on the task: many greedy answers are right now
    assert after["mean_reward"] == after["pass@1"]  # a 0/1 reward
    assert ev.run(1, learner.state_dict())["pass@1"] == after["pass@1"]  # greedy: the same answers
    assert "pass@1" in describe(after) and "greedy" in describe(after)
    sampled = Evaluator(tiny_job(eval_temperature=1.0), task).run(1, learner.state_dict())
    assert sampled["temperature"] == 1.0 and 0.0 <= sampled["pass@1"] <= 1.0


def test_evaluator_runs_an_hf_model_on_its_held_out_records(tmp_path: Path) -> None:
    from testkit.hf_fixtures import make_tiny_model, write_math_jsonl

    torch.set_num_threads(1)
    model = ModelSpec(kind="hf", path=str(make_tiny_model(tmp_path / "m")), dtype="float32")
    data = write_math_jsonl(tmp_path / "d.jsonl")
    spec = JobSpec(
        name="ev",
        model=model,
        algorithm=AlgorithmSpec(max_new_tokens=6, seed=2),
        task=TaskSpec(name="jsonl", path=data, reward="math_boxed", eval_every=1, eval_fraction=0.5),
        rollout={"max_workers": 0},
    )
    task = make_task(spec.task, spec.model)
    learner = Learner(spec.model, spec.algorithm, spec.task, seed=0, device="cpu")
    ev = Evaluator(spec, task)
    assert [p.index for p in ev.problems] == [-1, -1]  # 2 of the 4 records, held out
    tensors = learner.state_dict()
    res = ev.run(0, tensors)
    assert res["problems"] == 2 and res["pass@1"] == 0.0  # random weights write no boxed answer
    # the same greedy tokens as decoding the learner's model by hand, one argmax at a time
    (first,) = ev.problems[:1]
    ids = list(first.prompt_ids)
    with torch.no_grad():
        for _ in range(spec.algorithm.max_new_tokens):
            nxt = int(learner.model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(nxt)
            if nxt == task.eos_id:
                break
    got: list[int] = []
    engine = ev._engine_for()
    from rlboost.contracts.engine import GenRequest

    engine.generate(
        [GenRequest("x", list(first.prompt_ids), 6, 1)], lambda r, o, t, lp: got.extend(t), lambda r: False, 0.0
    )
    assert got == ids[len(first.prompt_ids) :]


def test_due_versions_are_evaluated_once_and_kept_across_a_trainer_restart(tmp_path: Path) -> None:
    import asyncio

    from rlboost.trainer.runtime import TrainerRuntime

    torch.set_num_threads(1)
    spec = JobSpec(
        name="ev",
        algorithm=AlgorithmSpec(max_new_tokens=8, steps=5, warm_start_steps=0),
        task=TaskSpec(name="reverse", min_len=3, max_len=4, eval_every=2, eval_size=8),
        rollout={"max_workers": 0},
    )
    ckpt = tmp_path / "ck"

    def runtime() -> TrainerRuntime:
        return TrainerRuntime(spec, "token", tmp_path, checkpoint_dir=ckpt)

    async def offer(rt: TrainerRuntime, versions: range) -> list[int]:
        for v in versions:  # as each version is published
            await rt._maybe_evaluate(v, rt.learner.state_dict())
        await rt.wait_for_evaluation()
        return [e["version"] for e in rt.evals]

    first = runtime()
    assert asyncio.run(offer(first, range(0, 3))) == [0, 2]  # version 0 and every 2nd

    async def save() -> None:
        first.step, first.rng_state = 2, np.random.default_rng(0).bit_generator.state
        await first.checkpoint()

    asyncio.run(save())
    again = runtime()  # a relaunched trainer resumes at step 2
    assert again.restore(np.random.default_rng(0)) == 2
    assert again.evals == first.evals
    assert asyncio.run(offer(again, range(2, 6))) == [0, 2, 4, 5]  # 2 is not run again; 5 is the last
    assert again.status()["eval"]["version"] == 5 and len(again.status()["evals"]) == 4
