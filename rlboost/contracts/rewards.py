"""Custom rewards: `task.reward: mypkg.rewards:score`, a Python function in one of three styles
(`task.reward_style`, or detected from its parameter names, `detect_style`):

- rlboost: `score(prompt: str, response: str, row: dict) -> float`, per response;
- verl: `compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | {"score": ...}`
  (veRL's gsm8k `compute_score(solution_str, ground_truth, ...)` too: called by keyword), per response;
- trl: `reward(prompts: list[str], completions: list[str], **columns) -> list[float]`, once per group.

The job file is checked with `import_reward` and `detect_style` when it is loaded (on the launching
machine and again on the trainer node), so a bad path or a signature of no known style stops the job
before anything launches. At run time a reward that raises, or returns something other than a finite
number, must not kill a job hours in for one bad row, nor go unnoticed: that response gets reward 0.0,
the failure is counted per kind (the exception's class name, `non-finite`, `not a number`, `wrong
length`) and logged, redacted of the job's secrets, with its first example once per kind. A step in
which most calls fail (over task.reward_error_budget), or a first step in which all do, stops the job
(`CustomReward.end_step`): a reward written for another trainer must not train on zeros.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import math
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any, Literal

from rlboost.contracts.redact import redact

log = logging.getLogger("rlboost.trainer")

RewardFn = Callable[..., Any]
RewardStyle = Literal["auto", "rlboost", "verl", "trl"]

SIGNATURES = (
    "rlboost: score(prompt, response, row) -> float",
    "verl: compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float or "
    "{'score': float} (or veRL's gsm8k compute_score(solution_str, ground_truth, ...))",
    "trl: reward(prompts, completions, **kwargs) -> list[float] (batched; dataset columns as kwargs)",
)
_VERL_NAMES = frozenset({"data_source", "solution_str", "ground_truth", "extra_info"})
_TRL_NAMES = frozenset({"prompts", "completions"})
_RLBOOST_NAMES = ("prompt", "response", "row")

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


class RewardStyleError(ValueError):
    """The function's signature fits no style (or several): names task.reward and the accepted ones."""


def _params(fn: Any) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # some builtins and C callables have no signature
        return None


def detect_style(fn: Any, declared: str = "auto", path: str = "") -> str:
    """The style `fn` is called in: `declared` unless auto, else from its parameter names. veRL: has
    solution_str or data_source; TRL: has completions or prompts; rlboost: named (prompt, response, row),
    or three required positional parameters none of which is a veRL or TRL name."""
    if declared != "auto":
        return declared
    params = _params(fn)
    names = {p.name for p in params or ()}
    verl, trl = bool(names & {"solution_str", "data_source"}), bool(names & _TRL_NAMES)
    positional = [p for p in params or () if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    plain = (
        tuple(p.name for p in positional[:3]) == _RLBOOST_NAMES
        or (len(required) == 3 and not names & (_VERL_NAMES | _TRL_NAMES))
    )
    found = [s for s, hit in (("rlboost", plain), ("verl", verl), ("trl", trl)) if hit]
    if len(found) == 1:
        return found[0]
    if params is None:
        why = "its signature cannot be read"
    elif found:
        why = f"its parameters ({', '.join(p.name for p in params)}) fit both {' and '.join(found)}"
    else:
        why = f"its parameters ({', '.join(p.name for p in params)}) fit no reward style"
    # one line each: job-file errors are clipped line by line (rlboost/contracts/spec_hints.py)
    raise RewardStyleError(
        f"task.reward {path or getattr(fn, '__name__', fn)}: {why}; rename the parameters to one of these "
        "signatures, or set task.reward_style: rlboost | verl | trl\n" + "\n".join(f"  {s}" for s in SIGNATURES)
    )


def ground_truth(row: dict) -> Any:
    """veRL's ground_truth: the row's answer, ground_truth, or reward_model.ground_truth (veRL's parquet)."""
    for key in ("ground_truth", "answer"):
        if row.get(key) is not None:
            return row[key]
    nested = row.get("reward_model")
    if isinstance(nested, dict) and nested.get("ground_truth") is not None:
        return nested["ground_truth"]
    return None


class RewardFailure(Exception):
    """One call's failure: its kind (counted) and what happened (logged, redacted)."""

    def __init__(self, kind: str, what: str) -> None:
        super().__init__(what)
        self.kind, self.what = kind, what


class RewardBudgetExceeded(RuntimeError):
    """Too many of a step's reward calls failed: the job stops (rlboost/trainer/runtime.py)."""


def _number(value: Any) -> float:
    """A reward value as a finite float, or RewardFailure."""
    if isinstance(value, dict) and "score" in value:  # veRL scorers may return {"score": ..., ...}
        value = value["score"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:  # numpy / torch scalars are fine; a string or None is not
            value = float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError, AttributeError):
            raise RewardFailure("not a number", f"returned {type(value).__name__} {value!r:.60}, not a float") from None
    value = float(value)
    if not math.isfinite(value):
        raise RewardFailure("non-finite", f"returned {value}")
    return value


class CustomReward:
    """Calls the user's reward safely: a failure scores 0.0, is counted, and is logged once per kind
    (its text redacted of `secrets`). `end_step` checks the step's share of failures against the budget."""

    def __init__(
        self, path: str, style: str = "auto", secrets: Iterable[str] = (), data_source: str = "", budget: float = 0.5
    ) -> None:
        self.path = path
        self.fn = import_reward(path)
        self.style = detect_style(self.fn, style, path)
        self.secrets = list(secrets)
        self.data_source = data_source  # veRL's data_source for rows without one: the task's name or path
        self.budget = budget
        params = _params(self.fn)
        self._names = {p.name for p in params} if params is not None else None
        self._any_kw = params is None or any(p.kind is p.VAR_KEYWORD for p in params)
        self.errors: dict[str, int] = {}  # kind -> count, for the whole job (this trainer process)
        # the calls since the last end_step, and the first failure among them (a step's evaluations included)
        self._lock = threading.Lock()
        self.window_calls = self.window_errors = 0
        self.window_first: str | None = None
        self.steps_checked = 0

    def __call__(self, prompt: str, response: str, row: dict) -> float:
        return self.batch([prompt], [response], [row])[0]

    def batch(self, prompts: list[str], responses: list[str], rows: list[dict]) -> list[float]:
        """The rewards of responses (one TRL call for them all; one call each in the other styles)."""
        if self.style == "trl":
            try:
                values = self._trl_values(prompts, responses, rows)
            except RewardFailure as f:
                return [self._failed(f) for _ in responses]
            except Exception as e:
                f = RewardFailure(type(e).__name__, f"raised {type(e).__name__}: {e}")
                return [self._failed(f) for _ in responses]
            return [self._scored(lambda v=v: v) for v in values]
        triples = zip(prompts, responses, rows, strict=True)
        return [self._scored(lambda p=p, r=r, row=row: self._call_one(p, r, row)) for p, r, row in triples]

    def strict(self, prompt: str, response: str, row: dict) -> float:
        """One call as the trainer makes it, but a failure raises RewardFailure (its text redacted) instead of
        scoring 0.0 (`launch --dryrun`); nothing is counted."""
        try:
            if self.style == "trl":
                return _number(self._trl_values([prompt], [response], [row])[0])
            return _number(self._call_one(prompt, response, row))
        except RewardFailure as f:
            raise RewardFailure(f.kind, redact(f.what, self.secrets)) from None
        except Exception as e:
            raise RewardFailure(type(e).__name__, redact(f"raised {type(e).__name__}: {e}", self.secrets)) from None

    def _kwargs(self, candidates: dict[str, Any]) -> dict[str, Any]:
        if self._any_kw or self._names is None:
            return candidates
        return {k: v for k, v in candidates.items() if k in self._names}

    def _call_one(self, prompt: str, response: str, row: dict) -> Any:
        if self.style == "rlboost":
            return self.fn(prompt, response, row)
        args = {
            "data_source": row.get("data_source") or self.data_source,
            "solution_str": response,
            "ground_truth": ground_truth(row),
            "extra_info": row,
        }
        # veRL's names: by keyword, those present (gsm8k's has no data_source)
        if self._names is not None and "solution_str" in self._names:
            return self.fn(**self._kwargs(args))
        return self.fn(*args.values())  # declared verl with other names: veRL's positional order

    def _trl_values(self, prompts: list[str], responses: list[str], rows: list[dict]) -> list[Any]:
        """One TRL call's values, one per response, or RewardFailure("wrong length")."""
        values = self._call_trl(prompts, responses, rows)
        if not isinstance(values, (list, tuple)) and hasattr(values, "tolist"):  # a numpy array, a tensor
            values = values.tolist()
        if not isinstance(values, (list, tuple)):
            what = f"returned {type(values).__name__} {values!r:.60}, not a list (one value per completion)"
            raise RewardFailure("wrong length", what)
        if len(values) != len(responses):
            raise RewardFailure("wrong length", f"returned {len(values)} values for {len(responses)} completions")
        return list(values)

    def _call_trl(self, prompts: list[str], responses: list[str], rows: list[dict]) -> Any:
        # as TRL: every other dataset column as a keyword, a list aligned with the prompts
        columns = [k for k in dict.fromkeys(k for row in rows for k in row) if k not in ("prompt", "completion")]
        kwargs = {k: [row.get(k) for row in rows] for k in columns if k not in _TRL_NAMES}
        return self.fn(**self._kwargs({"prompts": list(prompts), "completions": list(responses), **kwargs}))

    def _scored(self, call: Callable[[], Any]) -> float:
        try:
            value = _number(call())
        except RewardFailure as f:
            return self._failed(f)
        except Exception as e:
            return self._failed(RewardFailure(type(e).__name__, f"raised {type(e).__name__}: {e}"))
        with self._lock:
            self.window_calls += 1
        return value

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def _failed(self, f: RewardFailure) -> float:
        what = redact(f.what, self.secrets)
        with self._lock:
            self.errors[f.kind] = self.errors.get(f.kind, 0) + 1
            first_of_kind = self.errors[f.kind] == 1
            self.window_calls += 1
            self.window_errors += 1
            if self.window_first is None:
                self.window_first = what
        if first_of_kind:
            log.warning(
                "reward %s %s; scored 0.0 (counted as reward_errors[%r]; logged once per kind)", self.path, what, f.kind
            )
        return 0.0

    def end_step(self, step: int) -> None:
        """After step `step` (counted from 1) was scored: RewardBudgetExceeded when more than `budget` of
        the calls since the last check failed, or all of them in the first step this process checks
        (a reward that never works). Starts the next window either way."""
        with self._lock:
            calls, errors, first = self.window_calls, self.window_errors, self.window_first
            self.window_calls = self.window_errors = 0
            self.window_first = None
            self.steps_checked += 1
            first_step = self.steps_checked == 1
        if not calls or not errors:
            return
        if errors / calls > self.budget or (first_step and errors == calls):
            raise RewardBudgetExceeded(
                f"task.reward failed on {errors} of {calls} responses in step {step} ({self.path} {first}); "
                f"the job stops rather than train on 0.0 rewards: fix the function (`rlboost launch --dryrun` "
                f"calls it on a few rows), check task.reward_style ({self.style}), or raise "
                f"task.reward_error_budget (now {self.budget:g})"
            )
