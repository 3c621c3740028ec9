"""contracts/sampling.py on torch tensors (any device): the same noise and tokens, bit for bit.

Real vocabularies (150k ids) make numpy noise on the host the bottleneck of a GPU engine; this
computes the same counter-based splitmix64 hash with int64 tensors (a wrapping multiply gives the
same bits as uint64; right shifts are made logical with a mask), so the torch engine on a GPU and
vLLM's sampler hook draw exactly the tokens the numpy reference draws.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _s64(x: int) -> int:
    """A uint64 constant as the int64 with the same bits."""
    return x - (1 << 64) if x >= 1 << 63 else x


_M1 = _s64(0xBF58476D1CE4E5B9)
_M2 = _s64(0x94D049BB133111EB)
_GOLDEN = _s64(0x9E3779B97F4A7C15)


def _shr(z: Tensor, s: int) -> Tensor:
    return (z >> s) & ((1 << (64 - s)) - 1)


def _splitmix64(x: Tensor) -> Tensor:
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _M1
    z = (z ^ _shr(z, 27)) * _M2
    return z ^ _shr(z, 31)


def gumbel_noise(seeds: Tensor, positions: Tensor, vocab: int) -> Tensor:
    """[B, vocab] float64 Gumbel noise for B (seed, position) int64 pairs (= sampling.gumbel_noise)."""
    key = _splitmix64(seeds.to(torch.int64) ^ _splitmix64(positions.to(torch.int64)))
    idx = torch.arange(vocab, dtype=torch.int64, device=seeds.device)
    x = _splitmix64(key[:, None] * (vocab + 1) + idx[None, :])
    u = _shr(x, 11).to(torch.float64) * (1.0 / (1 << 53))
    u = u.clamp(1e-300, 1.0 - 1e-16)
    return -torch.log(-torch.log(u))


def sample(
    logits: Tensor, seeds: Tensor, positions: Tensor, temperature: float | Tensor = 1.0
) -> tuple[Tensor, Tensor]:
    """One token per row of logits [B, V] (float64 math): (token ids [B], logprobs [B] at temperature)."""
    if not isinstance(temperature, Tensor) and temperature == 0:  # greedy (evaluation), as contracts.sampling
        logp = torch.log_softmax(logits.to(torch.float64), dim=-1)
        tok = torch.argmax(logp, dim=-1)
        return tok, logp.gather(1, tok[:, None]).squeeze(1)
    t = temperature[:, None] if isinstance(temperature, Tensor) else temperature
    logp = torch.log_softmax(logits.to(torch.float64) / t, dim=-1)
    tok = torch.argmax(logp + gumbel_noise(seeds, positions, logits.shape[1]), dim=-1)
    return tok, logp.gather(1, tok[:, None]).squeeze(1)
