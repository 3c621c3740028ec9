"""What the coordinator needs from the engines it schedules: the `EnginePool` seam.

The coordinator (rollout/coordinator.py) makes every decision of a step; a pool measures the engines
and the step's responses for it and carries its decisions out. The live pool (rollout/live_pool.py)
holds WebSocket connections and the rollout book: it measures engines by the tokens they stream and
sends `generate` / `abort`. The simulator's (simulator/modelled_pool.py) holds modelled engines on a
virtual clock. Items are a pool's own handles of the step's responses (a request id, an array index);
the coordinator passes them through and names them to the policies as strings (`rid`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rlboost.rollout.policies.offload import Drafting
from rlboost.rollout.policies.views import EngineView, ReqView

Item = Hashable  # a pool's handle of one response of the step


@dataclass(frozen=True)
class ProgressInputs:
    """The measurements the offload policy's view of a step is built from (policies/offload.py
    step_progress): the ready remote engines, every unfinished response's generated tokens and budget
    left, the step's tokens so far, and what would move off the reserved engines."""

    remote: Sequence[EngineView]
    generated: np.ndarray
    budget_left: np.ndarray
    held_tokens: float
    reserved_context: float
    reserved_rate: float


@dataclass(frozen=True)
class EngineInfo:
    """An engine as a migration round sees it: its view, whether it can take a response (accepting,
    a slot free), one sequence's seconds per token with one more sequence and its prefill seconds per
    token (as a target), and one sequence's seconds per token at its load now (as a source)."""

    view: EngineView
    target: bool
    seq_next_s: float
    prefill_s: float
    seq_now_s: float

    @classmethod
    def of(cls, v: EngineView) -> EngineInfo:
        inf = float("inf")
        target = v.accepting and v.free > 0
        return cls(
            v,
            target,
            v.seq_time(v.active + 1) if target else inf,
            v.prefill_s(1) if target else inf,
            v.seq_time(v.active),
        )


@dataclass(frozen=True)
class Held:
    """Responses one engine holds that have settled there (on it at least `min_on_engine_s`), as arrays:
    the pool's items, seconds on the engine, tokens generated, budget left and prompt tokens."""

    items: np.ndarray
    on_engine_s: np.ndarray
    generated: np.ndarray
    budget_left: np.ndarray
    prompt_len: np.ndarray


class EnginePool(Protocol):
    # ---- engines ----------------------------------------------------------------------------------
    def n_remote(self) -> int:
        """Remote engines serving or pulling the weights: the step's remote pool at its start."""

    def reserved(self) -> list[str]:
        """The trainer cluster's own engines (not gone)."""

    def remote_ready(self) -> bool:
        """A remote engine is ready (holds the current weights)."""

    def serving(self, engine: str) -> bool:
        """The engine is ready or pulling the weights (not lost, not gone)."""

    def clear_offloaded(self) -> None:
        """The reserved engines take work again (every remote engine is gone)."""

    # ---- the step's responses ----------------------------------------------------------------------
    def queue_len(self) -> int:
        """Responses waiting for an engine."""

    def progress_inputs(self, now: float) -> ProgressInputs: ...

    def drafting(self) -> Drafting | None:
        """How the engines speculate: their measured acceptance and most drafted tokens per pass, which
        the offload policy's prediction of the remote pool's finish uses (None: plain decoding)."""

    # ---- dispatch -----------------------------------------------------------------------------------
    def open_engines(self, now: float) -> list[EngineView]:
        """Engines that take the step's work now and have a slot free."""

    def queue_head(self, n: int) -> list[Item]:
        """Up to `n` distinct queued responses, from the front (taken off the queue: what is not placed
        goes back with put_back)."""

    def fresh(self, items: Sequence[Item]) -> bool:
        """None of them holds a token yet (they are alike to every placement)."""

    def req_views(self, items: Sequence[Item], now: float) -> list[ReqView]: ...

    def groups(self, items: Sequence[Item] | np.ndarray) -> list[Hashable]:
        """Each response's GRPO group, as the coordinator's begin_step named them (sibling scheduling;
        items as queue_head or Held gives them)."""

    def avoid(self, items: Sequence[Item]) -> dict[str, set[str]]:
        """Engines each may not go to (one it was migrated away from, one still aborting it)."""

    def put_back(self, items: Sequence[Item]) -> None:
        """Unplaced responses back to the front of the queue, in order."""

    def admit(self, plan: Sequence[tuple[Item, str]], now: float) -> None:
        """The engines take these responses (engine id per item)."""

    # ---- migration ----------------------------------------------------------------------------------
    def engine_infos(self, now: float) -> list[EngineInfo]:
        """Every engine not gone, as a migration round sees it."""

    def held(self, engine: str, now: float, min_on_engine_s: float) -> Held | None:
        """The responses settled on `engine` (None: none has)."""

    def rids(self, items: np.ndarray) -> list[str]: ...

    def item(self, rid: str) -> Item: ...

    def take_back(self, moves: Sequence[tuple[Item, str]], now: float) -> int:
        """Take these responses off their engines (engine id per item) to go elsewhere, tokens kept;
        how many moved."""

    # ---- offload and tail batching ------------------------------------------------------------------
    def hand_over(self, engines: Sequence[str], now: float) -> int:
        """The reserved engines stop taking work for the rest of the step and give back what they hold
        (tokens kept); how many responses moved."""

    def drop_unfinished(self, keep: set[Hashable], now: float) -> list[Hashable]:
        """Tail batching: drop every response of the step but those of complete groups `keep`; the
        groups dropped."""
