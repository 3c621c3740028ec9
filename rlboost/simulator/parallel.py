"""Several replays at once: in parallel processes, each telling the caller how far it has got.

A replay is a task: a picklable callable taking a `report(fraction)` function (Simulation.run's
`on_progress`). Workers send (task, fraction) on a queue they inherit at start-up; the caller's process
hands them to `on_progress` on its own thread (a rich progress bar is not thread-safe). Replays share
nothing, so the results are the same as one after another.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, TypeVar

R = TypeVar("R")
Report = Callable[[float], None]
Task = Callable[[Report], R]

_progress: Any = None  # a worker's queue to the caller (set by _start)


def _start(q: Any) -> None:
    global _progress
    _progress = q


def _run(key: int, task: Task[R]) -> R:
    try:
        return task(lambda fraction: _progress.put((key, fraction)))
    finally:
        _progress.put((key, None))  # behind its last report: the caller waits for this, not the result


def run_all(
    tasks: list[Task[R]],
    *,
    jobs: int | None = None,
    on_progress: Callable[[int, float], None] | None = None,
) -> list[R]:
    """Every task's result, in the order given. `jobs` processes at most (default: the CPU count); one
    runs them here, one after another. The caller orders the tasks (the longest first keeps every process
    busy to the end)."""
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks)))
    results: dict[int, R] = {}
    if jobs == 1:
        for key, task in enumerate(tasks):
            results[key] = task((lambda f, k=key: on_progress(k, f)) if on_progress else _ignore)
        return [results[k] for k in range(len(tasks))]
    q = multiprocessing.get_context().Queue()
    with ProcessPoolExecutor(max_workers=jobs, initializer=_start, initargs=(q,)) as pool:
        pending: dict[Future[R], int] = {pool.submit(_run, key, task): key for key, task in enumerate(tasks)}
        reporting = set(range(len(tasks)))  # a result can arrive before its replay's last reports
        try:
            while pending or reporting:
                finished, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(q, on_progress, reporting, block=not pending)
                for f in finished:
                    results[pending.pop(f)] = f.result()
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)  # a failed replay: start no other
            raise
    return [results[k] for k in range(len(tasks))]


def _drain(q: Any, on_progress: Callable[[int, float], None] | None, reporting: set[int], block: bool) -> None:
    """Hand on every report queued; a task's None says it will send no more."""
    while True:
        try:
            key, fraction = q.get(timeout=0.2) if block else q.get_nowait()
        except queue.Empty:
            return
        block = False
        if fraction is None:
            reporting.discard(key)
        elif on_progress:
            on_progress(key, fraction)


def _ignore(_: float) -> None:
    pass
