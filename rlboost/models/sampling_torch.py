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


def truncate(z: Tensor, top_k: int | Tensor = 0, top_p: float | Tensor = 1.0) -> Tensor:
    """z [B, V] float64 (logits / T) with tokens outside the top-k, then the top-p nucleus, set to -inf
    (= sampling.truncate). top_k / top_p: one value, or one per row ([B] tensors: 0 / >= 1 = off)."""
    rows, vocab = z.shape
    k = torch.as_tensor(top_k, dtype=torch.int64, device=z.device).expand(rows)
    on = (k > 0) & (k < vocab)
    if bool(on.any()):
        k = torch.where(on, k, vocab)
        kth = torch.sort(z, dim=1, descending=True).values.gather(1, (k - 1)[:, None])
        z = torch.where(z < kth, float("-inf"), z)
    p = torch.as_tensor(top_p, dtype=torch.float64, device=z.device).expand(rows)
    if bool((p < 1.0).any()):
        desc = torch.sort(z, dim=1, descending=True).values
        e = torch.exp(desc - desc[:, :1])
        cum = torch.cumsum(e / e.sum(dim=1, keepdim=True), dim=1)
        n = 1 + (cum[:, :-1] < p[:, None]).sum(dim=1)  # the smallest prefix with mass >= p (at least 1)
        n = torch.where(p < 1.0, n, vocab)
        z = torch.where(z < desc.gather(1, (n - 1)[:, None]), float("-inf"), z)
    return z


def _off(top_k: int | Tensor, top_p: float | Tensor) -> bool:
    if isinstance(top_k, Tensor) or isinstance(top_p, Tensor):
        return False  # per-row values: truncate() checks them
    return top_k <= 0 and top_p >= 1.0


def sample(
    logits: Tensor,
    seeds: Tensor,
    positions: Tensor,
    temperature: float | Tensor = 1.0,
    top_k: int | Tensor = 0,
    top_p: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor]:
    """One token per row of logits [B, V] (float64 math): (token ids [B], logprobs [B] of the distribution
    drawn from: at temperature, truncated by top_k / top_p), = contracts.sampling.sample."""
    if not isinstance(temperature, Tensor) and temperature == 0:  # greedy (evaluation), as contracts.sampling
        logp = torch.log_softmax(logits.to(torch.float64), dim=-1)
        tok = torch.argmax(logp, dim=-1)
        return tok, logp.gather(1, tok[:, None]).squeeze(1)
    t = temperature[:, None] if isinstance(temperature, Tensor) else temperature
    z = logits.to(torch.float64) / t
    if not _off(top_k, top_p):
        z = truncate(z, top_k, top_p)
    logp = torch.log_softmax(z, dim=-1)
    tok = torch.argmax(logp + gumbel_noise(seeds, positions, logits.shape[1]), dim=-1)
    return tok, logp.gather(1, tok[:, None]).squeeze(1)
