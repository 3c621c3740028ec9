from __future__ import annotations

import atexit
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

from tests.longest_first import (  # noqa: F401  hooks: xdist hands out the longest work first
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_runtest_logreport,
    store_durations,
)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

# pytest-xdist's workers start with COLUMNS=80 LINES=24 in their environment, and a rich Console built
# while COLUMNS is set keeps that width for good (rlboost.cli.output's is built at import): in-process
# CLI tests that set COLUMNS then read 80-column output. Each test sets the width it reads.
for _var in ("COLUMNS", "LINES"):
    os.environ.pop(_var, None)


def _one_ami_for_moto() -> None:
    """moto loads every public AMI it knows into each region's EC2 backend at its first call, 2-3 s of
    CPU for each mock_aws a test opens; the tests need one image to launch from. MOTO_AMIS_PATH (read
    when moto.ec2 is imported: before any test module) names a list of one, the first of moto's own."""
    if "MOTO_AMIS_PATH" in os.environ or importlib.util.find_spec("moto") is None:
        return
    from moto.utilities.utils import load_resource

    first = load_resource("ec2/resources/amis.json")[:1]
    where = tempfile.mkdtemp(prefix="rlboost-moto-")
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    path = Path(where) / "amis.json"
    path.write_text(json.dumps(first))
    os.environ["MOTO_AMIS_PATH"] = str(path)


_one_ami_for_moto()


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An isolated RLBOOST_HOME for this test."""
    h = tmp_path / "rlboost-home"
    monkeypatch.setenv("RLBOOST_HOME", str(h))
    return h


def run_cli(
    *args: str, home: Path, timeout: float = 300, check: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would (`env`: more variables in its environment)."""
    env = {**os.environ, **(env or {}), "RLBOOST_HOME": str(home), "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "rlboost.cli.main", *args],
        env=env,
        stdin=subprocess.DEVNULL,  # never a terminal: a command that would ask refuses instead of waiting
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"rlboost {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_json(*args: str, home: Path) -> dict:
    return json.loads(run_cli(*args, "--json", home=home, check=True).stdout)


def built_once_per_run(tmp_path_factory, worker_id: str, name: str, build: Callable[[Path], None]) -> Path:
    """A directory `build` fills once per test run, whichever xdist worker asks first; the others wait on
    its lock and reuse it. For a deterministic artefact several workers need (a fault-free reference job):
    a module fixture is built once per worker that runs one of its module's tests, and --dist loadgroup
    hands one file's tests to several."""
    base = tmp_path_factory.getbasetemp()
    root = base if worker_id == "master" else base.parent  # under xdist: the run's pytest-N, shared
    where, done = root / f"once-{name}", root / f"once-{name}.done"
    with FileLock(str(root / f"once-{name}.lock")):
        if not done.exists():
            shutil.rmtree(where, ignore_errors=True)  # a build that failed part-way starts over
            where.mkdir()
            build(where)
            done.touch()
    return where


# This session's temp root: every process a test starts has it in its environment (RLBOOST_HOME,
# RLBOOST_RUN_DIR), so process lookups never reach another pytest run's jobs on the same machine.
_SESSION_ROOT: list[bytes] = []


def pytest_sessionstart(session) -> None:
    _SESSION_ROOT[:] = [str(session.config._tmp_path_factory.getbasetemp()).encode()]


def rlboost_pids(marker: str, exact: bool = False) -> list[int]:
    """Live processes of this pytest session whose environment names an instance of this test's jobs
    (`exact`: one of its variables is `marker`, not merely contains it: `x-trainer` must not match
    `x-trainer-r1`)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes()
            stat = (p / "stat").read_text().split()
        except OSError:
            continue
        found = marker.encode() in env.split(b"\0") if exact else marker.encode() in env
        if stat[2] != "Z" and found and all(root in env for root in _SESSION_ROOT):
            out.append(int(p.name))
    return out


# Under pytest-xdist the fault tests run in worker processes: each hands its FAULTS records to the
# controlling process when it finishes (workeroutput), which prints one table for the whole run.
_WORKER_FAULTS: list[dict] = []


def pytest_sessionfinish(session) -> None:
    store_durations(session)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        from dataclasses import asdict

        from tests.chaos import FAULTS

        workeroutput["faults"] = json.dumps([asdict(f) for f in FAULTS])


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent with -p no:xdist
def pytest_testnodedown(node, error) -> None:
    _WORKER_FAULTS.extend(json.loads(getattr(node, "workeroutput", {}).get("faults", "[]")))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """The fault-injection suite's summary table (tests/chaos.py FAULTS), when any fault test ran."""
    from tests.chaos import FAULTS, FaultRecord

    # this process's own records (a run without xdist) and the workers' (an xdist run)
    records = [*FAULTS, *(FaultRecord(**f) for f in _WORKER_FAULTS)]
    if not records:
        return
    tr = terminalreporter
    tr.section("fault injection summary")
    head = f"{'fault':<58} {'injected':>8} {'recovered':>9} {'data lost':>9} {'longest recovery':>16}"
    tr.write_line(head)
    tr.write_line("-" * len(head))
    for f in records:
        rec = f"{f.longest_recovery_s:.1f}s" if f.longest_recovery_s is not None else "-"
        tr.write_line(f"{f.fault:<58} {f.injected:>8} {f.recovered:>9} {f.lost:>9} {rec:>16}")
