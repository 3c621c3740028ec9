"""When the coordinator reconsiders a step: how often it ticks (offload and migration are decided on
ticks), and which ticks run a migration round. The live coordinator and the simulator both ask this,
so a replay makes its decisions at the moments the trainer would."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TickCadence:
    tick_s: float = 0.1  # how often offload and migration are reconsidered (at least) ...
    tick_fraction: float = 0.02  # ... or this fraction of the step's expected length, if longer
    migrate_every: int = 5  # a migration round on every n-th tick when nothing changed

    def period(self, last_step_s: float, elapsed: float) -> float:
        """Seconds to the next tick: long steps need fewer (the last step's length, or how long this
        one has run)."""
        return max(self.tick_s, max(last_step_s, elapsed) * self.tick_fraction)

    def migrate_now(self, *, queue_empty: bool, changed: bool, tick: int) -> bool:
        """Tail migration once nothing waits in the queue: on the first tick after slots freed up or an
        engine joined (`changed`), else on every `migrate_every`-th tick of the step (counted from 1),
        since what else moves the plan (responses settling, their expected rest) changes slowly."""
        return queue_empty and (changed or tick % self.migrate_every == 0)
