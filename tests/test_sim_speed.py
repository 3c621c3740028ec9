"""The simulator's shortcuts change no decision: each is checked against the slow path it replaces."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rlboost.contracts.lengths import LengthModel
from rlboost.contracts.perf import EngineModel
from rlboost.rollout.policies.migration import MigrationConfig, may_gain, plan_migrations
from rlboost.rollout.policies.views import EngineView, ReqView

MODELS = (
    EngineModel(3926, 75, 10700, max_batch=64),
    EngineModel(900, 45, 5000, max_batch=32),
    EngineModel(3926 * 8, 75, 10700, max_batch=64, replicas=8),
)


def _fleet(rng: random.Random) -> tuple[list[EngineView], dict[str, list[ReqView]]]:
    engines, running = [], {}
    for k in range(rng.randint(1, 8)):
        model = rng.choice(MODELS)
        active = rng.randint(0, model.capacity)
        eid = f"e{k}"
        engines.append(EngineView(eid, "spot", model.capacity, active, model.rate(active), model, rng.random() < 0.8))
        running[eid] = [
            ReqView(f"{eid}-{j}", g, 4096 - g, rng.randint(50, 900), rng.uniform(1, 3000), None, rng.uniform(0, 20))
            for j in range(active)
            for g in [rng.randint(0, 4000)]
        ]
    return engines, running


def _prefiltered(engines: list[EngineView], running: dict[str, list[ReqView]], cfg: MigrationConfig):
    """What the simulator hands plan_migrations: each source's responses that may_gain keeps."""
    targets = [v for v in engines if v.accepting and v.free > 0]
    if not targets:
        return running
    best = min(v.seq_time(v.active + 1) for v in targets)
    per_token = min(v.prefill_s(1) for v in targets)
    by_id = {v.id: v for v in engines}
    out = {}
    for eid, reqs in running.items():
        if not reqs:
            continue
        el = np.array([r.expected_left for r in reqs])
        ctx = np.array([r.context for r in reqs])
        keep = may_gain(el, ctx, by_id[eid].seq_time(by_id[eid].active), best, per_token, cfg)
        out[eid] = [r for r, k in zip(reqs, keep) if k]
    return out


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), frac=st.sampled_from([0.0, 0.2, 0.4, 0.9]), gain=st.sampled_from([0.0, 0.5, 5]))
def test_migration_prefilter_keeps_every_move(seed: int, frac: float, gain: float) -> None:
    cfg = MigrationConfig(min_gain_s=gain, min_gain_frac=frac)
    engines, running = _fleet(random.Random(seed))
    assert plan_migrations(engines, _prefiltered(engines, running, cfg), 0, cfg) == plan_migrations(
        engines, running, 0, cfg
    )


def test_lengths_from_key_is_length_from_key_per_seed() -> None:
    rng = random.Random(7)
    seeds = [rng.getrandbits(63) for _ in range(64)]
    for model in (LengthModel(450, 0.8, 0.6), LengthModel(100, 1.2, 0.0), LengthModel(recorded=(3, 9, 400, 4096))):
        for pkey in (0, 12345, 2**64 - 1):
            assert model.lengths_from_key(pkey, seeds) == [model.length_from_key(pkey, s) for s in seeds]


def test_memo_view_answers_as_engine_view() -> None:
    from rlboost.simulator.engines import MemoView

    rng = random.Random(3)
    for _ in range(200):
        model = rng.choice(MODELS)
        active = rng.randint(0, model.capacity)
        args = ("e", "spot", model.capacity, active, model.rate(active), model, True)
        plain, memo = EngineView(*args), MemoView(*args)
        for n in [rng.randint(0, model.capacity + 1) for _ in range(5)] * 2:  # each load asked twice
            assert memo.seq_time(n) == plain.seq_time(n)
            assert memo.seq_time(n, MODELS[0]) == plain.seq_time(n, MODELS[0])


def test_step_lengths_are_drawn_once_per_process_and_unchanged() -> None:
    """A sweep's replays look a step's lengths up instead of hashing every request again: the cached
    lengths are the drawn ones, and a replay gives the same result with the cache empty or full."""
    from rlboost.contracts.lengths import prompt_key
    from rlboost.contracts.sampling import request_seed
    from rlboost.contracts.spec import parse_spec
    from rlboost.providers.pricing import spot_offers, trainer_offer
    from rlboost.providers.spot_market import AvailabilityTrace
    from rlboost.simulator import PRESETS, SimResult, core, step_state
    from tests.test_simulator import job

    spec = parse_spec(job())
    trace = AvailabilityTrace([0.0, 60.0, 75.0, 3600.0], [4, 1, 4, 4], "t")

    def replay() -> SimResult:
        sim = core.Simulation(spec, trace, PRESETS["rlboost-fixed"], trainer_offer(spec), spot_offers(spec))
        return sim.run()

    step_state._LENGTHS_SEEN.clear()
    cold = replay()
    assert step_state._LENGTHS_SEEN  # the replay filled it
    warm = replay()
    assert (cold.trained_tokens, cold.dollars, cold.run_s, cold.migrations, cold.step_log) == (
        warm.trained_tokens,
        warm.dollars,
        warm.run_s,
        warm.migrations,
        warm.step_log,
    )
    sim = core.Simulation(spec, trace, PRESETS["rlboost-fixed"], trainer_offer(spec), spot_offers(spec))
    problems = sim.trainer.task.sample(sim.trainer.prompt_rng, 4)
    G, seed = 3, spec.algorithm.seed
    want = [
        sim.trainer.lengths.length_from_key(prompt_key(p.prompt_ids), request_seed(seed, f"s7-p{i}-g{g}"))
        for i, p in enumerate(problems)
        for g in range(G)
    ]
    drawn = step_state.full_lengths(sim.trainer.lengths, seed, 7, problems, G)
    assert drawn.tolist() == want
    assert step_state.full_lengths(sim.trainer.lengths, seed, 7, problems, G) is drawn  # looked up
