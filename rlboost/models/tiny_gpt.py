"""TinyGPT: a small nanoGPT-style causal LM shared by the learner and the torch engine.

One forward serves training and generation: batches may be LEFT padded (a key mask says which
positions are real), positions are explicit (so a padded row still starts at position 0), and an
optional KV cache carries keys/values of earlier tokens for incremental decoding. No dropout and no
weight tying: the forward is a pure function of weights and inputs, and `state_dict()` has exactly
one tensor per parameter name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlboost.contracts.spec import ModelSpec
from rlboost.models.vocab import PAD, VOCAB_SIZE

# Per layer: (keys, values), each [B, n_head, T_past, head_dim].
KVCache = list[tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class TinyGPTConfig:
    vocab_size: int = VOCAB_SIZE
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    block_size: int = 64  # positions 0..block_size-1


def from_spec(spec: ModelSpec, vocab_size: int = VOCAB_SIZE) -> TinyGPTConfig:
    return TinyGPTConfig(vocab_size, spec.n_layer, spec.n_head, spec.n_embd, spec.block_size)


class Block(nn.Module):
    def __init__(self, cfg: TinyGPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn_qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.attn_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.mlp_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(
        self, x: Tensor, allowed: Tensor, past: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        b, t, c = x.shape
        q, k, v = self.attn_qkv(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, c))
        x = x + self.mlp_proj(F.gelu(self.mlp_fc(self.ln_2(x))))
        return x, (k, v)


class TinyGPT(nn.Module):
    def __init__(self, cfg: TinyGPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        # nanoGPT/GPT-2 init (LayerNorms keep their ones/zeros); residual projections scaled by depth.
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for block in self.blocks:
            for proj in (block.attn_proj, block.mlp_proj):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * self.cfg.n_layer))

    def forward(
        self, idx: Tensor, positions: Tensor, attn_mask: Tensor, past_kv: KVCache | None = None
    ) -> tuple[Tensor, KVCache]:
        """idx, positions: [B, T] new tokens. attn_mask: [B, T_past + T] bool, True = a real token,
        covering the cached tokens and the new ones. Returns logits [B, T, V] and the updated cache.

        Query i (absolute index T_past + i) sees real keys at indices <= its own, and always itself,
        so a padding row never has an empty softmax (its output is unused)."""
        t = idx.shape[1]
        t_all = attn_mask.shape[1]
        if int(positions.max()) >= self.cfg.block_size:
            raise ValueError(f"position {int(positions.max())} >= block_size {self.cfg.block_size}")
        q_abs = torch.arange(t_all - t, t_all, device=idx.device)[:, None]  # [T, 1]
        k_abs = torch.arange(t_all, device=idx.device)[None, :]  # [1, T_all]
        allowed = (k_abs <= q_abs) & (attn_mask[:, None, :].bool() | (k_abs == q_abs))  # [B, T, T_all]
        allowed = allowed[:, None]  # broadcast over heads
        x = self.wte(idx) + self.wpe(positions)
        new_kv: KVCache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, allowed, None if past_kv is None else past_kv[i])
            new_kv.append(kv)
        return self.lm_head(self.ln_f(x)), new_kv


def left_pad(seqs: list[list[int]], device: torch.device | str = "cpu") -> tuple[Tensor, Tensor, Tensor]:
    """Left-pad token lists into (idx, positions, mask), each [B, L]; real tokens sit at positions
    0..len-1 whatever the padding, so a row's outputs do not depend on its batch neighbours."""
    width = max(len(s) for s in seqs)
    idx = torch.full((len(seqs), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, s in enumerate(seqs):
        if s:
            idx[row, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[row, width - len(s) :] = True
    positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
    return idx.to(device), positions.to(device), mask.to(device)
