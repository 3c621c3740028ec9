"""top_k / top_p (algorithm.top_k, algorithm.top_p) inside the seeded sampling rule: the numpy rule and
its torch twin draw the same tokens; nothing outside the top-k / nucleus is ever drawn; Gumbel-max over
the truncated logits samples the truncated distribution; the defaults change nothing; the job file
validates the keys and threads them to the engines' coordinator config."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlboost.contracts import sampling
from rlboost.contracts.spec import AlgorithmSpec, SpecError, parse_spec
from rlboost.models import sampling_torch

SETTINGS = [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.0, 0, 0.9), (1.3, 3, 0.5), (1.0, 1, 1.0), (0.5, 0, 0.01), (1.0, 40, 0.95)]


def _batch(seed: int, rows: int = 32, vocab: int = 50) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(rows, vocab)) * 3
    seeds = rng.integers(0, 2**63, size=rows, dtype=np.uint64)
    return logits, seeds, rng.integers(0, 10_000, size=rows).astype(np.uint64)


def _torch(logits, seeds, pos, *args):
    seeds_t, pos_t = torch.from_numpy(seeds.astype(np.int64)), torch.from_numpy(pos.astype(np.int64))
    tok, lp = sampling_torch.sample(torch.from_numpy(logits), seeds_t, pos_t, *args)
    return tok.numpy(), lp.numpy()


def _kept(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> list[set[int]]:
    """Brute force, row by row: the tokens top-k then top-p keep (on logits / T)."""
    out = []
    for row in logits / temperature:
        order = sorted(range(len(row)), key=lambda i: -row[i])
        if top_k > 0:
            order = order[:top_k]
        p = np.exp(row[order] - row[order].max())
        p /= p.sum()
        n = next((j + 1 for j in range(len(order)) if p[: j + 1].sum() >= top_p), len(order))
        out.append(set(order[:n]))
    return out


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), SETTINGS)
def test_numpy_and_torch_rules_draw_the_same_tokens(temperature: float, top_k: int, top_p: float) -> None:
    for seed in range(20):
        logits, seeds, pos = _batch(seed, vocab=7 + 13 * seed)
        tok, lp = sampling.sample(logits, seeds, pos, temperature, top_k, top_p)
        ttok, tlp = _torch(logits, seeds, pos, temperature, top_k, top_p)
        assert ttok.tolist() == tok.tolist()
        np.testing.assert_allclose(tlp, lp, rtol=0, atol=1e-12)


def test_torch_rule_takes_per_row_settings_as_tensors() -> None:
    """The vLLM logits processor passes temperature / top_k / top_p per row: each row as the scalar rule."""
    logits, seeds, pos = _batch(3, rows=len(SETTINGS) * 4)
    rows = SETTINGS * 4
    dtypes = [torch.float64, torch.int64, torch.float64]
    t, k, p = (torch.tensor([r[i] for r in rows], dtype=d) for i, d in enumerate(dtypes))
    tok, lp = _torch(logits, seeds, pos, t, k, p)
    for i, (ti, ki, pi) in enumerate(rows):
        one, one_lp = sampling.sample(logits[i : i + 1], seeds[i : i + 1], pos[i : i + 1], ti, ki, pi)
        assert tok[i] == one[0] and abs(lp[i] - one_lp[0]) < 1e-12


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), SETTINGS)
def test_never_draws_outside_the_top_k_and_the_nucleus(temperature: float, top_k: int, top_p: float) -> None:
    for seed in range(10):
        logits, seeds, pos = _batch(100 + seed)
        tok, lp = sampling.sample(logits, seeds, pos, temperature, top_k, top_p)
        kept = _kept(logits, temperature, top_k, top_p)
        assert all(int(t) in k for t, k in zip(tok, kept, strict=True))
        # the log-prob is of the truncated, renormalised distribution the token was drawn from
        for row, t, k, got in zip(logits / temperature, tok, kept, lp, strict=True):
            z = row[sorted(k)]
            assert got == pytest.approx(row[t] - z.max() - np.log(np.exp(z - z.max()).sum()), abs=1e-12)


@pytest.mark.parametrize("settings", [(1, 1.0), (0, 1e-9), (1, 0.3)])
def test_top_k_one_or_a_tiny_nucleus_is_greedy(settings: tuple[int, float]) -> None:
    logits, seeds, pos = _batch(7)
    tok, lp = sampling.sample(logits, seeds, pos, 1.0, *settings)
    assert tok.tolist() == logits.argmax(axis=1).tolist() and np.all(lp == 0.0)
    assert _torch(logits, seeds, pos, 1.0, *settings)[0].tolist() == tok.tolist()


def test_draws_follow_the_truncated_distribution() -> None:
    """Over many (seed, position) draws the frequencies are the truncated softmax's (Gumbel-max)."""
    row = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5])
    n = 40_000
    logits = np.tile(row, (n, 1))
    seeds, pos = np.arange(n, dtype=np.uint64), np.arange(n, dtype=np.uint64) % 97
    for top_k, top_p, kept in [(3, 1.0, [0, 1, 2]), (0, 0.7, [0, 1, 2]), (4, 0.5, [0, 1])]:
        tok, _ = sampling.sample(logits, seeds, pos, 1.0, top_k, top_p)
        want = np.zeros(len(row))
        want[kept] = np.exp(row[kept]) / np.exp(row[kept]).sum()
        np.testing.assert_allclose(np.bincount(tok, minlength=len(row)) / n, want, atol=0.01)
    tok, _ = sampling.sample(logits, seeds, pos, 1.0)  # untruncated: every token turns up
    assert set(tok.tolist()) == set(range(len(row)))


def _old_rule(logits: np.ndarray, seeds: np.ndarray, positions: np.ndarray, temperature: float):
    """contracts.sampling.sample before top_k / top_p, verbatim."""
    z = logits.astype(np.float64) / temperature
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    tok = np.argmax(logp + sampling.gumbel_noise(seeds, positions, logits.shape[1]), axis=1)
    return tok, logp[np.arange(len(tok)), tok]


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.7])
def test_defaults_are_bit_identical_to_the_rule_without_truncation(temperature: float) -> None:
    logits, seeds, pos = _batch(11, rows=64, vocab=300)
    old_tok, old_lp = _old_rule(logits, seeds, pos, temperature)
    for args in ((), (0, 1.0)):
        tok, lp = sampling.sample(logits, seeds, pos, temperature, *args)
        assert tok.tolist() == old_tok.tolist() and lp.tobytes() == old_lp.tobytes()
    ttok, tlp = _torch(logits, seeds, pos, temperature)
    assert ttok.tolist() == old_tok.tolist()
    assert (_torch(logits, seeds, pos, temperature, 0, 1.0)[1].tobytes()) == tlp.tobytes()
    spec = AlgorithmSpec()
    assert (spec.top_k, spec.top_p) == (0, 1.0)
    # and the truncation does change draws (the knobs reach the rule)
    assert sampling.sample(logits, seeds, pos, temperature, 2, 1.0)[0].tolist() != old_tok.tolist()


def _job(**algorithm) -> dict:
    return {"name": "trunc", "algorithm": algorithm, "rollout": {"max_workers": 0}}


@pytest.mark.parametrize(
    ("algorithm", "message"),
    [({"top_p": 0.0}, r"algorithm.top_p"), ({"top_p": 1.5}, r"algorithm.top_p"), ({"top_k": -1}, r"algorithm.top_k")],
)
def test_the_job_file_validates_the_keys(algorithm: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(_job(**algorithm))


def test_the_coordinator_sends_the_keys_to_the_workers() -> None:
    from rlboost.contracts import protocol as P
    from rlboost.rollout.live import LiveCoordinator
    from rlboost.rollout.scheduling import coordinator_config
    from rlboost.worker.agent import WorkerAgent, WorkerConfig

    cfg = coordinator_config(parse_spec(_job(top_k=20, top_p=0.9)), eos_id=2)
    assert (cfg.top_k, cfg.top_p) == (20, 0.9)
    welcome = LiveCoordinator(cfg)._welcome("w")
    assert (welcome.top_k, welcome.top_p) == (20, 0.9)
    agent = WorkerAgent(WorkerConfig(trainer_url="http://x", token="t", worker_id="w"))
    agent.welcome = P.Welcome.model_validate_json(welcome.model_dump_json())  # over the wire
    assert agent._truncation() == {"top_k": 20, "top_p": 0.9}  # generate's keywords
    # off (the defaults, or a trainer that sends neither): no keywords, generate's call as before
    agent.welcome = welcome.model_copy(update={"top_k": 0, "top_p": 1.0})
    assert agent._truncation() == {}
    assert (P.Welcome.model_fields["top_k"].default, P.Welcome.model_fields["top_p"].default) == (0, 1.0)
