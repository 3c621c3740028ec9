"""Is a controller process still there? (Shared by the commands that tell live jobs from dead.)"""

from __future__ import annotations

import os
from pathlib import Path


def controller_alive(pid: int | None) -> bool:
    """Is the controller process still there (a zombie is not)?"""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True  # no /proc (macOS): kill(0) said it exists
