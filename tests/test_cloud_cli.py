"""Real-cloud job files through the real CLI, offline: the --dryrun plan, and every kind of bad input
(missing credentials, an accelerator no cloud offers, a price cap below every offer, a budget already
spent, a cloud the provider cannot use) refused with one clear message before anything is launched."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import tests.sky_fake  # noqa: F401  (SKYPILOT_DISABLE_LOCAL_API_SERVER, SKY_RUNTIME_DIR with the catalogs)
from rlboost.cli.state import StateStore
from rlboost.providers.base import InstanceKind, InstanceState, LaunchRequest, Owner, Role
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "aws-gcp.yaml"
CLOUD_VARS = ("AWS_", "GOOGLE_", "CLOUDSDK_", "GCLOUD_")


def clean_env(home: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """No cloud credentials in sight (a fake HOME), plus `env`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(CLOUD_VARS)}
    fake_home = home.parent / "user-home"
    fake_home.mkdir(exist_ok=True)
    return {**base, "HOME": str(fake_home), "RLBOOST_HOME": str(home), "COLUMNS": "200", **(env or {})}


def cli_process(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it (a process of its own)."""
    return subprocess.run(
        [sys.executable, "-m", "rlboost.cli.main", *args],
        env=clean_env(home, env),
        capture_output=True,
        text=True,
        timeout=120,
    )


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, home: Path, env: dict[str, str] | None = None) -> Result:
    """The same CLI in this process (SkyPilot's catalog is loaded once, not per call)."""
    from typer.testing import CliRunner

    from rlboost.cli.main import app

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(clean_env(home, env))
    try:
        r = CliRunner().invoke(app, list(args), catch_exceptions=False)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return Result(r.exit_code, r.stdout, r.stderr)


def creds(tmp: Path) -> dict[str, str]:
    """Credentials that exist as files/variables (never used: nothing is launched in these tests)."""
    adc = tmp / "adc.json"
    adc.write_text('{"type": "authorized_user", "client_id": "x", "client_secret": "y", "refresh_token": "z"}')
    return {
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "example",
        "GOOGLE_APPLICATION_CREDENTIALS": str(adc),
        "GOOGLE_CLOUD_PROJECT": "example-project",
    }


def job_count(home: Path) -> int:
    db = home / "state.db"
    return sqlite3.connect(db).execute("SELECT COUNT(*) FROM jobs").fetchone()[0] if db.exists() else 0


def variant(tmp: Path, **changes) -> Path:
    job = yaml.safe_load(EXAMPLE.read_text())
    for dotted, value in changes.items():
        node = job
        *path, last = dotted.split("__")
        for k in path:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[int(last) if isinstance(node, list) else last] = value
    p = tmp / "job.yaml"
    p.write_text(yaml.safe_dump(job))
    return p


def test_dryrun_prints_the_plan_with_skypilot_catalog_prices(home):
    out = cli_process("launch", str(EXAMPLE), "--dryrun", home=home)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "plan for job aws-gcp-demo (provider skypilot; nothing launched)" in text
    assert "trainer: 1 × A100:8 on aws/us-east-1 (on-demand): $32.773/h per node" in text  # p4d.24xlarge
    # the candidates table: one row per candidate, cells separated by spaces (200 columns: nothing folds)
    cells = [ln.split() for ln in text.splitlines() if ln.split()[:1] in (["aws"], ["gcp"])]
    order = [(c[0], c[1], c[4]) for c in cells]  # cloud, region, accelerator (zone, instance between)
    assert order[0] == ("aws", "us-east-2", "V100")  # cheapest $/token: 0.3635 / 0.4
    assert ("gcp", "us-central1", "A100") in order
    assert "prices for aws: SkyPilot catalog" in text and "prices for gcp: SkyPilot catalog" in text
    assert "credentials for aws: missing" in text  # reported, not fatal, in a dry run
    assert job_count(home) == 0


def test_dryrun_without_skypilots_catalog_uses_the_bundled_snapshot(home, tmp_path):
    empty = {"SKY_RUNTIME_DIR": str(tmp_path / "empty")}  # read when sky is imported: a process of its own
    out = cli_process("launch", str(EXAMPLE), "--dryrun", home=home, env=empty)
    assert out.returncode == 0, out.stderr
    assert "prices for aws: bundled snapshot" in out.stdout and "$32.773/h" in out.stdout


def test_missing_credentials_refuse_before_anything(home):
    out = cli("launch", str(EXAMPLE), home=home)
    assert out.returncode == 2
    assert "credentials: none found for aws; run `aws configure`" in out.stderr
    assert "credentials: none found for gcp" in out.stderr
    assert "Traceback" not in out.stderr and job_count(home) == 0


@pytest.mark.parametrize(
    "changes, needle",
    [
        (
            {"rollout__candidates": [{"accelerator": "T4", "clouds": ["aws", "gcp"]}]},
            "rollout.candidates[0].accelerator: the aws price catalog has no 'T4' (it has: A100,",
        ),
        ({"trainer__accelerators": "H100:3"}, "trainer.accelerators: aws sells H100 in counts of 8, not 3"),
        ({"rollout__max_hourly_price": 0.05}, "rollout.max_hourly_price $0.050/h is below every spot offer"),
        ({"trainer__cloud": "local"}, "trainer.cloud: 'local' is not a cloud of provider 'skypilot'"),
        ({"provider": "aws"}, "rollout.candidates[0].clouds: 'gcp' is not a cloud of provider 'aws'"),
        ({"provider": "gcp", "trainer__cloud": "gcp", "trainer__region": None}, "trainer.region: provider 'gcp'"),
    ],
)
def test_bad_input_is_one_clear_message_and_launches_nothing(home, tmp_path, changes, needle):
    out = cli("launch", str(variant(tmp_path, **changes)), home=home, env=creds(tmp_path))
    assert out.returncode == 2, out.stdout + out.stderr
    assert needle in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and job_count(home) == 0


def test_a_budget_already_spent_refuses_before_anything(home, tmp_path):
    store = StateStore(home / "state.db")
    jid = store.create_job("aws-gcp-demo", "name: aws-gcp-demo\n", "skypilot")
    store.record_launch(
        jid,
        LaunchRequest(
            "aws-gcp-demo-1-trainer",
            Owner("aws-gcp-demo", 1),
            Role.TRAINER,
            InstanceKind.ON_DEMAND,
            "aws",
            "us-east-1",
            "A100:8",
            32.7726,
        ),
        "skypilot",
        32.7726,
    )
    store.update_instance("aws-gcp-demo-1-trainer", InstanceState.RUNNING, 0.0)
    store.update_instance("aws-gcp-demo-1-trainer", InstanceState.TERMINATED, 13 * 3600.0)  # $426
    store.update_job(jid, status="stopped")
    store.close()
    out = cli("launch", str(EXAMPLE), home=home, env=creds(tmp_path))
    assert out.returncode == 2
    assert "budget_usd: $400.00 is already spent" in out.stderr and "rlboost cost-report aws-gcp-demo" in out.stderr
    assert job_count(home) == 1
    plan = cli("launch", str(EXAMPLE), "--dryrun", home=home)
    assert "budget cap: $400.00 ($426.04 spent by earlier runs)" in plan.stdout


def test_gc_with_nothing_to_do(home):
    out = cli("gc", home=home)
    assert out.returncode == 0 and "no orphans" in out.stdout
