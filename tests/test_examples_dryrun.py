"""Every shipped example dry-runs through the real CLI, without cloud credentials (issue 16), and a
catalog miss is blamed on the job-file field at fault."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlboost.contracts.spec import parse_spec
from rlboost.providers.pricing import PricingError, spot_offers, trainer_offer

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml")) + sorted((ROOT / "examples" / "simulate").glob("*.yaml"))
_CLOUD_ENV = ("AWS_", "GOOGLE_", "CLOUDSDK_", "GCLOUD_", "SKYPILOT_")


def _bare_env(tmp: Path) -> dict[str, str]:
    """No cloud credentials and no SkyPilot catalog: HOME and RLBOOST_HOME are empty folders."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CLOUD_ENV)}
    (tmp / "home").mkdir()
    return {**env, "HOME": str(tmp / "home"), "RLBOOST_HOME": str(tmp / "rlboost"), "COLUMNS": "200"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_example_dryruns(tmp_path, path):
    proc = subprocess.run(
        [sys.executable, "-m", "rlboost.cli.main", "launch", str(path), "--dryrun"],
        env=_bare_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "plan for job" in proc.stdout and "spot $/h" in proc.stdout and "on-demand $/h" in proc.stdout
    assert "objective" in proc.stdout  # the expected fleet
    assert not (tmp_path / "rlboost" / "state.db").exists()  # nothing recorded, nothing launched


def _cloud_job(trainer: dict, candidate: dict):
    from rlboost.providers.prices import CloudPrices

    spec = parse_spec(
        {
            "name": "miss",
            "provider": "aws",
            "model": {"kind": "synthetic"},
            "trainer": {"cloud": "aws", "region": "us-east-1", "accelerators": "A100:8", **trainer},
            "rollout": {"engine": "synthetic", "candidates": [{"clouds": ["aws"], **candidate}]},
        }
    )
    return spec, CloudPrices(use_skypilot=False)


@pytest.mark.parametrize(
    "trainer, candidate, needle",
    [
        ({"accelerators": "L40S:8"}, {"accelerator": "V100"}, "trainer.accelerators: the aws price catalog has no"),
        ({"region": "us-est-1"}, {"accelerator": "V100"}, "trainer.region: 'us-est-1' is not a region of aws"),
        ({}, {"accelerator": "L40S"}, "rollout.candidates[0].accelerator: the aws price catalog has no 'L40S'"),
        ({}, {"accelerator": "V100", "regions": ["us-east-1", "us-wst-2"]}, "did you mean us-west-2"),
    ],
)
def test_catalog_miss_names_the_field(trainer, candidate, needle):
    spec, prices = _cloud_job(trainer, candidate)
    with pytest.raises(PricingError) as e:
        trainer_offer(spec, prices)
        spot_offers(spec, prices)
    assert needle in str(e.value)
    if "accelerator" in needle:
        assert "(it has: A100," in str(e.value)  # lists what the catalog sells
