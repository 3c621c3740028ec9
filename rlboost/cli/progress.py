"""What `rlboost launch` shows while it runs: provisioning, a step bar with reward, worker counts."""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from rlboost.cli.step_numbers import shown
from rlboost.contracts.step_record import StepRecord
from rlboost.contracts.wording import spot_workers


class JobProgress:
    def __init__(self, console: Console, steps: int) -> None:
        self.console = console
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            console=console,
            transient=False,
        )
        self.boot = self.progress.add_task("provisioning", total=1, info="")
        self.train = self.progress.add_task("training", total=steps, info="", visible=False)

    def __enter__(self) -> JobProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)  # type: ignore[arg-type]

    def provisioning(self, what: str) -> None:
        self.progress.update(self.boot, info=escape(what))  # the info column renders markup

    def provisioned(self, what: str) -> None:
        self.progress.update(self.boot, completed=1, info=escape(what))
        self.progress.update(self.train, visible=True)

    def note(self, line: str) -> None:
        self.console.log(line, markup=False)  # notes quote provider errors and ids, not markup

    def step(self, rec: StepRecord) -> None:
        n = shown(rec.step)
        self.console.log(
            f"step {n:>3}  reward {rec.reward:.3f}  tokens {rec.tokens}  migrated {rec.migrated}  {rec.step_s:.2f}s"
        )
        self.progress.update(self.train, completed=n)

    def caught_up(self, rec: StepRecord) -> None:
        """A step recorded before (a resumed controller, a restarted trainer's history): the bar only."""
        self.progress.update(self.train, completed=shown(rec.step))

    def update(self, snap: dict, live_workers: list, preemptions: int) -> None:
        reward = snap.get("reward")
        r = f"reward {reward:.3f}" if reward is not None else snap.get("phase", "")
        self.progress.update(
            self.train,
            info=f"{r} · v{snap.get('version', '-')} · {spot_workers(len(live_workers))}"
            f" · {preemptions} preempted · {snap.get('migrated', 0)} migrated",
        )


class ReplayLines:
    """`rlboost simulate`'s progress where stderr is no terminal (piped, logged, CI): plain lines such as
    `simulate: policy rlboost done, 3/8 replays done (41%)`, at most one per `every` seconds (`clock`'s),
    and always the last one (every replay done). Stdout stays the results'."""

    def __init__(
        self,
        out: Console,
        names: list[str],
        *,
        every: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out, self.names, self.every, self.clock = out, names, every, clock
        self.done = [0.0] * len(names)
        self.last: float | None = None
        self.finished_last: str | None = None

    def update(self, k: int, fraction: float) -> None:
        was = self.done[k]
        self.done[k] = max(was, min(1.0, fraction))
        if self.done[k] >= 1.0 > was:
            self.finished_last = self.names[k]
        finished = sum(1 for f in self.done if f >= 1.0)
        now = self.clock()
        if finished < len(self.done) and self.last is not None and now - self.last < self.every:
            return
        if finished == len(self.done) and self.last is not None and was >= 1.0:
            return  # the last line is out already
        self.last = now
        share = sum(self.done) / max(1, len(self.done))
        newest = f"{self.finished_last} done, " if self.finished_last else ""
        self.finished_last = None
        self.out.print(
            f"simulate: {newest}{finished}/{len(self.done)} replays done ({share:.0%})",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
