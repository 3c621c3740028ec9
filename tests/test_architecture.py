"""The house rules of issue 37, checked: one installed namespace, the simulator runs the live
Coordinator (no copy of its decisions in rlboost/simulator/), no production module over 700 lines."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "rlboost"
# what a coordinator decides with: called from rlboost/rollout/coordinator.py, nowhere else outside
# the policies themselves (a second caller would be a second copy of a decision's glue)
DECISIONS = {
    "offload_tick",
    "step_progress",
    "plan_dispatch",
    "plan_migrations",
    "worth_a_look",
    "may_gain",
    "from_marks",  # StepOutcome.from_marks: a step's outcome from the coordinator's marks
}
MAX_LINES = 700


def calls(path: Path) -> set[str]:
    """Names of the functions and methods a module calls."""
    out = set()
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(n, ast.Call):
            f = n.func
            out.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return out


def test_every_decision_is_called_from_the_coordinator_alone() -> None:
    policies = PKG / "rollout" / "policies"
    callers = {
        str(f.relative_to(ROOT)): sorted(calls(f) & DECISIONS)
        for f in PKG.rglob("*.py")
        if policies not in f.parents and calls(f) & DECISIONS
    }
    assert callers == {"rlboost/rollout/coordinator.py": sorted(DECISIONS)}, callers


def test_the_simulator_runs_the_live_coordinator() -> None:
    from rlboost.contracts.spec import parse_spec
    from rlboost.providers.pricing import spot_offers, trainer_offer
    from rlboost.rollout.coordinator import Coordinator
    from rlboost.rollout.live import LiveCoordinator
    from rlboost.simulator import PRESETS
    from rlboost.simulator.core import Simulation
    from tests.test_simulator import TRACE, job

    spec = parse_spec(job(algorithm={"steps": 2}))
    sim = Simulation(spec, TRACE, PRESETS["rlboost"], trainer_offer(spec, None), spot_offers(spec, None))
    assert type(sim.coordinator) is Coordinator and issubclass(LiveCoordinator, Coordinator)
    assert sim.run().steps == 2
    classes = [n.name for f in (PKG / "simulator").rglob("*.py") for n in ast.walk(ast.parse(f.read_text()))
               if isinstance(n, ast.ClassDef)]  # fmt: skip
    assert not [c for c in classes if "Coordinator" in c], classes


def test_no_production_module_is_over_700_lines() -> None:
    long = {
        str(f.relative_to(ROOT)): n for f in PKG.rglob("*.py") if (n := len(f.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these (a module reads in one sitting): {long}"


@pytest.mark.integration
def test_the_wheel_installs_one_package(tmp_path: Path) -> None:
    """`pip wheel --no-deps .` holds rlboost/ and its dist-info, nothing else at the top."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("rlboost-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"rlboost"}, tops
    assert "rlboost/templates/node_boot.sh" in zipfile.ZipFile(wheel).namelist()  # package data comes along
