"""algorithm.weight_swap in_flight (rollout/policies/staleness.py): a new version reaches the engines
mid-step, every response in flight continues on it (its later tokens from the new version, AReaL's
interruptible rollout), and the next step generates beside the last one's tail. The replay and the live
coordinator run it through the same Coordinator; `step` (the default) is the one-version-per-step order."""

from __future__ import annotations

import asyncio
import json

import pytest

from rlboost.contracts.spec import parse_spec
from rlboost.rollout.book import ProtocolViolation, Response
from rlboost.rollout.live import CoordinatorConfig, LiveCoordinator
from rlboost.rollout.live_pool import EngineConn
from rlboost.rollout.policies.staleness import swaps_in_flight
from rlboost.simulator import PRESETS
from tests.test_simulator import job, run

EOS = 2


def test_in_flight_needs_a_staleness_bound_and_a_free_schedule():
    with pytest.raises(Exception, match=r"weight_swap in_flight needs max_staleness >= 1.*max_staleness: 1"):
        parse_spec(job(algorithm={"weight_swap": "in_flight"}))
    spec = parse_spec(job(algorithm={"weight_swap": "in_flight", "max_staleness": 1}))
    assert spec.algorithm.weight_swap == "in_flight"
    assert parse_spec(job()).algorithm.weight_swap == "step"
    assert swaps_in_flight("in_flight", 1) and not swaps_in_flight("step", 1) and not swaps_in_flight("in_flight", 0)
    assert not swaps_in_flight("in_flight", 1, per_round_schedule=True)  # tail batching, `split`


@pytest.fixture(scope="module")
def replays():
    out = {}
    for mode in ("step", "in_flight"):
        spec = parse_spec(job(algorithm={"steps": 10, "max_staleness": 1, "weight_swap": mode}))
        out[mode] = {r.policy.name: r for r in run(spec, [PRESETS["on-demand"], PRESETS["rlboost-fixed"]])}
    return out


def test_the_next_step_generates_beside_the_last_ones_tail(replays):
    step, fly = replays["step"]["rlboost-fixed"], replays["in_flight"]["rlboost-fixed"]
    assert fly.steps == step.steps == 10
    assert fly.trained_tokens == step.trained_tokens  # the same responses, none lost or cut
    gen_end = lambda s: s["t0"] + s["gen_s"] - 0.01  # noqa: E731  (the step log rounds to ms)
    assert any(b["t0"] < gen_end(a) for a, b in zip(fly.step_log, fly.step_log[1:]))
    assert not any(b["t0"] < gen_end(a) for a, b in zip(step.step_log, step.step_log[1:]))
    assert sum(s["swapped"] for s in fly.step_log) > 0 and "swapped" not in step.step_log[0]
    # a response's first version is still within the bound
    assert max(s["staleness"] for s in fly.step_log) <= 1
    assert fly.trainer_busy_share > step.trainer_busy_share and fly.run_s < step.run_s


def test_the_trainer_alone_never_swaps(replays):
    """Without a remote engine no step generates while one trains: nothing is in flight at a publish."""
    step, fly = replays["step"]["on-demand"], replays["in_flight"]["on-demand"]
    assert [{k: v for k, v in s.items() if k != "swapped"} for s in fly.step_log] == step.step_log
    assert {s["swapped"] for s in fly.step_log} == {0}


def _coordinator(swap: bool) -> tuple[LiveCoordinator, EngineConn]:
    cfg = CoordinatorConfig(job_seed=0, temperature=1.0, chunk_tokens=8, heartbeat_s=1, heartbeat_timeout_s=4,
                            weights_url="", model={}, engine_dtype="float32", engine_batch=8, eos_id=EOS,
                            swap_in_flight=swap)
    coord = LiveCoordinator(cfg)
    coord.version = 0
    pool = coord.pool
    pool.step, pool.step_version = 0, 0
    pool.steps.add(0)
    coord.book.add(
        Response(rid=f"a{i}", step=0, version=0, prompt=[1, 3], max_new_tokens=9, seed=i, group="p0") for i in range(3)
    )
    conn = EngineConn("e1", "spot", "torch", 4, ws=None, state="ready", version=0)  # type: ignore[arg-type]
    pool.engines[conn.id] = conn
    coord.book.take("e1", 2, 0)  # a0 and a1 on e1, a2 queued
    coord.book.accept("e1", "a0", 0, [5, 6, 7], [-1.0] * 3, 0)
    return coord, conn


def _sent(conn: EngineConn) -> list[dict]:
    return [json.loads(conn.outq.get_nowait()) for _ in range(conn.outq.qsize())]


def test_a_new_version_mid_step_moves_every_response_onto_it():
    coord, conn = _coordinator(swap=True)
    b = coord.book
    asyncio.run(coord.publish(1))
    # the engine gives back what it holds (an abort before the new version: it pulls once idle)
    msgs = _sent(conn)
    assert [m["type"] for m in msgs] == ["abort", "version"] and sorted(msgs[0]["rids"]) == ["a0", "a1"]
    assert b.assigned("e1") == set() and coord.pool.step_version == 1 and coord.swapped == 2
    a0, a1, a2 = (b.responses[f"a{i}"] for i in range(3))
    assert (a0.first_version, a0.version, a0.swaps) == (0, 1, [(3, 1)])  # 3 tokens of version 0, then 1
    assert (a1.first_version, a1.version, a1.swaps) == (1, 1, [])  # nothing generated: version 1 begins it
    assert (a2.first_version, a2.version) == (1, 1)
    # a late frame of version 0 from e1 is dropped (it no longer holds a0); a0 continues on version 1
    assert b.accept("e1", "a0", 3, [9], [-1.0], 0) == 0
    assert [r.rid for r in b.take("e2", 1, 1)] == ["a0"]
    with pytest.raises(ProtocolViolation, match="tokens of version 0, step needs 1"):
        b.accept("e2", "a0", 3, [8], [-1.0], 0)
    assert b.accept("e2", "a0", 3, [8, EOS], [-1.0] * 2, 1) == 2
    assert a0.tokens == [5, 6, 7, 8, EOS]


def test_one_version_a_step_keeps_responses_on_their_engines():
    """weight_swap step: the engines hear of the version, and finish the step on the weights they hold."""
    coord, conn = _coordinator(swap=False)
    asyncio.run(coord.publish(1))
    assert [m["type"] for m in _sent(conn)] == ["version"]
    assert coord.book.assigned("e1") == {"a0", "a1"} and coord.pool.step_version == 0 and coord.swapped == 0
    assert all(r.version == r.first_version == 0 and not r.swaps for r in coord.book.responses.values())
