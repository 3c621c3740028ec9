"""Longest work first under pytest-xdist. xdist hands its work units (a file under `--dist loadfile`; a
test or an `xdist_group` under `--dist loadgroup`) to the workers in collection order, one at a time as
they free up, so a long unit collected last runs alone on one worker while the others sit idle: the
run's tail. Ordering the units by their recorded seconds, longest first (LPT scheduling), lets the short
ones fill in around the long ones. A unit's own tests keep their order (a module may rely on it), and a
run without xdist keeps the order as written.

The seconds are `tests/durations.json` (test id -> setup + call + teardown seconds), written by
`pytest --store-durations`, which merges a run's tests into the file (run each tier with it to refresh
that tier's figures); a test not in it counts `UNKNOWN_S`. Stale figures cost only speed, never an
outcome: nothing reads them but the order.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_S = 1.0  # a new test: about what most tests take

_seconds: dict[str, float] = {}  # this run's, for --store-durations (the controlling process)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--store-durations", action="store_true",
                     help=f"merge each test's seconds into {DURATIONS.name} (the order xdist hands tests out in)")


def base_id(nodeid: str) -> str:
    """The id without the `@group` suffix --dist loadgroup appends (after any `[params]`), so every tier
    reads one entry."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") and at > nodeid.rfind("::") else nodeid


def work_unit(item: pytest.Item, dist: str) -> str:
    """What xdist schedules `item` with (xdist's scheduler/loadfile.py, loadgroup.py _split_scope)."""
    if dist == "loadfile":
        return item.nodeid.split("::", 1)[0]
    mark = item.get_closest_marker("xdist_group") if dist == "loadgroup" else None
    if mark is not None:
        return "@" + (mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    return base_id(item.nodeid)


@pytest.hookimpl(trylast=True)  # after deselection by -m / -k: the units as they will run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    dist = config.getoption("dist", "no")
    # only an xdist worker's collection is what gets scheduled (every worker sorts it the same way)
    if not hasattr(config, "workerinput") or dist not in ("loadfile", "loadgroup", "load"):
        return
    try:
        known = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return
    total: dict[str, float] = {}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        unit = work_unit(item, dist)
        total[unit] = total.get(unit, 0.0) + known.get(base_id(item.nodeid), UNKNOWN_S)
        first.setdefault(unit, i)
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda it: (-total[work_unit(it, dist)], first[work_unit(it, dist)], order[id(it)]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.passed or report.skipped:
        key = base_id(report.nodeid)
        _seconds[key] = _seconds.get(key, 0.0) + report.duration


def store_durations(session: pytest.Session) -> None:
    """At the end of a --store-durations run: merge its seconds into DURATIONS."""
    config = session.config
    if hasattr(config, "workerinput") or not config.getoption("store_durations") or not _seconds:
        return  # the workers' reports reach the controlling process, which writes the file
    try:
        known = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        known = {}
    known.update({k: round(v, 2) for k, v in _seconds.items()})
    DURATIONS.write_text(json.dumps(dict(sorted(known.items())), indent=0) + "\n")
