"""Is a controller process still there? (Shared by the commands that tell live jobs from dead.)"""

from __future__ import annotations

from providers.local import pid_alive


def controller_alive(pid: int | None) -> bool:
    """Is the controller process still there (a zombie is not)?"""
    return bool(pid) and pid_alive(pid)
