"""Is a job's controller process still there? Told by its pid *and* its start, never the pid alone.

A pid is reused once its process is gone: a dead controller's pid taken by any other process would
otherwise read as a live controller (`gc` leaves its instances running unsupervised, `--resume`
refuses). The start is `<boot id>:<start time in clock ticks>` from /proc, which no other process
shares. Where /proc cannot be read (macOS) the start is unknown and the command line is checked.
"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

from rlboost.providers.local import pid_alive

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_MACHINE_ID = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))


def process_start(pid: int) -> str | None:
    """`<boot id>:<start ticks>` of process `pid` (None: not there, or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = _BOOT_ID.read_text().strip()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: count fields after its last ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    return f"{boot}:{fields[19]}" if len(fields) > 19 else None


def controller_identity(pid: int | None = None) -> dict:
    """The job-row fields that name a controller process (this one by default)."""
    pid = os.getpid() if pid is None else pid
    return {"controller_pid": pid, "controller_start": process_start(pid)}


def controller_alive(pid: int | None, start: str | None = None) -> bool:
    """Is the controller recorded as (`pid`, `start`) still running (a zombie is not)? Without a
    recorded start (a job recorded before starts were), the process must at least run rlboost."""
    if not pid or not pid_alive(pid):
        return False
    now = process_start(pid)
    if start is not None and now is not None:
        return now == start
    return _runs_rlboost(pid)


def _runs_rlboost(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc (macOS): the pid is all there is to go by
    return b"rlboost" in cmdline


def _machine() -> str:
    """This machine, as 12 hex digits (its machine id, else its host name, hashed)."""
    for p in _MACHINE_ID:
        try:
            if got := p.read_text().strip():
                return hashlib.sha256(got.encode()).hexdigest()[:12]
        except OSError:
            continue
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:12]


def controller_tag(pid: int | None = None) -> str | None:
    """A controller process (this one by default) as a cloud tag value, `<machine>-<boot>-<pid>-<start
    ticks>` (lowercase hex and digits, under 63 characters: a GCP label too): another store's `gc
    --all-stores` tells from it whether the job's controller still runs. None: no /proc (macOS)."""
    pid = os.getpid() if pid is None else pid
    start = process_start(pid)
    if start is None:
        return None
    boot, ticks = start.split(":", 1)
    return f"{_machine()}-{boot.replace('-', '')[:12]}-{pid}-{ticks}"


def tagged_controller_alive(tag: str) -> bool | None:
    """Does the controller `tag` names (controller_tag) still run? None: it ran on another machine,
    where this one cannot tell (a tag that does not parse counts as that too)."""
    parts = tag.split("-")
    if len(parts) != 4 or parts[0] != _machine() or not parts[2].isdigit():
        return None
    pid = int(parts[2])
    # gone, its pid reused, or this machine rebooted since (another boot id): not the tagged controller
    return pid_alive(pid) and controller_tag(pid) == tag
