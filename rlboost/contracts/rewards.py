"""Custom rewards: `task.reward: mypkg.rewards:score`, a Python function the trainer calls as
`score(prompt: str, response: str, row: dict) -> float` for every response.

The job file is checked with `import_reward` when it is loaded (on the launching machine and again on
the trainer node), so a bad path stops the job before anything launches. At run time a reward that
raises, or returns something other than a finite number, must not kill a job hours in, nor go
unnoticed: that response gets reward 0.0, the failure is counted per kind (the exception's class
name, `non-finite`, `not a number`) and logged with its first example once per kind.
"""

from __future__ import annotations

import importlib
import logging
import math
import re
from collections.abc import Callable
from typing import Any

log = logging.getLogger("rlboost.trainer")

RewardFn = Callable[[str, str, dict], Any]

# dotted module path, a colon, a dotted attribute path: mypkg.rewards:score, rewards:Scorer.score
_IMPORT_PATH = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


def is_import_path(text: str) -> bool:
    return bool(_IMPORT_PATH.fullmatch(text))


class RewardImportError(ValueError):
    """Phrased for the job file's `task.reward` field (the caller adds the field name)."""


def import_reward(path: str) -> RewardFn:
    """`module.sub:function` -> the callable; RewardImportError says what failed and how to fix it."""
    if not is_import_path(path):
        raise RewardImportError(f"{path!r} is not an import path; write module.submodule:function")
    module_name, _, attr = path.partition(":")
    fix = (
        "install its package where rlboost runs and on the trainer node (pip install ...), "
        "or put its directory on PYTHONPATH as an absolute path"
    )
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise RewardImportError(f"cannot import {module_name!r} ({e}); {fix}") from None
    except Exception as e:  # the user's module failed while importing: say where
        raise RewardImportError(f"importing {module_name!r} raised {type(e).__name__}: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RewardImportError(f"module {module_name!r} has no attribute {attr!r}; check the name after ':'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise RewardImportError(
            f"{path} is a {type(obj).__name__}, not a function; it must be callable as "
            "score(prompt: str, response: str, row: dict) -> float"
        )
    return obj


class CustomReward:
    """Calls the user's reward safely: a failure scores 0.0, is counted, and is logged once per kind."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fn = import_reward(path)
        self.errors: dict[str, int] = {}  # kind -> count, for the whole job (this trainer process)

    def __call__(self, prompt: str, response: str, row: dict) -> float:
        try:
            value = self.fn(prompt, response, row)
        except Exception as e:
            return self._failed(type(e).__name__, f"raised {type(e).__name__}: {e}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:  # numpy / torch scalars are fine; a string or None is not
                value = float(value.item() if hasattr(value, "item") else value)  # type: ignore[union-attr]
            except (TypeError, ValueError, AttributeError):
                return self._failed("not a number", f"returned {type(value).__name__} {value!r:.60}, not a float")
        value = float(value)
        if not math.isfinite(value):
            return self._failed("non-finite", f"returned {value}")
        return value

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def _failed(self, kind: str, what: str) -> float:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if self.errors[kind] == 1:
            log.warning(
                "reward %s %s; scored 0.0 (counted as reward_errors[%r]; logged once per kind)", self.path, what, kind
            )
        return 0.0
