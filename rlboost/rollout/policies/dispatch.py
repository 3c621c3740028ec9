"""Dispatch: which engine gets which queued request.

- `spread`: fill free slots in proportion (the original behaviour; rate-blind).
- `rate`:   longest expected work first, each to the engine where one more sequence runs fastest
            (measured rate and load; the performance model before a measurement). While the queue
            exceeds the free slots every slot fills anyway; at the tail this puts the long partial
            responses on fast, lightly loaded engines instead of behind a full batch.
            Given the requests' GRPO groups (sibling scheduling), a request goes to the engine that got
            the fewest of its siblings in this plan among those nearly as fast (`SPREAD_SLACK`): a
            group's lengths are alike, so a long group spread over engines does not leave one engine
            with several long responses at the tail (Seer's divided rollout).

Only the head of the queue (as many requests as there are free slots) is looked at, so one call costs
O(free slots * log engines) however long the queue is.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Mapping, Sequence

from rlboost.contracts.perf import EngineModel
from rlboost.rollout.policies.views import EngineView, ReqView

# an engine this much slower per token (at one more sequence) than the fastest is still worth it to keep
# a group's responses apart
SPREAD_SLACK = 0.25


def plan_dispatch(
    queue: Sequence[ReqView],
    engines: Sequence[EngineView],
    mode: str = "rate",
    default_model: EngineModel | None = None,
    avoid: dict[str, set[str]] | None = None,
    groups: Mapping[str, Hashable] | None = None,
) -> list[tuple[str, str]]:
    """(rid, engine id) assignments for the head of `queue`. `avoid[rid]`: engines not to use for it
    (the one a migrated response is leaving, ones that have not confirmed its abort yet); `groups[rid]`:
    its GRPO group, to spread each group over engines (rate mode)."""
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
    siblings: dict[Hashable, dict[str, int]] = {}  # group -> engine -> how many of it this plan gave it
    for r in head:
        bad = avoid.get(r.rid, ())
        while heap and heap[0][1] in bad:
            parked.append(heapq.heappop(heap))
        if not heap:
            break
        best = heapq.heappop(heap)
        if groups is not None:
            best = _apart(heap, best, siblings, groups.get(r.rid), bad)
        eid = best[1]
        for item in parked:
            heapq.heappush(heap, item)
        parked.clear()
        out.append((r.rid, eid))
        if groups is not None:
            got = siblings.setdefault(groups.get(r.rid), {})
            got[eid] = got.get(eid, 0) + 1
        load[eid] += 1
        e = by_id[eid]
        if load[eid] < e.capacity:
            heapq.heappush(heap, (e.seq_time(load[eid] + 1, default_model), eid))
    return out


def _apart(
    heap: list[tuple[float, str]],
    best: tuple[float, str],
    siblings: dict[Hashable, dict[str, int]],
    group: Hashable,
    bad: Sequence[str] | set[str],
) -> tuple[float, str]:
    """Of `best` (popped off `heap`) and the engines within SPREAD_SLACK of it, the one that got the
    fewest of `group` in this plan, fastest first (the others stay on the heap)."""
    given = siblings.get(group)
    if not given or best[1] not in given:
        return best
    near = [best]
    limit = best[0] * (1.0 + SPREAD_SLACK)
    while heap and heap[0][0] <= limit:
        near.append(heapq.heappop(heap))
    pick = min((x for x in near if x[1] not in bad or x is best), key=lambda x: (given.get(x[1], 0), x))
    for x in near:
        if x is not pick:
            heapq.heappush(heap, x)
    return pick


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
