"""A learner's state across a checkpoint (rlboost/trainer/checkpoint.py writes it) and the copies its KL
reference is made of: single process and DDP save rank 0's replica; FSDP gathers full state dicts of the
policy, its optimizer and the reference onto rank 0's CPU and scatters them back into shards on resume.
Functions of the Learner (rlboost/trainer/learner.py), kept apart so that each module reads in one sitting.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

# (the Learner is typed Any here: annotating it with rlboost.trainer.learner.Learner would make the two
# modules import each other)


def checkpoint_state(learner: Any) -> dict:
    """Everything a resumed run needs to continue bit for bit: full-precision weights (not the
    publish dtype), optimizer moments, update count and RNGs. Single process or DDP (replicas
    are equal, rank 0's is saved); under FSDP every rank must call this (it gathers the shards:
    full state dicts of the policy, its optimizer and the KL reference, on rank 0's CPU; the
    other ranks' dicts are empty)."""
    if learner.fsdp:
        return _fsdp_checkpoint_state(learner)
    if learner.rank != 0:  # a ddp replica: rank 0's copy is the one saved
        return {}
    return {
        # with LoRA the adapters (the base is the job's model.path, never changed)
        "model": cpu_copy(learner.model) if learner.lora is None else _adapters(learner.model),
        # a copy: the save runs in the background while the next step trains in place
        "optimizer": copy.deepcopy(learner.optimizer.state_dict()),
        "steps_done": learner.steps_done,
        "demo_rng": learner._demo_rng.bit_generator.state,
        "torch_rng": torch.get_rng_state(),
        # the KL reference is the weights at step 0, which a resumed run no longer has
        **({"reference": cpu_copy(learner.reference)} if learner.reference is not None else {}),
    }


def _adapters(model: nn.Module) -> dict[str, Tensor]:
    from rlboost.models.lora import trainable_state

    return trainable_state(model)


def _fsdp_checkpoint_state(learner: Any) -> dict:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)  # CPU tensors, rank 0 only
    reference = get_model_state_dict(learner.reference, options=full) if learner.reference is not None else None
    return {
        "model": get_model_state_dict(learner.model, options=full),
        # a copy: on a CPU device, cpu_offload leaves plain tensors (Adam's step) shared with the optimizer
        "optimizer": copy.deepcopy(get_optimizer_state_dict(learner.model, learner.optimizer, options=full)),
        "steps_done": learner.steps_done,
        "demo_rng": learner._demo_rng.bit_generator.state,
        "torch_rng": torch.get_rng_state(),
        **({"reference": reference} if reference is not None else {}),
    }

def load_checkpoint_state(learner: Any, state: Mapping) -> None:
    """Restore checkpoint_state's dict; under FSDP every rank must call this with the same (full)
    state, each keeping its shards."""
    if learner.fsdp:
        _fsdp_load_checkpoint_state(learner, state)
        return
    lora = learner.lora is not None
    got = learner.model.load_state_dict({k: v.to(learner.device) for k, v in state["model"].items()}, strict=not lora)
    if lora and got.unexpected_keys:
        raise ValueError(f"the checkpoint's weights do not fit the LoRA model: {got.unexpected_keys[:4]}")
    learner.optimizer.load_state_dict(state["optimizer"])
    learner.steps_done = int(state["steps_done"])
    learner._demo_rng.bit_generator.state = state["demo_rng"]
    torch.set_rng_state(state["torch_rng"])
    learner.reference = None
    if "reference" in state and learner.algo.kl_coef > 0:
        learner.reference = learner._frozen_copy()
        learner.reference.load_state_dict({k: v.to(learner.device) for k, v in state["reference"].items()})

def _fsdp_load_checkpoint_state(learner: Any, state: Mapping) -> None:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True)
    set_model_state_dict(learner.model, dict(state["model"]), options=full)
    set_optimizer_state_dict(learner.model, learner.optimizer, dict(state["optimizer"]), options=full)
    learner.steps_done = int(state["steps_done"])
    learner._demo_rng.bit_generator.state = state["demo_rng"]
    torch.set_rng_state(state["torch_rng"])
    learner.reference = None
    if "reference" in state and learner._sharded_reference is not None:
        set_model_state_dict(learner._sharded_reference, dict(state["reference"]), options=full)
        learner.reference = learner._sharded_reference


def cpu_copy(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}


def meta_frozen_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` whose parameters are frozen and on the meta device (no memory: the full
    weights are never copied), buffers real copies; eval mode."""
    memo: dict[int, object] = {
        id(p): nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=False) for p in model.parameters()
    }
    ref = copy.deepcopy(model, memo)
    return ref.eval()


def materialize(model: nn.Module, device: torch.device) -> None:
    """Allocate a sharded meta-device model's local shards on `device` (left uninitialised), keeping
    its buffers' values (to_empty would drop them)."""
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    model.to_empty(device=device)
    with torch.no_grad():
        for k, v in model.named_buffers():
            v.copy_(buffers[k].to(v.device))
    model.requires_grad_(False)


def local_shard(t: Tensor) -> Tensor:
    """This rank's shard of an FSDP parameter (a DTensor); a plain tensor as is."""
    return t.to_local() if hasattr(t, "to_local") else t  # type: ignore[operator]


def vocab_size(model: nn.Module) -> int:
    """The token ids `model` takes: rows of its input embedding, and of its output head where it has one
    (a Hugging Face model, LoRA-wrapped or not, or tiny-gpt)."""
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    emb = get_in() if get_in is not None else model.wte
    head = get_out() if get_out is not None else getattr(model, "lm_head", None)
    sizes = [emb.num_embeddings] + ([head.out_features] if isinstance(head, nn.Linear) else [])
    return int(min(sizes))
