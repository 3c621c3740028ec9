"""Third-party warnings (wandb's, a library's DeprecationWarning) go to the job's controller log, not the
console of an attached `rlboost launch`: the progress bar and the step lines stay readable, and
`rlboost logs JOB` still shows them."""

from __future__ import annotations

import logging
import os
from pathlib import Path

_LOGGER = "py.warnings"  # where logging.captureWarnings sends them
# the one installed: a process runs one job's controller at a time, and one made but never run (or not
# removed) must not keep writing warnings to its log when the next is installed
_installed: list[WarningsToLog] = []


def private(path: str, flags: int) -> int:
    """open()'s opener for a log made here: 0600, like every file rlboost writes in its home."""
    return os.open(path, flags, 0o600)


class _PrivateFileHandler(logging.FileHandler):
    def _open(self):  # type: ignore[no-untyped-def]
        return open(self.baseFilename, self.mode, encoding=self.encoding, errors=self.errors, opener=private)


class WarningsToLog:
    """While installed, every warning the `warnings` module would print is appended to `path` instead."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handler: logging.Handler | None = None
        self.propagate = True

    def install(self) -> WarningsToLog:
        if self.handler is not None:
            return self
        for earlier in list(_installed):
            earlier.remove()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handler = _PrivateFileHandler(self.path, encoding="utf-8", delay=True)
        handler.setFormatter(logging.Formatter("%(asctime)s warning: %(message)s"))
        log = logging.getLogger(_LOGGER)
        self.propagate = log.propagate
        log.addHandler(handler)
        log.propagate = False  # not to the root logger's stderr handler either
        self.handler = handler
        logging.captureWarnings(True)
        _installed.append(self)
        return self

    def remove(self) -> None:
        if self.handler is None:
            return
        logging.captureWarnings(False)
        log = logging.getLogger(_LOGGER)
        log.removeHandler(self.handler)
        log.propagate = self.propagate
        self.handler.close()
        self.handler = None
        if self in _installed:
            _installed.remove(self)

    def __enter__(self) -> WarningsToLog:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.remove()

