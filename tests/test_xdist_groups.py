"""The heavy tiers' `--dist loadgroup` (.ci/run) must keep an xdist_group on one worker, or a module's
whole-job fixture is built once per worker: pytest 9.2 ignores the `item._nodeid` suffix that
pytest-xdist 3.8 groups by, and the heavy tiers then ran each whole-job fixture three times, silently."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

GROUPED = '''
import os, pytest
pytestmark = pytest.mark.xdist_group("{name}")

@pytest.fixture(scope="module")
def built():
    with open(os.environ["BUILDS"], "a") as f:
        f.write("{name}\\n")

'''


def test_an_xdist_group_builds_its_module_fixture_once(tmp_path: Path) -> None:
    for name in ("a", "b"):
        tests = "".join(f"def test_{name}{i}(built):\n    pass\n\n" for i in range(6))
        (tmp_path / f"test_{name}.py").write_text(GROUPED.format(name=name) + tests)
    (tmp_path / "test_free.py").write_text("".join(f"def test_free{i}():\n    pass\n\n" for i in range(6)))
    builds = tmp_path / "builds.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup",
         "-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=120, env={"BUILDS": str(builds), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert sorted(builds.read_text().split()) == ["a", "b"], "an xdist_group ran on several workers"
