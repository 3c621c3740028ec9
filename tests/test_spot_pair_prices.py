"""A spot offer's on-demand reference is the on-demand price of the same place as its spot price (the
catalog's cheapest spot zone, for a candidate with no regions), never the cheapest on-demand price of
another region; and a cloud that sells no spot offer for a candidate is named in `prices.skipped`
(for the plan) instead of vanishing. All offline, on the catalogs the project ships."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tests.sky_fake  # noqa: F401  (offline SkyPilot, SKY_RUNTIME_DIR with the shared catalogs)
from rlboost.contracts.spec import load_spec, parse_spec
from rlboost.providers.catalog import Offer as CatalogOffer
from rlboost.providers.prices import CloudPrices, bundled_catalog, sky_catalog_present
from rlboost.providers.pricing import PricingError, spot_offers

ROOT = Path(__file__).resolve().parents[1]
QWEN = ROOT / "examples" / "qwen-gsm8k.yaml"
# us-east4's GCP H100 (a3-highgpu-1g): the cheapest spot zone in the shipped catalog, and its own
# on-demand price; us-central1's 5.38327 is the cheapest on-demand anywhere
EAST4_SPOT, EAST4_OD, CENTRAL1_OD = 1.97614, 10.97906, 5.38327


def _h100(offers):
    [h100] = [o for o in offers if o.accelerator == "H100"]
    return h100


def _job(candidate: dict, **top):
    return parse_spec(
        {
            "name": "pair",
            "provider": "skypilot",
            "model": {"kind": "synthetic"},
            "trainer": {"cloud": "aws", "region": "us-east-1", "accelerators": "A100:8"},
            "rollout": {"engine": "synthetic", "candidates": [candidate]},
            **top,
        }
    )


@pytest.mark.parametrize("use_skypilot", [False, True], ids=["bundled", "skypilot-catalog"])
def test_any_region_candidate_is_measured_against_its_own_regions_on_demand(use_skypilot):
    if use_skypilot:
        assert sky_catalog_present("gcp")
    prices = CloudPrices(use_skypilot=use_skypilot)
    h100 = _h100(spot_offers(load_spec(QWEN), prices))
    assert h100.cloud == "gcp" and h100.region is None
    assert h100.hourly_price == pytest.approx(EAST4_SPOT)
    assert h100.on_demand_price == pytest.approx(EAST4_OD)  # not us-central1's CENTRAL1_OD


def _cheapest_spot_places(cloud: str, name: str, count: int) -> tuple[float, set[float | None]]:
    """An independent scan of the shipped catalog: the lowest spot price, and the on-demand prices of
    the rows (zones) that have it (their region's, where the row itself has none)."""
    rows: list[CatalogOffer] = bundled_catalog(cloud).all(cloud)
    same = [o for o in rows if o.accelerator == name and o.count == count]
    low = min(o.spot for o in same if o.spot is not None)
    ods: set[float | None] = set()
    for o in same:
        if o.spot == low:
            region_od = [r.on_demand for r in same if r.region == o.region and r.on_demand is not None]
            ods.add(o.on_demand if o.on_demand is not None else min(region_od, default=None))
    return low, ods


def _kinds(cloud: str) -> list[tuple[str, int]]:
    return sorted({(o.accelerator, o.count) for o in bundled_catalog(cloud).all(cloud) if o.spot is not None})


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_every_shipped_accelerator_pairs_spot_and_on_demand_of_one_zone(cloud):
    prices = CloudPrices(use_skypilot=False)
    crossed = []
    for name, count in _kinds(cloud):
        low, ods = _cheapest_spot_places(cloud, name, count)
        spot, od = prices.spot_pair(f"{name}:{count}", cloud, None)
        assert spot == pytest.approx(low), (name, count)
        assert od in ods, (name, count, od, ods)
        if prices(f"{name}:{count}", cloud, None, False) not in ods:
            crossed.append((name, count))
    assert crossed, "the shipped catalogs hold accelerators whose cheapest on-demand region is not the spot one"


def test_a_zone_sold_only_as_spot_takes_its_regions_on_demand_price():
    # AWS us-east-2: the cheapest H200:8 spot is a p5e.48xlarge, which the catalog sells there only as
    # spot; the region's on-demand H200:8 is the p5en.48xlarge at 84.8
    spot, od = CloudPrices(use_skypilot=False).spot_pair("H200:8", "aws", "us-east-2")
    assert spot == pytest.approx(14.4663)
    assert od == pytest.approx(84.8)


def test_a_named_region_keeps_its_prices():
    offers = spot_offers(
        _job({"accelerator": "V100", "clouds": ["aws"], "regions": ["us-east-2"]}), CloudPrices(use_skypilot=False)
    )
    assert [(o.hourly_price, o.on_demand_price) for o in offers] == [(pytest.approx(0.3635), pytest.approx(3.06))]


def test_a_live_spot_price_in_a_named_region_is_paired_with_that_regions_on_demand():
    class LiveSpot(CloudPrices):  # as providers.aws.AwsLivePrices: spot from elsewhere, on-demand catalog
        def __call__(self, accelerator, cloud, region, spot):
            return 0.25 if spot and region else super().__call__(accelerator, cloud, region, spot)

    offers = spot_offers(
        _job({"accelerator": "V100", "clouds": ["aws"], "regions": ["us-west-2"]}), LiveSpot(use_skypilot=False)
    )
    assert [(o.hourly_price, o.on_demand_price) for o in offers] == [(0.25, pytest.approx(3.06))]


def test_a_job_file_spot_price_is_measured_against_the_catalogs_spot_zone():
    offers = spot_offers(
        _job({"accelerator": "H100", "clouds": ["gcp"], "spot_price": 2.0}), CloudPrices(use_skypilot=False)
    )
    assert _h100(offers).hourly_price == 2.0
    assert _h100(offers).on_demand_price == pytest.approx(EAST4_OD)


def test_local_catalog_pairs_spot_and_on_demand_of_one_zone():
    spec = parse_spec(
        {
            "name": "pair",
            "local": {"catalog": "bundled:gcp_vms.csv"},
            "rollout": {"candidates": [{"accelerator": "H100", "clouds": ["local"]}]},
        }
    )
    h100 = _h100(spot_offers(spec))
    assert h100.hourly_price == pytest.approx(EAST4_SPOT)
    assert h100.on_demand_price == pytest.approx(EAST4_OD)


# ---- a cloud without an offer is named, not dropped silently ----------------------------------------
@pytest.mark.parametrize("use_skypilot", [False, True], ids=["bundled", "skypilot-catalog"])
def test_a_cloud_without_a_spot_offer_is_noted_for_the_plan(use_skypilot):
    prices = CloudPrices(use_skypilot=use_skypilot)
    offers = spot_offers(load_spec(QWEN), prices)
    assert {o.cloud for o in offers} == {"gcp"}
    assert prices.skipped == [
        "rollout.candidates[0]: aws: no H100:1 spot offer "
        "(aws sells H100 in counts of 8, not 1: 8 as p5.48xlarge); skipped"
    ]


def test_a_region_without_a_spot_offer_is_noted_too():
    prices = CloudPrices(use_skypilot=False)
    spec = _job({"accelerator": "H100", "clouds": ["gcp"], "regions": ["us-east4", "us-east1"]})
    assert [o.region for o in spot_offers(spec, prices)] == ["us-east4"]
    assert prices.skipped == [
        "rollout.candidates[0]: gcp/us-east1: no H100:1 spot offer "
        "(the price catalog lists no spot offer for it there); skipped"
    ]


def test_nothing_is_noted_when_every_cloud_prices_it_and_a_total_miss_stays_an_error():
    prices = CloudPrices(use_skypilot=False)
    spot_offers(_job({"accelerator": "V100", "clouds": ["aws"], "regions": ["us-east-1", "us-east-2"]}), prices)
    assert prices.skipped == []
    with pytest.raises(PricingError, match=r"rollout.candidates\[0\].accelerator: aws sells H100 in counts of 8"):
        spot_offers(_job({"accelerator": "H100", "clouds": ["aws"]}), prices)
    assert prices.skipped == []


# ---- the plan, as a user runs it ---------------------------------------------------------------------
def test_dryrun_shows_the_on_demand_price_of_the_spot_offers_region(tmp_path):
    """`rlboost launch --dryrun examples/qwen-gsm8k.yaml` from another directory, bundled prices."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "CLOUDSDK_", "GCLOUD_"))}
    (tmp_path / "home").mkdir()
    env.update(
        HOME=str(tmp_path / "home"),
        RLBOOST_HOME=str(tmp_path / "rlboost"),
        SKY_RUNTIME_DIR=str(tmp_path / "no-sky"),
        PYTHONPATH=str(ROOT),  # this tree, from another directory (as the report's repro)
        COLUMNS="200",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "rlboost.cli.main", "launch", str(QWEN), "--dryrun"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [row] = [ln.split() for ln in proc.stdout.splitlines() if ln.split()[:1] == ["gcp"] and "H100" in ln.split()]
    assert row[:5] == ["gcp", "any", "us-east4-a", "a3-highgpu-1g", "H100"]
    assert row[5:7] == ["1.976", "10.979"]
    # the candidate lists aws too, which sells H100 only in eights: said, not dropped silently
    assert "rollout.candidates[0]: aws: no H100:1 spot offer (aws sells H100 in counts of 8" in proc.stdout
