"""`rlboost logs JOB`: the controller's log (detached runs) and the trainer's, restarts included.

Local jobs keep every instance's output in `<run dir>/instances/<id>/log`; a detached controller
writes `<run dir>/controller.log`. Lines are printed as text, never as rich markup (a log line may
hold `[...]`). aiohttp's per-request access lines drown everything else, so they are left out
unless asked for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from rlboost_cli.detach import controller_log
from rlboost_cli.reconcile import controller_alive, job_run_dir
from rlboost_cli.state import JobRow, StateStore

ACCESS_MARK = "aiohttp.access"


class NoLog(Exception):
    """There is no log to show; the message is user-facing."""


def instance_log(job: JobRow, instance_id: str) -> Path:
    return job_run_dir(job) / "instances" / instance_id / "log"


def sources(store: StateStore, job: JobRow, instance: str | None) -> list[tuple[str, Path]]:
    """(label, path) of each log to show, in order: one instance's, or the controller's then every
    trainer's (`-trainer`, `-trainer-r1`, …) that has written one."""
    if instance is not None:
        path = instance_log(job, instance)
        if not path.exists():
            known = ", ".join(i.id for i in store.instances(job.id)) or "none"
            raise NoLog(f"no log for instance {instance!r} of job {job.name} (id {job.id}); instances: {known}")
        return [(instance, path)]
    out = []
    ctl = controller_log(job_run_dir(job))
    if ctl.exists():
        out.append(("controller", ctl))
    for inst in store.instances(job.id):
        if inst.role == "trainer" and instance_log(job, inst.id).exists():
            out.append((inst.id, instance_log(job, inst.id)))
    return out


def keep(line: str, show_all: bool) -> bool:
    return show_all or ACCESS_MARK not in line


def _print(console: Console, text: str) -> None:
    # rstrip: rich pads the controller's own progress lines to the terminal width
    console.print(text.rstrip(), markup=False, highlight=False, emoji=False, soft_wrap=True)


def show_tail(console: Console, srcs: list[tuple[str, Path]], lines: int, show_all: bool) -> dict[Path, int]:
    """The last `lines` kept lines of each log, each under a header when there are several; returns
    how far each was read (where following picks up)."""
    read: dict[Path, int] = {}
    for label, path in srcs:
        data = path.read_bytes()
        read[path] = len(data)
        kept = [ln for ln in data.decode(errors="replace").splitlines() if keep(ln, show_all)]
        if len(srcs) > 1:
            _print(console, f"==> {label} ({path}) <==")
        for ln in kept[-lines:] if lines > 0 else []:
            _print(console, ln)
    return read


@dataclass
class Follower:
    """Print what each log gains, each line prefixed with its source, until the job ends."""

    console: Console
    show_all: bool
    offsets: dict[Path, int] = field(default_factory=dict)
    partial: dict[Path, bytes] = field(default_factory=dict)

    def drain(self, srcs: list[tuple[str, Path]], prefix: bool) -> None:
        for label, path in srcs:
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets.get(path, 0))  # a log that appeared since (a restart): from its start
                    data = self.partial.pop(path, b"") + f.read()
                    self.offsets[path] = f.tell()
            except OSError:
                continue
            *complete, rest = data.split(b"\n")
            if rest:
                self.partial[path] = rest  # half a line: wait for its end
            for raw in complete:
                line = raw.decode(errors="replace")
                if keep(line, self.show_all):
                    _print(self.console, f"{label} | {line}" if prefix else line)


def follow(
    console: Console,
    store: StateStore,
    job: JobRow,
    instance: str | None,
    show_all: bool,
    *,
    poll_s: float = 0.2,
    read: dict[Path, int] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Follow the job's logs until it ends; returns why following stopped."""
    f = Follower(console, show_all, offsets=dict(read or {}))
    prefix = instance is None
    ended_at: float | None = None
    while True:
        pid = store.job_by_id(job.id).controller_pid
        alive = controller_alive(pid)
        # read after the liveness check: a controller records its end before it exits, so a dead
        # controller with an active row really died
        now = store.job_by_id(job.id)
        f.drain(sources(store, now, instance), prefix)
        if not now.active and ended_at is None:
            ended_at = time.monotonic()
        # once ended, the controller writes its last lines and exits (a pid reused since: give up)
        if ended_at is not None and (not controller_alive(now.controller_pid) or time.monotonic() - ended_at > 10):
            f.drain(sources(store, now, instance), prefix)  # the last words written before it exited
            return f"job {now.name} (id {now.id}) {now.status}"
        if now.active and pid and now.controller_pid == pid and not alive:
            return (
                f"job {now.name} (id {now.id}): its controller died; "
                f"`rlboost launch --resume {now.id}` continues it, `rlboost gc` cleans it up"
            )
        sleep(poll_s)
