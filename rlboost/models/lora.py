"""LoRA adapters on an hf model (`model.lora`), through peft; imported only by jobs that use them.

The learner wraps its model with peft's `get_peft_model`: the base weights are frozen and only the
adapters (lora_A, lora_B of each target module) train, so the optimizer holds only them. A published
version carries only the adapters, named after the module they patch (`<module>.lora_A.weight`,
`<module>.lora_B.weight`, module names as the base model's `named_modules()` has them, e.g.
`model.layers.0.self_attn.q_proj`); an engine keeps the base weights it loaded at start and merges
W = W_base + scale * B @ A (scale = alpha / rank) into each target module's weight per version. peft
initialises B to zero, so version 0 merged equals the base. A layer that stores its weight transposed
(fan_in_fan_out, GPT-2's Conv1D) is published as (A.T as B, B.T as A), so the rule stays B @ A.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from rlboost.contracts.spec import LoraSpec

ADAPTER = "default"  # peft's adapter name
A_SUFFIX, B_SUFFIX = ".lora_A.weight", ".lora_B.weight"
_PEFT_PREFIX = "base_model.model."


def _peft():
    try:
        import peft
    except ImportError as e:  # a clear message instead of a bare ModuleNotFoundError
        raise ImportError("model.lora needs peft: pip install 'rlboost[hf]' (or pip install 'peft>=0.13')") from e
    return peft


def wrap(model: nn.Module, spec: LoraSpec) -> nn.Module:
    """`model` with LoRA adapters on spec.target_modules; only the adapters require grad. The adapters'
    init (lora_A: kaiming uniform) draws from torch's global RNG: the caller seeds it."""
    peft = _peft()
    config = peft.LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha if spec.alpha is not None else 2 * spec.rank,
        lora_dropout=spec.dropout,
        target_modules=spec.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        return peft.get_peft_model(model, config)
    except ValueError as e:  # e.g. no module matches target_modules
        raise ValueError(f"model.lora.target_modules {spec.target_modules!r}: {e}") from e


def _lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The peft model's LoRA layers by the base model's module name."""
    from peft.tuners.lora import LoraLayer

    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, LoraLayer) and ADAPTER in mod.lora_A:
            out[name.removeprefix(_PEFT_PREFIX)] = mod
    return out


def adapter_tensors(model: nn.Module) -> dict[str, Tensor]:
    """The adapters as published (detached, not copied; in the layout W += B @ A)."""
    out = {}
    for name, mod in _lora_layers(model).items():
        a, b = mod.lora_A[ADAPTER].weight.detach(), mod.lora_B[ADAPTER].weight.detach()
        if getattr(mod, "fan_in_fan_out", False):
            a, b = b.T, a.T
        out[name + A_SUFFIX], out[name + B_SUFFIX] = a, b
    return out


def load_adapters(model: nn.Module, tensors: Mapping[str, Tensor]) -> None:
    """Copy published adapters (adapter_tensors' names and layout) into the peft model."""
    layers = _lora_layers(model)
    want = {n + s for n in layers for s in (A_SUFFIX, B_SUFFIX)}
    if want != set(tensors):
        raise ValueError(f"adapter names do not match: missing {sorted(want - set(tensors))[:4]}, "
                         f"unexpected {sorted(set(tensors) - want)[:4]}")
    with torch.no_grad():
        for name, mod in layers.items():
            a, b = torch.as_tensor(tensors[name + A_SUFFIX]), torch.as_tensor(tensors[name + B_SUFFIX])
            if getattr(mod, "fan_in_fan_out", False):
                a, b = b.T, a.T
            mod.lora_A[ADAPTER].weight.copy_(a)
            mod.lora_B[ADAPTER].weight.copy_(b)


def trainable_state(model: nn.Module) -> dict[str, Tensor]:
    """CPU copies of the parameters that train (the adapters): a checkpoint's weights, the base being
    the job's model.path."""
    return {k: p.detach().to("cpu").clone() for k, p in model.named_parameters() if p.requires_grad}


class AdapterFree(nn.Module):
    """The KL reference of a LoRA policy: the same peft model with its adapters disabled, i.e. the base
    weights (veRL's LoRA reference). No second copy of the weights; it holds no state of its own."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self._policy = [policy]  # in a list: not a submodule (no parameters, no state_dict entries)

    def forward(self, *args, **kwargs):
        policy = self._policy[0]
        with policy.disable_adapter():
            return policy(*args, **kwargs)


class AdapterMerger:
    """An engine's side: keeps the base weights of the target modules (copied at the first load) and
    sets each to W_base + scale * B @ A per version, computed in float32, cast to the engine's dtype."""

    def __init__(self, model: nn.Module, scale: float) -> None:
        self.params = dict(model.named_parameters())
        self.scale = scale
        self.base: dict[str, Tensor] = {}

    def targets(self, tensors: Mapping[str, object]) -> dict[str, tuple[Tensor, Tensor]]:
        """Module weight name -> (A, B), validated against the model before anything is changed."""
        out: dict[str, tuple[Tensor, Tensor]] = {}
        for key in tensors:
            if not key.endswith((A_SUFFIX, B_SUFFIX)):
                raise ValueError(f"{key}: not a LoRA adapter tensor (*{A_SUFFIX} or *{B_SUFFIX})")
            module = key.removesuffix(A_SUFFIX).removesuffix(B_SUFFIX)
            weight = module + ".weight"
            if weight in out:
                continue
            if weight not in self.params:
                raise ValueError(f"{key}: the model has no {weight}")
            if module + A_SUFFIX not in tensors or module + B_SUFFIX not in tensors:
                raise ValueError(f"{module}: lora_A and lora_B come in pairs")
            a, b = torch.as_tensor(tensors[module + A_SUFFIX]), torch.as_tensor(tensors[module + B_SUFFIX])
            shape = tuple(self.params[weight].shape)
            if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or (b.shape[0], a.shape[1]) != shape:
                raise ValueError(f"{module}: B {tuple(b.shape)} @ A {tuple(a.shape)} does not fit its weight {shape}")
            out[weight] = (a, b)
        if self.base and set(out) != set(self.base):
            raise ValueError(f"adapters for {len(out)} modules, but {len(self.base)} were loaded before")
        return out

    @torch.no_grad()
    def load(self, tensors: Mapping[str, object]) -> None:
        targets = self.targets(tensors)
        for weight, (a, b) in targets.items():
            p = self.params[weight]
            base = self.base.setdefault(weight, p.detach().clone())
            a32, b32 = a.to(p.device, torch.float32), b.to(p.device, torch.float32)
            p.copy_((base.float() + self.scale * (b32 @ a32)).to(p.dtype))
