from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from rlboost.providers.catalog import (
    DEFAULT_LOCAL_PRICES,
    CatalogError,
    default_local_price,
    load_catalog,
    parse_accelerator,
)

PRICES = Path(__file__).parents[2] / "shared" / "data" / "prices"
AWS = PRICES / "skypilot_catalog_v7_aws_gpu_p_family.csv"
GCP = PRICES / "skypilot_catalog_v7_gcp_gpu_subset.csv"


def _need(p: Path) -> Path:
    if not p.exists():
        pytest.skip(f"shared price data not present: {p} (expected beside the repository)")
    return p


def test_gcp_total_is_host_plus_accelerator() -> None:
    cat = load_catalog(_need(GCP))
    [offer] = [o for o in cat.offers("A100", 1, cloud="gcp") if o.zone == "us-central1-a"]
    assert offer.instance_type == "a2-highgpu-1g"
    assert math.isclose(offer.on_demand, 0.73948 + 2.93391)
    assert math.isclose(offer.spot, 0.29576 + 1.1472)
    # every zone of us-central1 has the same prices, so price() gives the same total
    assert math.isclose(cat.price("A100", 1, cloud="gcp", region="us-central1", spot=False), 3.67339)
    assert math.isclose(cat.price("a100", 1, cloud=None, region="us-central1", spot=True), 1.44296)


def test_gcp_accelerators_without_host_row_are_left_out() -> None:
    cat = load_catalog(_need(GCP))
    # V100 rides on n1 hosts and A100:16 on a2-megagpu-16g: neither host is in the subset
    assert cat.price("V100", 1, cloud=None, region=None, spot=False) is None
    assert cat.price("A100", 16, cloud=None, region=None, spot=True) is None
    assert {o.cloud for o in cat.offers()} == {"gcp"}
    assert all(o.instance_type for o in cat.offers())


def _aws_rows() -> list[dict[str, str]]:
    with _need(AWS).open() as f:
        return list(csv.DictReader(f))


def test_aws_cheapest_offer_matches_an_independent_scan() -> None:
    cat = load_catalog(AWS)
    rows = _aws_rows()
    want = min(
        float(r["SpotPrice"])
        for r in rows
        if r["InstanceType"] == "p3.2xlarge" and r["Region"] == "us-east-1" and r["SpotPrice"]
    )
    assert cat.price("V100", 1, cloud="aws", region="us-east-1", spot=True) == want == 0.5197
    assert cat.price("V100", 1, cloud="aws", region="us-east-1", spot=False) == 3.06
    assert cat.price("V100", 4, cloud="aws", region="us-east-1", spot=False) == pytest.approx(4 * 3.06)
    assert cat.price("H100", 8, cloud="aws", region="us-east-1", spot=False) == 98.32
    assert cat.price("V100", 2, cloud="aws", region=None, spot=False) is None  # exact count only
    assert cat.price("V100", 1, cloud="gcp", region=None, spot=False) is None  # wrong cloud
    offers = cat.offers("V100", 1, region="us-east-1", spot=True)
    assert [o.spot for o in offers] == sorted(o.spot for o in offers)
    assert len(offers) == sum(
        1 for r in rows if r["InstanceType"] == "p3.2xlarge" and r["Region"] == "us-east-1" and r["SpotPrice"]
    )


def test_aws_rows_without_on_demand_price_still_offer_spot() -> None:
    cat = load_catalog(AWS)
    p5e = [o for o in cat.offers("H200", 8, region="us-east-2", spot=True) if o.instance_type == "p5e.48xlarge"]
    assert p5e and all(o.on_demand is None for o in p5e)
    assert all(o.on_demand is not None for o in cat.offers("H200", 8, spot=False))


def test_cloud_inference_and_override(tmp_path: Path) -> None:
    src = _need(AWS).read_text()
    for sub, want in [("aws/vms.csv", "aws"), ("mystery.csv", "unknown")]:
        p = tmp_path / sub
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(src)
        assert {o.cloud for o in load_catalog(p).offers()} == {want}
    assert {o.cloud for o in load_catalog(tmp_path / "mystery.csv", cloud="lambda").offers()} == {"lambda"}


def test_catalog_errors(tmp_path: Path) -> None:
    p = tmp_path / "vms.csv"
    p.write_text("InstanceType,Price\nx,1\n")
    with pytest.raises(CatalogError, match=rf"{p}:1: not a SkyPilot vms.csv"):
        load_catalog(p)
    p.write_text(
        "InstanceType,AcceleratorName,AcceleratorCount,Price,SpotPrice,Region,AvailabilityZone\n"
        "p3.2xlarge,V100,1.0,3.06,0.5,us-east-1,use1-az1\n"
        "p3.2xlarge,V100,1.0,cheap,0.5,us-east-1,use1-az2\n"
    )
    with pytest.raises(CatalogError, match=rf"{p}:3: column Price is 'cheap'"):
        load_catalog(p)
    with pytest.raises(CatalogError, match="cannot read"):
        load_catalog(tmp_path / "absent.csv")


def test_default_local_prices_trace_back_to_the_shared_files() -> None:
    for name, p in DEFAULT_LOCAL_PRICES.items():
        assert 0 < p.spot < p.on_demand, name
    gcp = load_catalog(_need(GCP))
    a100 = next(o for o in gcp.offers("A100", 1) if o.zone == "us-central1-a")
    assert DEFAULT_LOCAL_PRICES["A100"] == pytest.approx((a100.on_demand, a100.spot))
    aws = load_catalog(_need(AWS))
    assert DEFAULT_LOCAL_PRICES["V100"].on_demand == aws.price("V100", 1, cloud="aws", region="us-east-1", spot=False)
    assert DEFAULT_LOCAL_PRICES["V100"].spot == aws.price("V100", 1, cloud="aws", region="us-east-1", spot=True)


def test_default_local_price_helper() -> None:
    assert parse_accelerator("A100:8") == ("A100", 8)
    assert parse_accelerator("H100") == ("H100", 1)
    assert parse_accelerator(None) == ("cpu", 1)
    assert default_local_price("a100:2", spot=True) == pytest.approx(2 * DEFAULT_LOCAL_PRICES["A100"].spot)
    assert default_local_price(None, spot=False) == DEFAULT_LOCAL_PRICES["cpu"].on_demand
    assert default_local_price("TPUv9", spot=False) is None
