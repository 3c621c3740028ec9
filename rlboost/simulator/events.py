"""The virtual clock: events in time order, ties in the order they were pushed.

Every part of a replay pushes its events here and registers one handler per kind (`on`); the replay's
loop (rlboost/simulator/core.py) pops them and moves `now`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

INF = float("inf")


class EventQueue:
    __slots__ = ("handlers", "heap", "now", "seq")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, str, Any]] = []  # (time, push order, kind, payload)
        self.seq = 0
        self.now = 0.0
        self.handlers: dict[str, Callable[[Any], None]] = {}

    def on(self, kind: str, handler: Callable[[Any], None]) -> None:
        if kind in self.handlers:
            raise ValueError(f"two handlers for event kind {kind!r}")
        self.handlers[kind] = handler

    def push(self, t: float, kind: str, payload: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, payload))
