"""What `rlboost launch` shows while it runs: provisioning, a step bar with reward, worker counts."""

from __future__ import annotations

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
            info=f"{r} · v{snap.get('version', '-')} · {len(live_workers)} spot workers"
            f" · {preemptions} preempted · {snap.get('migrated', 0)} migrated",
        )
