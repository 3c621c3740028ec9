"""The traces and prices the simulate examples use ship inside the package (issue 16): a wheel built from
this tree, installed on its own, simulates every example from a directory with no shared data next to it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlboost.contracts.bundled_data import bundled_names, bundled_path
from rlboost.contracts.spec import SpecError, load_spec
from rlboost.providers.catalog import load_catalog
from rlboost.providers.spot_market import TraceError, load_trace

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
SIM_EXAMPLES = sorted((ROOT / "examples" / "simulate").glob("*.yaml"))
# every package the wheel ships (each with an __init__.py; the tests and benchmarks are not shipped)
PACKAGES = tuple(
    sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name not in ("tests", "benchmarks"))
)


def test_examples_name_only_bundled_data():
    """No example reaches outside the package for its trace or prices."""
    for path in SIM_EXAMPLES:
        local = load_spec(path).local
        for val in (local.trace, local.catalog):
            assert val is None or str(val).startswith("bundled:"), f"{path.name}: {val}"


def test_bundled_files_are_the_shared_originals():
    pairs = {
        "bundled:traces/p3-trace.csv": "traces/bamboo_nsdi23/p3-trace.csv",
        "bundled:traces/g4dn-trace.csv": "traces/bamboo_nsdi23/g4dn-trace.csv",
        "bundled:traces/gcloud-a100x1-east1b.txt": "traces/bamboo_nsdi23/gcloud/a100x1-east1b.txt",
        "bundled:traces/gcloud-v100x1-east1c.txt": "traces/bamboo_nsdi23/gcloud/v100x1-east1c.txt",
        "bundled:aws_vms.csv": "prices/skypilot_catalog_v7_aws_gpu_p_family.csv",
        "bundled:gcp_vms.csv": "prices/skypilot_catalog_v7_gcp_gpu_subset.csv",
    }
    assert sorted(pairs) == bundled_names()
    if not SHARED.is_dir():
        pytest.skip("the shared data folder is not next to this checkout")
    for name, orig in pairs.items():
        assert bundled_path(name).read_bytes() == (SHARED / orig).read_bytes(), name


def test_bundled_trace_and_catalog_load_by_name():
    tr = load_trace("bundled:traces/p3-trace.csv")
    assert tr.source == "bundled:traces/p3-trace.csv"  # shown as the user wrote it
    assert tr.max_count == 32 and 11 < tr.duration / 3600 < 12
    cat = load_catalog("bundled:gcp_vms.csv")
    assert cat.price("A100", 1, cloud="gcp", region="us-central1", spot=False) is not None
    with pytest.raises(TraceError, match=r"no bundled file bundled:traces/p4-trace.csv \(bundled: .*p3-trace.csv"):
        load_trace("bundled:traces/p4-trace.csv")
    with pytest.raises(TraceError, match="no bundled file"):
        load_trace("bundled:../spot_market.py")  # names stay inside the data folder


def test_unknown_bundled_name_is_blamed_on_its_field(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("name: xy\nrollout: {max_workers: 0}\nlocal: {catalog: 'bundled:azure_vms.csv'}\n")
    with pytest.raises(SpecError) as e:
        load_spec(job)
    msg = str(e.value)
    assert msg.startswith("local.catalog: no bundled file bundled:azure_vms.csv")
    assert "bundled:aws_vms.csv" in msg and "fix the name, or give a file path" in msg


def _install_wheel(tmp: Path) -> Path:
    """Build a wheel from a copy of this tree (the build writes next to its sources) and install it
    alone into a folder, as `pip install` would put it in site-packages."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", "--no-input"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "whl"), str(src)], check=True)
    (wheel,) = (tmp / "whl").glob("rlboost-*.whl")
    site = tmp / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)], check=True)
    return site


@pytest.mark.integration
def test_installed_package_simulates_every_example_from_anywhere(tmp_path):
    site = _install_wheel(tmp_path)
    assert (site / "rlboost" / "contracts" / "data" / "traces" / "SOURCES.md").is_file()
    assert (site / "rlboost" / "contracts" / "data" / "traces" / "LICENSE-bamboo").is_file()
    # the examples copied alone (with the task file paper-h100 names), run from an unrelated directory
    shutil.copytree(ROOT / "examples", tmp_path / "ex", ignore=shutil.ignore_patterns("*.md"))
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "RLBOOST_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    opts = ["--steps", "0", "--hours", "0.5", "--policy", "rlboost", "--json"]
    for path in SIM_EXAMPLES:
        job = tmp_path / "ex" / "simulate" / path.name
        proc = subprocess.run(
            [sys.executable, "-m", "rlboost.cli.main", "simulate", str(job), *opts],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, f"{path.name}: {proc.stdout}{proc.stderr}"
        doc = json.loads(proc.stdout)
        trace = load_spec(path).local.trace
        assert (str(trace) if trace else "builtin") in doc["title"], doc["title"]
        assert {r["policy"] for r in doc["results"]} >= {"on-demand", "rlboost"}


@pytest.mark.integration
def test_simulate_trace_and_catalog_options_take_bundled_names(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text((ROOT / "examples" / "simulate" / "aws-p3-v100.yaml").read_text())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RLBOOST_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    base = [sys.executable, "-m", "rlboost.cli.main", "simulate", str(job), "--steps", "0", "--hours", "0.5"]
    opts = ["--trace", "bundled:traces/g4dn-trace.csv", "--catalog", "bundled:aws_vms.csv", "--json"]
    proc = subprocess.run([*base, *opts], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "bundled:traces/g4dn-trace.csv (10.8 h trace)" in json.loads(proc.stdout)["title"]
    bad = ["--trace", "bundled:traces/nope.csv"]
    proc = subprocess.run([*base, *bad], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "no bundled file bundled:traces/nope.csv" in proc.stderr + proc.stdout
