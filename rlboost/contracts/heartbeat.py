"""A node's heartbeat file: when did a process that is gone last run?

A local node (the local provider's stand-in for a cloud node) touches `heartbeat` in its instance
directory every second. When a controller comes back after a crash, an instance that exited while it
was down is billed until its last beat, not until the controller noticed (a cloud reports the same
from its own records). Both sides read the name and the period from here.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

HEARTBEAT_FILE = "heartbeat"
BEAT_EVERY_S = 1.0


def start_heartbeat(directory: Path, every_s: float = BEAT_EVERY_S) -> threading.Event:
    """Touch `directory/heartbeat` now and every `every_s` from a daemon thread; set the returned
    event to stop. A directory that cannot be written is skipped silently: a heartbeat is evidence
    for billing, never a reason for a node to fail."""
    path = directory / HEARTBEAT_FILE
    stop = threading.Event()

    def beat() -> None:
        while True:
            with contextlib.suppress(OSError):
                path.touch()
            if stop.wait(every_s):
                return

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()
    return stop


def last_beat(directory: Path) -> float | None:
    """Wall time of the last beat in `directory` (None: it never beat)."""
    try:
        return os.stat(directory / HEARTBEAT_FILE).st_mtime
    except OSError:
        return None
