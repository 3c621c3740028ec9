"""Dispatch: which engine gets which queued request.

- `spread`: fill free slots in proportion (the original behaviour; rate-blind).
- `rate`:   longest expected work first, each to the engine where one more sequence runs fastest
            (measured rate and load; the performance model before a measurement). While the queue
            exceeds the free slots every slot fills anyway; at the tail this puts the long partial
            responses on fast, lightly loaded engines instead of behind a full batch.

Only the head of the queue (as many requests as there are free slots) is looked at, so one call costs
O(free slots * log engines) however long the queue is.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from rlboost.contracts.perf import EngineModel
from rlboost.rollout.policies.views import EngineView, ReqView


def plan_dispatch(
    queue: Sequence[ReqView],
    engines: Sequence[EngineView],
    mode: str = "rate",
    default_model: EngineModel | None = None,
    avoid: dict[str, set[str]] | None = None,
) -> list[tuple[str, str]]:
    """(rid, engine id) assignments for the head of `queue`. `avoid[rid]`: engines not to use for it
    (the one a migrated response is leaving, ones that have not confirmed its abort yet)."""
    open_engines = [e for e in engines if e.accepting and e.free > 0]
    if not queue or not open_engines:
        return []
    if mode == "spread":
        return _spread(queue, open_engines, avoid or {})
    if mode != "rate":
        raise ValueError(f"unknown dispatch mode {mode!r} (spread, rate)")
    total_free = sum(e.free for e in open_engines)
    head = sorted(queue[:total_free], key=lambda r: -r.expected_left)
    load = {e.id: e.active for e in open_engines}
    by_id = {e.id: e for e in open_engines}
    heap = [(e.seq_time(e.active + 1, default_model), e.id) for e in open_engines]
    heapq.heapify(heap)
    out: list[tuple[str, str]] = []
    parked: list[tuple[float, str]] = []
    avoid = avoid or {}
    for r in head:
        bad = avoid.get(r.rid, ())
        while heap and heap[0][1] in bad:
            parked.append(heapq.heappop(heap))
        if not heap:
            break
        _, eid = heapq.heappop(heap)
        for item in parked:
            heapq.heappush(heap, item)
        parked.clear()
        out.append((r.rid, eid))
        load[eid] += 1
        e = by_id[eid]
        if load[eid] < e.capacity:
            heapq.heappush(heap, (e.seq_time(load[eid] + 1, default_model), eid))
    return out


def _spread(
    queue: Sequence[ReqView], engines: Sequence[EngineView], avoid: dict[str, set[str]]
) -> list[tuple[str, str]]:
    total_free = sum(e.free for e in engines)
    n = len(queue)
    out: list[tuple[str, str]] = []
    pending = list(queue)
    for e in engines:
        share = min(e.free, math.ceil(n * e.free / total_free))
        rest = []
        for r in pending:
            if share > 0 and e.id not in avoid.get(r.rid, ()):
                out.append((r.rid, e.id))
                share -= 1
            else:
                rest.append(r)
        pending = rest
    return out
