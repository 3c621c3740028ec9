"""One line per fleet event while a job runs (a preemption notice, a preemption, responses migrated, the
fleet resized), on the attached console and in the job's controller.log, which `rlboost logs -f`
follows: not only the counters of the progress bar. A detached controller's console is that log
already: it is written once."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from rlboost.cli.warnings_log import private


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except (OSError, ValueError):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class EventLines:
    def __init__(
        self,
        console: Console,
        log: Path,
        *,
        stdout_fd: Callable[[], int] = lambda: sys.stdout.fileno(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.console, self.log, self.stdout_fd, self.clock = console, log, stdout_fd, clock
        self.migrated_seen: int | None = None  # the trainer's count of migrated responses, last seen

    def preemption(self, iid: str, notice: bool, detail: str) -> None:
        what = "preemption notice" if notice else "preempted"
        self.say(f"{what}: spot worker {iid}" + (f" ({detail})" if detail else ""))

    def migrated(self, total: object) -> None:
        """The trainer's running count of responses moved mid-generation to another engine: a line for
        each rise (none for the count a resumed controller first sees)."""
        if not isinstance(total, int):
            return
        if self.migrated_seen is not None and total > self.migrated_seen:
            n = total - self.migrated_seen
            responses = f"{n} partial response{'s' if n != 1 else ''}"
            self.say(f"migrated: {responses} continued on other engines ({total} in all)")
        self.migrated_seen = total

    def say(self, line: str) -> None:
        with contextlib.suppress(Exception):  # a closed terminal
            self.console.log(line, markup=False, highlight=False)
        with contextlib.suppress(Exception):
            if _same_file(self.stdout_fd(), self.log):
                return  # a detached controller: the console line above is in the log already
        stamp = time.strftime("%H:%M:%S", time.localtime(self.clock()))
        # a full disk: the console has it
        with contextlib.suppress(OSError), open(self.log, "a", encoding="utf-8", opener=private) as f:
            f.write(f"[{stamp}] {line}\n")
