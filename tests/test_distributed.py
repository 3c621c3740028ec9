"""The trainer on torch.distributed, on CPU: 2 processes over gloo, ddp and fsdp, must make the same
update as one process; rank 0 drives the other rank through LeaderLearner / follow."""

from __future__ import annotations

import importlib.util
import os
import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from rlboost.contracts.spec import AlgorithmSpec, LoraSpec, ModelSpec, RolloutCorrection, TaskSpec
from rlboost.trainer.grpo import Sample
from rlboost.trainer.learner import Learner
from rlboost.trainer.tasks import make_task

ALGO = AlgorithmSpec(learning_rate=1e-2, seed=0)
# cases with algorithm knobs run two steps (the KL term is 0 until the policy has drifted): every loss
# term on; several updates per step (old log-probs, computed on every rank, and the clip)
KNOBS = {
    "ddp-knobs": {"kl_coef": 0.1, "entropy_coeff": 0.01, "loss_agg_mode": "seq-mean-token-mean"},
    "fsdp-ppo": {"ppo_mini_batch_size": 1, "ppo_epochs": 2, "clip_ratio_low": 0.01, "clip_ratio_high": 0.01},
    # the KL reference sharded like the policy; groups of 3 (9 samples): rank 1 has a pass with no rows
    # left, whose dummy forwards must pair with rank 0's policy and reference all-gathers
    "fsdp-kl": {"kl_coef": 0.5},
    "fsdp-kl-resume": {"kl_coef": 0.5},
    "fsdp-hf-kl": {"kl_coef": 0.5},  # a Hugging Face model's reference: tied weights, rotary buffers
    "ddp-hf-lora": {"kl_coef": 0.5},  # LoRA adapters: only they have gradients; the reference: adapters off
    # rollout correction against _samples' behaviour log-probs: some weights truncated, some not; the
    # step's metrics are reduced over ranks (sums and the max); sequence level on the kept-samples path
    "ddp-tis": {"rollout_correction": RolloutCorrection(level="token", threshold=1.5)},
    "fsdp-tis-ppo": {"rollout_correction": RolloutCorrection(level="sequence", threshold=3.0), "ppo_epochs": 2},
}
GROUP = {"fsdp-kl": 3}  # responses per group where not 4


def _samples(model: ModelSpec, task_spec: TaskSpec, n_groups: int = 3, group: int = 4) -> list[Sample]:
    """A deterministic step: responses of varied lengths with varied rewards."""
    task = make_task(task_spec, model)
    rng = np.random.default_rng(0)
    out = []
    for i, p in enumerate(task.sample(rng, n_groups)):
        for g in range(group):
            resp = [int(x) for x in rng.integers(4, 30, size=int(rng.integers(1, 8)))]
            # an engine's log-probs, spread around the tiny model's own (~ -3.5): not drawn from rng,
            # so the samples are those of before they were added
            behaviour = [-2.0 - ((k + g + i) % 5) for k in range(len(resp))]
            out.append(Sample(p.prompt_ids, resp, float((g + i) % 3 == 0), i, behaviour_logprobs=behaviour))
    return out


def _learner(
    model: ModelSpec, task_spec: TaskSpec, dist=None, micro: int | None = None, knobs: dict | None = None
) -> Learner:
    algo = ALGO.model_copy(update={"micro_batch_size": micro, **(knobs or {})})
    learner = Learner(model, algo, task_spec, seed=0, dist=dist, device="cpu")
    # SGD for the comparison: Adam's first step is ~lr * sign(grad), which turns float noise in a
    # gradient that is zero in exact arithmetic (e.g. attention key biases) into a full-size step
    learner.optimizer = torch.optim.SGD(learner.model.parameters(), lr=0.5)
    return learner


def _single(
    model: ModelSpec, task_spec: TaskSpec, micro: int | None = None, knobs: dict | None = None, group: int = 4
) -> dict[str, torch.Tensor]:
    learner = _learner(model, task_spec, micro=micro, knobs=knobs)
    learner.warm_start(2)
    for _ in range(2 if knobs else 1):
        learner.train_step(_samples(model, task_spec, group=group))
    return learner.state_dict()


def _resume_case(rank: int, ctx, model: ModelSpec, task_spec: TaskSpec, out: str) -> None:
    """fsdp with a KL penalty and AdamW: 3 steps straight (out), and a fresh learner resumed from the
    checkpoint state after step 1 for steps 2 and 3 (out + .resumed). The reference is step 0's weights,
    which the resumed learner only has from the checkpoint."""
    from rlboost.trainer import collectives

    def make() -> Learner:
        learner = _learner(model, task_spec, dist=ctx, micro=2, knobs=KNOBS["fsdp-kl-resume"])
        learner.optimizer = torch.optim.AdamW(learner.model.parameters(), lr=1e-2)  # moments to restore
        return learner

    straight, resumed = make(), make()
    if rank != 0:
        collectives.follow(straight)
        collectives.follow(resumed)
        return
    samples = _samples(model, task_spec)
    leader = collectives.LeaderLearner(straight)
    leader.warm_start(2)
    leader.train_step(samples)
    state = leader.checkpoint_state()
    assert state["reference"].keys() == state["model"].keys() and state["steps_done"] == 1
    for _ in range(2):
        metrics = leader.train_step(samples)
    assert metrics["kl"] > 0
    save_file(leader.state_dict(), out)
    collectives.release_followers()
    leader = collectives.LeaderLearner(resumed)
    leader.load_checkpoint_state(state)
    for _ in range(2):
        again = leader.train_step(samples)
    assert again["kl"] == metrics["kl"]
    save_file(leader.state_dict(), out + ".resumed")
    collectives.release_followers()


STREAM_CHUNKS = [[2], [0], [1]]  # the groups of _samples' step, in an order they may complete in


def _rank(rank: int, world: int, port: int, cases: list[tuple[str, ModelSpec, TaskSpec, str]]) -> None:
    """One rank: each case (strategy[-stream], model, task, output file) in turn, in one process group;
    a -stream case feeds the step's groups one by one (begin_step / add_groups / finish_step)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    from dataclasses import replace

    from rlboost.trainer import collectives, distributed

    ctx = distributed.init("ddp")
    try:
        for name, model, task_spec, out in cases:
            strategy = name.split("-")[0]
            if name == "fsdp-kl-resume":
                _resume_case(rank, replace(ctx, strategy=strategy), model, task_spec, out)
                continue
            knobs = KNOBS.get(name)
            learner = _learner(model, task_spec, dist=replace(ctx, strategy=strategy), micro=2, knobs=knobs)  # 3 passes
            if rank == 0:
                leader = collectives.LeaderLearner(learner)
                leader.warm_start(2)
                samples = _samples(model, task_spec, group=GROUP.get(name, 4))
                if name.endswith("-stream"):
                    leader.begin_step(token_budget=len(samples) * 16)
                    for groups in STREAM_CHUNKS:
                        leader.add_groups([s for s in samples if s.group in groups])
                    metrics = leader.finish_step()
                else:
                    for _ in range(2 if knobs else 1):
                        metrics = leader.train_step(samples)
                assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
                if name == "ddp-knobs":
                    assert metrics["kl"] > 0 and metrics["entropy"] > 0
                if name in ("fsdp-kl", "fsdp-hf-kl", "ddp-hf-lora"):
                    assert metrics["kl"] > 0
                if name == "fsdp-ppo":
                    assert metrics["updates"] == 6 and metrics["clip_frac"] > 0
                if name == "ddp-tis":  # the 2 ranks' figures are the single process's
                    alone = _learner(model, task_spec, micro=2, knobs=knobs)
                    alone.warm_start(2)
                    for _ in range(2):
                        solo = alone.train_step(samples)
                    assert metrics["is_weight_max"] == 1.5 and 0 < metrics["is_clipped_share"] < 1
                    for k in ("is_weight_mean", "is_weight_max", "is_clipped_share"):
                        assert metrics[k] == pytest.approx(solo[k], rel=1e-6), k
                save_file(leader.state_dict(), out)
                collectives.release_followers()
            else:
                collectives.follow(learner)
    finally:
        distributed.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)


TINY = (ModelSpec(n_layer=1, n_embd=32, n_head=2), TaskSpec())


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory) -> dict[str, tuple[dict[str, torch.Tensor], tuple[ModelSpec, TaskSpec]]]:
    """One 2-process gloo group runs every case (process start-up is the slow part on 2 cores)."""
    tmp = tmp_path_factory.mktemp("dist")
    cases = {
        **{name: TINY for name in ("ddp", "fsdp", "ddp-stream", "fsdp-stream", "ddp-knobs", "fsdp-ppo")},
        **{name: TINY for name in ("ddp-tis", "fsdp-tis-ppo")},
        **{name: TINY for name in ("fsdp-kl", "fsdp-kl-resume")},
    }
    try:
        import transformers  # noqa: F401

        from testkit.hf_fixtures import make_tiny_model, write_math_jsonl

        hf = ModelSpec(kind="hf", path=str(make_tiny_model(tmp / "m", layers=1)), dtype="float32")
        cases["fsdp-hf"] = (hf, TaskSpec(name="jsonl", path=write_math_jsonl(tmp / "d.jsonl"), reward="math_boxed"))
        cases["fsdp-hf-kl"] = cases["fsdp-hf"]
        if importlib.util.find_spec("peft") is not None:
            lora = hf.model_copy(update={"lora": LoraSpec(rank=4)})
            cases["ddp-hf-lora"] = (lora, cases["fsdp-hf"][1])
    except ImportError:
        pass
    args = [(name, *case, str(tmp / f"{name}.safetensors")) for name, case in cases.items()]
    mp.start_processes(_rank, args=(2, _free_port(), args), nprocs=2, start_method="spawn")
    out = {name: (load_file(tmp / f"{name}.safetensors"), case) for name, case in cases.items()}
    out["fsdp-kl-resumed"] = (load_file(tmp / "fsdp-kl-resume.safetensors.resumed"), TINY)
    return out


@pytest.mark.parametrize(
    "case",
    ["ddp", "fsdp", "fsdp-hf", "ddp-stream", "fsdp-stream", "ddp-knobs", "fsdp-ppo", "fsdp-kl", "fsdp-hf-kl",
     "ddp-hf-lora", "ddp-tis", "fsdp-tis-ppo"],
)
def test_two_ranks_make_the_single_process_update(case: str, two_rank_results) -> None:
    if case not in two_rank_results:
        pytest.skip("transformers (or peft, for ddp-hf-lora) is not installed")
    state, (model, task_spec) = two_rank_results[case]
    _assert_same(state, _single(model, task_spec, knobs=KNOBS.get(case), group=GROUP.get(case, 4)))


def test_fsdp_kl_reference_survives_a_checkpoint(two_rank_results) -> None:
    """Resumed from the checkpoint state after step 1 (policy, AdamW moments and the sharded KL
    reference, gathered and loaded back into shards), steps 2 and 3 make the uninterrupted run's weights."""
    straight, resumed = two_rank_results["fsdp-kl-resume"][0], two_rank_results["fsdp-kl-resumed"][0]
    assert straight.keys() == resumed.keys()
    for k in straight:
        torch.testing.assert_close(resumed[k], straight[k], rtol=0, atol=0, msg=k)


def test_micro_batches_accumulate_to_the_same_update() -> None:
    _assert_same(_single(*TINY, micro=3), _single(*TINY))


def test_torchrun_arguments_from_skypilot_variables() -> None:
    from rlboost.trainer.distributed import torchrun_args

    env = {"SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n", "SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_GPUS_PER_NODE": "8"}
    assert torchrun_args(env, port=1234) == [
        "--nnodes=2",
        "--node-rank=1",
        "--nproc-per-node=8",
        "--master-addr=10.0.0.5",
        "--master-port=1234",
    ]
    assert torchrun_args({}, gpus_per_node=1)[:3] == ["--nnodes=1", "--node-rank=0", "--nproc-per-node=1"]
    assert torchrun_args({**env, "SKYPILOT_NODE_RANK": "0"}, nnodes=1)[:3] == [
        "--nnodes=1",
        "--node-rank=0",
        "--nproc-per-node=8",
    ]


def test_launcher_prints_the_torchrun_command(monkeypatch, capsys) -> None:
    from rlboost.trainer.distributed import main

    monkeypatch.setenv("SKYPILOT_NODE_IPS", "10.0.0.5")
    monkeypatch.setenv("SKYPILOT_NUM_GPUS_PER_NODE", "4")
    assert main(["--print", "--spec", "job.yaml", "--port", "8787"]) == 0
    out = capsys.readouterr().out
    assert "torch.distributed.run --nnodes=1 --node-rank=0 --nproc-per-node=4" in out
    assert out.strip().endswith("-m rlboost.trainer --spec job.yaml --port 8787")
