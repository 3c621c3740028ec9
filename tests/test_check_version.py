"""`rlboost --version` and `rlboost check` (issue 16): the real CLI, credentials from the environment only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

_CLOUD_ENV = ("AWS_", "GOOGLE_", "CLOUDSDK_", "GCLOUD_")


def _cli(*args: str, tmp: Path, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CLOUD_ENV)}
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    env |= {"HOME": str(home), "RLBOOST_HOME": str(tmp / "rlboost"), "COLUMNS": "200", **(extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "rlboost.cli.main", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_version_prints_the_package_version(tmp_path):
    out = _cli("--version", tmp=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"rlboost {version('rlboost')}"


def test_check_reports_every_provider_and_exits_0(tmp_path):
    out = _cli("check", "--json", tmp=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {r["provider"]: r for r in json.loads(out.stdout)}
    assert list(rows) == ["local", "skypilot", "aws", "gcp"]
    assert rows["local"]["ready"] and rows["local"]["credentials"] == {}
    assert rows["aws"]["credentials"] == {"aws": None} and not rows["aws"]["ready"]
    assert any("aws configure" in p for p in rows["aws"]["problems"])  # the fix, its cloud record's credential_hint
    assert rows["skypilot"]["unchecked_clouds"] == ["azure", "lambda", "runpod"]


def test_check_finds_credentials_in_the_environment(tmp_path):
    keys = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "example"}
    out = _cli("check", "--json", tmp=tmp_path, extra=keys)
    assert out.returncode == 0, out.stderr
    rows = {r["provider"]: r for r in json.loads(out.stdout)}
    assert rows["aws"]["credentials"]["aws"] == "environment (AWS_ACCESS_KEY_ID)"
    assert rows["aws"]["ready"] == rows["aws"]["libraries"]["boto3"]
    assert rows["skypilot"]["ready"] == rows["skypilot"]["libraries"]["sky"]  # one cloud is enough

    table = _cli("check", tmp=tmp_path)
    assert table.returncode == 0 and "provider" in table.stdout and "gcloud auth" in table.stdout


def test_check_prints_each_fix_whole_at_80_columns(tmp_path):
    """A fix is a command or a variable name to copy: under the table, wrapped between words (never
    inside one), once for every provider it readies."""
    out = _cli("check", tmp=tmp_path, extra={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    fixes = " ".join(line.strip() for line in lines[lines.index("to fix:") + 1 :])
    gcloud = "run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS)"
    assert f"{gcloud} (for skypilot, gcp)" in fixes
    assert fixes.count("aws: no credentials; run `aws configure`") == 1
