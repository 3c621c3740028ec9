"""Tail migration: move long-running partial responses from slow or crowded engines to idle ones.

Only once nothing waits in the queue (the step's tail). For a response on engine s with E[remaining]
tokens left, compare
    stay:  E[remaining] * seq_time_s(n_s)
    move:  rtt + prefill(prompt + generated) on t + E[remaining] * seq_time_t(n_t + 1)
and move it when the gain beats both `min_gain_s` and `min_gain_frac` of staying. Longest first;
each move updates both loads (so the source speeds up and later candidates need more gain). The
response continues from prompt + partial tokens under the same weight version, so it is the same
response either way; only time changes.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rlboost.contracts.perf import EngineModel
from rlboost.rollout.policies.views import EngineView, ReqView


@dataclass(frozen=True)
class MigrationConfig:
    min_gain_s: float = 0.5
    min_gain_frac: float = 0.4
    rtt_s: float = 0.05  # abort + requeue + dispatch round trip
    min_on_engine_s: float = 2.0  # let a response settle (and its engine's rate be measured) first
    max_moves: int = 10_000


def plan_migrations(
    engines: Sequence[EngineView],
    running: Mapping[str, Sequence[ReqView]],
    queue_len: int,
    cfg: MigrationConfig = MigrationConfig(),
    default_model: EngineModel | None = None,
) -> list[tuple[str, str]]:
    """(rid, source engine) pairs to take back and re-dispatch. `running[engine]`: its responses."""
    if queue_len > 0:
        return []  # slots are still filling from the queue: nothing is idle
    targets = [e for e in engines if e.accepting and e.free > 0]
    if not targets:
        return []
    load = {e.id: e.active for e in engines}
    heap = [(t.seq_time(t.active + 1, default_model), t.id) for t in targets]
    heapq.heapify(heap)
    by_id = {e.id: e for e in engines}
    best_target = heap[0][0]
    cands: list[tuple[float, ReqView, EngineView]] = []
    for eid, reqs in running.items():
        src = by_id.get(eid)
        if src is None or not reqs:
            continue
        st = src.seq_time(src.active, default_model)
        if st <= best_target * (1.0 + cfg.min_gain_frac):
            continue  # nothing anywhere is meaningfully faster than staying here
        for r in reqs:
            if r.since_dispatch_s >= cfg.min_on_engine_s:
                cands.append((r.expected_left * st, r, src))
    cands.sort(key=lambda c: -c[0])
    moves: list[tuple[str, str]] = []
    st_cache: dict[tuple[str, int], float] = {}
    for stay0, r, src in cands:
        if not heap or len(moves) >= cfg.max_moves or stay0 < cfg.min_gain_s:
            break  # sorted by time to stay: nothing further down can gain enough
        key = (src.id, load[src.id])
        st_src = st_cache.get(key)
        if st_src is None:
            st_src = st_cache[key] = src.seq_time(load[src.id], default_model)
        stay = r.expected_left * st_src
        t_time, tid = heap[0]
        if tid == src.id:
            continue
        tgt = by_id[tid]
        move = cfg.rtt_s + tgt.prefill_s(r.context, default_model) + r.expected_left * t_time
        if stay - move < max(cfg.min_gain_s, cfg.min_gain_frac * stay):
            continue
        heapq.heappop(heap)
        moves.append((r.rid, src.id))
        load[src.id] -= 1
        load[tid] += 1
        if load[tid] < tgt.capacity:
            heapq.heappush(heap, (tgt.seq_time(load[tid] + 1, default_model), tid))
    return moves


def worth_a_look(
    expected_left: np.ndarray, seq_time_src: float, on_engine_s: np.ndarray, cfg: MigrationConfig
) -> np.ndarray:
    """Cheap vectorised pre-filter of one source engine's responses: those plan_migrations could move
    (settled long enough, and staying would take longer than the smallest gain it accepts)."""
    return (np.asarray(on_engine_s) >= cfg.min_on_engine_s) & (
        np.asarray(expected_left) * seq_time_src >= cfg.min_gain_s
    )


def may_gain(
    expected_left: np.ndarray,
    context: np.ndarray,
    seq_time_src: float,
    best_target_s: float,
    prefill_s_per_token: float,
    cfg: MigrationConfig,
) -> np.ndarray:
    """Responses plan_migrations could ever move off a source engine (a necessary condition, so
    dropping the rest changes none of its moves). Within one plan the source only gets lighter
    (staying never takes longer than at `seq_time_src`) and targets only fill up (moving never takes
    less than at `best_target_s`, with the fastest prefill of any target), so a response that fails
    the gain test at those bounds fails it at every point of the plan."""
    el = np.asarray(expected_left, dtype=np.float64)
    stay = el * seq_time_src
    move = cfg.rtt_s + np.asarray(context, dtype=np.float64) * prefill_s_per_token + el * best_target_s
    slack = 1e-9 * (stay + move) + 1e-12  # float rounding in plan_migrations' own arithmetic
    gain_ok = stay - move + slack >= cfg.min_gain_s
    frac_ok = (1.0 - cfg.min_gain_frac) * stay + slack >= move
    return gain_ok & frac_ok
