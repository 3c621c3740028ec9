"""`rlboost logs JOB`: the controller's log (detached runs) and the trainer's, restarts included.

Local jobs keep every instance's output in `<run dir>/instances/<id>/log`; a detached controller
writes `<run dir>/controller.log`. Lines are printed as text, never as rich markup (a log line may
hold `[...]`). aiohttp's per-request access lines drown everything else, so they are left out
unless asked for.

Following the controller and the trainer together (`-f`), each finished step is printed once: the
trainer's line (`step N/M  reward …  loss …  grad_norm …  lr …`), not the controller's progress line
for the same step (`step N  reward …`). The trainer's is kept because it is written by the process
that trained the step, the moment it finished, as one plain line (the controller's goes through rich,
padded and wrapped at the console's width), carries the optimizer's figures (loss, pg_loss, grad_norm,
lr, updates), is there whether or not the controller runs detached (an attached controller has no log
file), and its source label tells a restarted trainer's re-run steps (`-trainer-r1 | step 5/…`) apart.
The controller's other lines (provisioning, preemptions, evaluations, its end) are all kept; following
the controller alone (`launch` of a node-controlled job) keeps its step lines.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from rlboost.cli.detach import controller_log
from rlboost.cli.node_client import NodeClient, NodeLogMissing, NodeUnreachable, node_logs_dir, sync
from rlboost.cli.pids import controller_alive
from rlboost.cli.state import JobRow, StateStore, job_run_dir

ACCESS_MARK = "aiohttp.access"
CONTROLLER = "controller"  # the controller log's label
# the controller's per-step progress line (rlboost/cli/progress.py's JobProgress.step) as rich logs it:
# `[HH:MM:SS] step   3  reward 0.500  tokens …`, the time left blank when it repeats the line above's
CONTROLLER_STEP = re.compile(r"^\s*(\[[0-9:]+\])?\s*step +\d+ +reward ")


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
        out.append((CONTROLLER, ctl))
    for inst in store.instances(job.id):
        if inst.role == "trainer" and instance_log(job, inst.id).exists():
            out.append((inst.id, instance_log(job, inst.id)))
    return out


def keep(line: str, show_all: bool) -> bool:
    return show_all or ACCESS_MARK not in line


@dataclass(frozen=True)
class LogReader:
    """One log, wherever it is: `read(offset)` returns its bytes from `offset` on (maybe fewer)."""

    label: str
    where: str  # a path here, or the log's name on the trainer node
    read: Callable[[int], bytes]


def _file_reader(label: str, path: Path) -> LogReader:
    def read(offset: int) -> bytes:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read()
        except OSError:
            return b""

    return LogReader(label, str(path), read)


def readers(store: StateStore, job: JobRow, instance: str | None) -> list[LogReader]:
    """The logs to show for `job`: files here, or, for a job whose controller runs on the trainer
    node, that node's files through its control endpoint (NoLog when it does not answer)."""
    if not job.remote:
        return [_file_reader(label, path) for label, path in sources(store, job, instance)]
    client = NodeClient.for_job(job)
    try:
        refs = client.logs(instance)
    except NodeLogMissing as e:
        raise NoLog(str(e)) from None
    except NodeUnreachable as e:
        copied = _copied_node_logs(job, instance)
        if copied is not None:
            return copied
        raise NoLog(f"{e}; its logs live there (`rlboost status {job.id}` shows the last copy of its state)") from None
    return [LogReader(r.label, f"trainer node: {r.name}", lambda off, n=r.name: client.read_log(n, off)) for r in refs]


def _copied_node_logs(job: JobRow, instance: str | None) -> list[LogReader] | None:
    """The copy of an ended node-controlled job's logs kept here (node_client.copy_logs), if any."""
    from rlboost.cli.control_api import LogList

    dest = node_logs_dir(job)
    if instance is not None:
        path = dest / "instances" / instance / "log"
        return [_file_reader(instance, path)] if path.is_file() else None
    try:
        refs = LogList.model_validate_json((dest / "index.json").read_text()).logs
    except (OSError, ValueError):
        return None
    return [_file_reader(r.label, dest / r.name) for r in refs]


def _print(console: Console, text: str) -> None:
    # rstrip: rich pads the controller's own progress lines to the terminal width
    console.print(text.rstrip(), markup=False, highlight=False, emoji=False, soft_wrap=True)


def _read_all(src: LogReader) -> bytes:
    parts, off = [], 0
    while chunk := src.read(off):  # a node serves a log in pieces
        parts.append(chunk)
        off += len(chunk)
    return b"".join(parts)


def show_tail(console: Console, srcs: list[LogReader], lines: int, show_all: bool) -> dict[str, int]:
    """The last `lines` kept lines of each log, each under a header when there are several; returns
    how far each was read (where following picks up)."""
    read: dict[str, int] = {}
    for src in srcs:
        data = _read_all(src)
        read[src.where] = len(data)
        kept = [ln for ln in data.decode(errors="replace").splitlines() if keep(ln, show_all)]
        if len(srcs) > 1:
            _print(console, f"==> {src.label} ({src.where}) <==")
        for ln in kept[-lines:] if lines > 0 else []:
            _print(console, ln)
    return read


@dataclass
class Follower:
    """Print what each log gains, each line prefixed with its source, until the job ends."""

    console: Console
    show_all: bool
    offsets: dict[str, int] = field(default_factory=dict)
    partial: dict[str, bytes] = field(default_factory=dict)

    def drain(self, srcs: list[LogReader], prefix: bool) -> None:
        # the controller's step lines repeat the trainer's: left out while a trainer's log is followed too
        skip_steps = any(s.label != CONTROLLER for s in srcs)
        for src in srcs:
            while True:  # a log that appeared since (a restart): from its start
                got = src.read(self.offsets.get(src.where, 0))
                if not got:
                    break
                self.offsets[src.where] = self.offsets.get(src.where, 0) + len(got)
                drop = skip_steps and src.label == CONTROLLER
                self._lines(src.label, self.partial.pop(src.where, b"") + got, src.where, prefix, drop)

    def _lines(self, label: str, data: bytes, where: str, prefix: bool, drop_steps: bool = False) -> None:
        *complete, rest = data.split(b"\n")
        if rest:
            self.partial[where] = rest  # half a line: wait for its end
        for raw in complete:
            line = raw.decode(errors="replace")
            if keep(line, self.show_all) and not (drop_steps and CONTROLLER_STEP.match(line)):
                _print(self.console, f"{label} | {line}" if prefix else line)


def follow(
    f: Follower,
    store: StateStore,
    job: JobRow,
    instance: str | None,
    *,
    poll_s: float = 0.2,
    sleep: Callable[[float], None] = time.sleep,
    controller_only: bool = False,
) -> str:
    """Follow the job's logs until it ends, from where `f` has read them; returns why following stopped.
    `controller_only`: just the controller's lines, unprefixed (an attached launch of a node-controlled job)."""
    if job.remote:
        return _follow_node(f, store, job, instance, poll_s=max(poll_s, NODE_POLL_S), sleep=sleep, only=controller_only)
    prefix = instance is None
    ended_at: float | None = None
    while True:
        row = store.job_by_id(job.id)
        pid = row.controller_pid
        alive = controller_alive(pid, row.controller_start)
        # read after the liveness check: a controller records its end before it exits, so a dead
        # controller with an active row really died
        now = store.job_by_id(job.id)
        f.drain(readers(store, now, instance), prefix)
        if not now.active and ended_at is None:
            ended_at = time.monotonic()
        # once ended, the controller writes its last lines and exits (a pid reused since: give up)
        if ended_at is not None and (
            not controller_alive(now.controller_pid, now.controller_start) or time.monotonic() - ended_at > 10
        ):
            f.drain(readers(store, now, instance), prefix)  # the last words written before it exited
            return f"job {now.name} (id {now.id}) {now.status}"
        if now.active and pid and now.controller_pid == pid and not alive:
            return (
                f"job {now.name} (id {now.id}): its controller died; "
                f"`rlboost launch --resume {now.id}` continues it, `rlboost gc` cleans it up"
            )
        sleep(poll_s)


NODE_SILENCE_S = 30.0  # a node controller silent this long is reported, and following stops
# each poll of a node copies its whole records (node_client.sync): once a second, not five times
NODE_POLL_S = 1.0


def _follow_node(
    f: Follower,
    store: StateStore,
    job: JobRow,
    instance: str | None,
    *,
    poll_s: float,
    sleep: Callable[[float], None],
    only: bool,
) -> str:
    """Follow a node controller's logs through its endpoint; its records are copied here as it goes."""
    heard = time.monotonic()
    while True:
        reached = sync(store, store.job_by_id(job.id))
        now = store.job_by_id(job.id)
        if reached or not now.active:  # ended: its logs are copied here (or were, by whoever saw the end)
            heard = time.monotonic()
            with contextlib.suppress(NoLog, NodeUnreachable):
                srcs = readers(store, now, instance)
                f.drain([r for r in srcs if r.label == CONTROLLER] if only else srcs, instance is None and not only)
            if not now.active:  # its end is recorded after its last lines: nothing more will come
                return f"job {now.name} (id {now.id}) {now.status}"
        elif time.monotonic() - heard > NODE_SILENCE_S:
            return (
                f"job {now.name} (id {now.id}): its controller on the trainer node has not answered for "
                f"{NODE_SILENCE_S:.0f}s; `rlboost status {now.id}` shows the last copy, "
                f"`rlboost launch --resume {now.id}` takes the job over, `rlboost gc` cleans it up"
            )
        sleep(poll_s)
