"""simulator/parallel.py: replays in parallel processes hand back their results in the order asked, their
progress on the caller's thread, and a replay's failure to the caller."""

from __future__ import annotations

import os
import threading
from functools import partial

import pytest

from rlboost.simulator.parallel import run_all


def _square(n: int, report) -> tuple[int, int]:
    for i in range(1, 4):
        report(i / 4)
    return n * n, os.getpid()


def _fails(report) -> int:
    report(0.5)
    raise ValueError("replay 1 broke")


@pytest.mark.parametrize("jobs", [1, 2])
def test_results_in_order_progress_on_the_callers_thread(jobs):
    seen: dict[int, list[float]] = {}
    threads = set()

    def progress(k: int, f: float) -> None:
        threads.add(threading.get_ident())
        seen.setdefault(k, []).append(f)

    out = run_all([partial(_square, n) for n in range(5)], jobs=jobs, on_progress=progress)
    assert [r for r, _ in out] == [0, 1, 4, 9, 16]
    assert seen == {k: [0.25, 0.5, 0.75] for k in range(5)} and threads == {threading.get_ident()}
    pids = {pid for _, pid in out}
    assert (pids == {os.getpid()}) if jobs == 1 else (os.getpid() not in pids)


def test_a_failed_replay_reaches_the_caller():
    with pytest.raises(ValueError, match="replay 1 broke"):
        run_all([partial(_square, 2), _fails, partial(_square, 3)], jobs=2)
