"""Sampling seeded per (request, token position).

Token t of a request is argmax(logits / T + g) with Gumbel noise g drawn from a counter-based hash of
(request seed, position, vocab index): no RNG state, so the same token comes out whichever engine
generates position t, in whatever batch - the property that lets a migrated response continue
exactly as it would have, and makes fault-injected runs comparable bit for bit with clean ones.

top-k / top-p (nucleus) truncation happens inside the same rule: on logits / T, tokens outside the k
largest and outside the smallest set of largest tokens whose probability reaches p (at least one) are
set to -inf before the noise is added, so Gumbel-max draws exactly from the truncated, renormalised
distribution (vLLM's and Hugging Face's order: temperature, then top-k, then top-p). Both cuts are
value thresholds (ties at the threshold are kept), so which tied index a sort puts first never matters.
The log-prob returned is of that truncated distribution: the one the token was drawn from (vLLM's
`processed_logprobs`). It is the behaviour log-prob of the dumps and of algorithm.rollout_correction
(rlboost/trainer/rollout_correction.py), the only loss that reads it; otherwise pi_old and pi are the
trainer's own recomputation at T over the whole vocabulary, as veRL's.
With top_k = 0 and top_p = 1 (off, the defaults) nothing is truncated and the code path is unchanged.
"""

from __future__ import annotations

import hashlib

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def request_id(step: int, prompt: int, sample: int) -> str:
    """A rollout request's id: sample `sample` of prompt `prompt` in step `step`. Its sampling seed is
    request_seed(job seed, id), so every path that names a request this way (the trainer, the in-process
    learner, the simulator's lengths) draws the same response for it."""
    return f"s{step}-p{prompt}-g{sample}"


def request_seed(job_seed: int, rid: str) -> int:
    """A stable 63-bit seed for one request of a job."""
    h = hashlib.sha256(f"{job_seed}:{rid}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def gumbel_noise(seeds: np.ndarray, positions: np.ndarray, vocab: int) -> np.ndarray:
    """[B, vocab] float64 Gumbel noise for B (seed, position) pairs."""
    with np.errstate(over="ignore"):
        key = _splitmix64(seeds.astype(np.uint64) ^ _splitmix64(positions.astype(np.uint64)))
        x = _splitmix64(key[:, None] * np.uint64(vocab + 1) + np.arange(vocab, dtype=np.uint64)[None, :])
    u = (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    u = np.clip(u, 1e-300, 1.0 - 1e-16)
    return -np.log(-np.log(u))


def truncation_off(top_k: int, top_p: float) -> bool:
    """Whether (top_k, top_p) leave every token (0 = no top-k; top_p >= 1 = no nucleus)."""
    return top_k <= 0 and top_p >= 1.0


def truncate(z: np.ndarray, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """z [B, V] float64 (logits / T) with tokens outside the top-k and then the top-p nucleus set to -inf."""
    vocab = z.shape[1]
    if 0 < top_k < vocab:
        kth = -np.sort(-z, axis=1)[:, top_k - 1 : top_k]
        z = np.where(z < kth, -np.inf, z)
    if top_p < 1.0:
        desc = -np.sort(-z, axis=1)
        e = np.exp(desc - desc[:, :1])
        cum = np.cumsum(e / e.sum(axis=1, keepdims=True), axis=1)
        n = 1 + (cum[:, :-1] < top_p).sum(axis=1)  # the smallest prefix with mass >= p (at least 1)
        z = np.where(z < desc[np.arange(len(z)), n - 1][:, None], -np.inf, z)
    return z


def sample(
    logits: np.ndarray,
    seeds: np.ndarray,
    positions: np.ndarray,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Sample one token per row. logits: [B, V]; returns (token ids [B], logprobs [B]), the log-prob of
    the distribution drawn from (at temperature T, truncated by top_k / top_p).
    Temperature 0 is greedy (argmax; logprobs at temperature 1, no truncation): evaluation only, never
    rollouts."""
    if temperature == 0:
        z = logits.astype(np.float64)
        tok = np.argmax(z, axis=1)
        logp = z - z.max(axis=1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(axis=1, keepdims=True))
        return tok, logp[np.arange(len(tok)), tok]
    z = logits.astype(np.float64) / temperature
    if not truncation_off(top_k, top_p):
        z = truncate(z, top_k, top_p)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    tok = np.argmax(logp + gumbel_noise(seeds, positions, logits.shape[1]), axis=1)
    return tok, logp[np.arange(len(tok)), tok]
