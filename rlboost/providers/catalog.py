"""Prices from SkyPilot catalog files (`vms.csv`), plus a small default table for the local provider.

Two layouts exist upstream (see prices/SOURCES.md in the shared data):
- AWS-like: each row is an instance type with its accelerators and its full price.
- GCP: a GPU VM is *two* rows in the same zone, the host VM (InstanceType set, no accelerator) and
  the accelerator (InstanceType empty). Its price is host + accelerator, as SkyPilot computes it.
  Which host goes with which accelerator follows SkyPilot's fixed machine families (A100 -> a2-highgpu,
  H100 -> a3-highgpu, ...). Accelerators whose host row is not in the file (e.g. V100 on n1 hosts)
  are left out rather than priced at the GPU alone, which would understate the cost.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from rlboost.contracts.bundled_data import local_file


class CatalogError(ValueError):
    """A malformed catalog file; the message names the file and line."""


@dataclass(frozen=True)
class Offer:
    cloud: str
    region: str
    zone: str | None
    instance_type: str
    accelerator: str
    count: int
    on_demand: float | None  # None: not sold on-demand there (some AWS p5e rows)
    spot: float | None  # None: no spot offer in this zone


# GCP accelerator -> host machine family; the machine type is f"{family}-{count}g".
_GCP_HOST_FAMILY = {
    "A100": "a2-highgpu",
    "A100-80GB": "a2-ultragpu",
    "H100": "a3-highgpu",
    "H100-MEGA": "a3-megagpu",
    "H200": "a3-ultragpu",
    "B200": "a4-highgpu",
}
_GCP_HOST_OVERRIDE = {("A100", 16): "a2-megagpu-16g"}

_KNOWN_CLOUDS = ("aws", "gcp", "azure", "lambda", "runpod", "oci", "ibm", "fluidstack", "paperspace", "do")
_REQUIRED = ("InstanceType", "AcceleratorName", "AcceleratorCount", "Price", "SpotPrice", "Region")


class Catalog:
    def __init__(self, offers: list[Offer], source: str = "inline") -> None:
        self._offers = list(offers)
        self.source = source

    def __len__(self) -> int:
        return len(self._offers)

    def all(self, cloud: str | None = None) -> list[Offer]:
        """Every row (of one cloud), priced or not: what the catalog knows exists."""
        return [o for o in self._offers if cloud is None or o.cloud == cloud]

    def offers(
        self,
        accelerator: str | None = None,
        count: int | None = None,
        *,
        cloud: str | None = None,
        region: str | None = None,
        spot: bool = False,
    ) -> list[Offer]:
        """Matching offers, cheapest first by the spot (spot=True) or on-demand price; offers
        without that price are dropped."""
        acc = accelerator.lower() if accelerator else None
        out = [
            o
            for o in self._offers
            if (acc is None or o.accelerator.lower() == acc)
            and (count is None or o.count == count)
            and (cloud is None or o.cloud == cloud)
            and (region is None or o.region == region)
            and (o.spot if spot else o.on_demand) is not None
        ]
        out.sort(key=lambda o: (o.spot if spot else o.on_demand, o.cloud, o.region, o.zone or ""))
        return out

    def price(self, accelerator: str, count: int, *, cloud: str | None, region: str | None, spot: bool) -> float | None:
        """$/h of the cheapest instance with exactly `count` such accelerators; None if none."""
        found = self.offers(accelerator, count, cloud=cloud, region=region, spot=spot)
        if not found:
            return None
        best = found[0]
        return best.spot if spot else best.on_demand

    def spot_pair(
        self, accelerator: str, count: int, *, cloud: str | None, region: str | None
    ) -> tuple[float, float | None] | None:
        """(spot $/h, on-demand $/h) of one place: the cheapest spot offer (the first of
        `offers(spot=True)`, the zone and instance type a plan shows) and the on-demand price of that
        instance type in that zone, else in its region, else of the region's cheapest instance with
        these accelerators; None for it where the region sells none on demand. None: no spot offer.

        With `region=None` the two prices must not be minimised separately: the cheapest on-demand
        price is often another region's, and savings measured against it would be wrong."""
        found = self.offers(accelerator, count, cloud=cloud, region=region, spot=True)
        if not found:
            return None
        best = found[0]
        spot = float(best.spot or 0.0)  # set: offers(spot=True) keeps only offers with a spot price
        if best.on_demand is not None:
            return spot, best.on_demand
        here = self.offers(accelerator, count, cloud=best.cloud, region=best.region, spot=False)
        same_type = [o for o in here if o.instance_type == best.instance_type]
        return spot, ((same_type or here)[0].on_demand if here else None)


def _num(raw: str | None, src: str, lineno: int, col: str) -> float | None:
    if raw is None or raw.strip() == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise CatalogError(f"{src}:{lineno}: column {col} is {raw!r}, not a number") from None


def _infer_cloud(path: Path) -> str | None:
    tokens = set(re.split(r"[^a-z0-9]+", str(path).lower()))
    return next((c for c in _KNOWN_CLOUDS if c in tokens), None)


def load_catalog(path: str | Path, *, cloud: str | None = None) -> Catalog:
    """Read a SkyPilot vms.csv (AWS-like or GCP layout).

    The cloud is `cloud`, else a cloud name in the path (`.../gcp/vms.csv`,
    `skypilot_catalog_v7_aws_...csv`), else 'gcp' for the GCP layout and 'unknown' otherwise.
    """
    p = Path(path)
    try:
        text = local_file(path).read_text(encoding="utf-8-sig")
    except OSError as e:
        raise CatalogError(f"{p}: cannot read catalog ({e.strerror or e})") from None
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in _REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise CatalogError(f"{p}:1: not a SkyPilot vms.csv (missing column(s) {', '.join(missing)})")
    src = str(p)
    hosts: dict[tuple[str, str | None, str], tuple[float, float | None]] = {}
    gpus: list[tuple[int, dict[str, str]]] = []
    plain: list[tuple[int, dict[str, str]]] = []
    for lineno, row in enumerate(reader, 2):
        itype = (row.get("InstanceType") or "").strip()
        acc = (row.get("AcceleratorName") or "").strip()
        if not (row.get("Region") or "").strip():
            raise CatalogError(f"{src}:{lineno}: empty Region")
        if not itype and acc:
            gpus.append((lineno, row))  # GCP accelerator row
        elif itype and not acc:
            od = _num(row["Price"], src, lineno, "Price")
            sp = _num(row["SpotPrice"], src, lineno, "SpotPrice")
            if od is not None:  # GCP host VMs (and CPU-only types, which are not offers here)
                hosts[(row["Region"], row.get("AvailabilityZone") or None, itype)] = (od, sp)
        elif itype and acc:
            plain.append((lineno, row))
    gcp_layout = bool(gpus)
    cloud = cloud or _infer_cloud(p) or ("gcp" if gcp_layout else "unknown")

    offers: list[Offer] = []
    for lineno, row in plain:
        od = _num(row["Price"], src, lineno, "Price")
        sp = _num(row["SpotPrice"], src, lineno, "SpotPrice")
        if od is not None or sp is not None:
            offers.append(_offer(cloud, row, row["InstanceType"], od, sp, src, lineno))
    for lineno, row in gpus:
        od = _num(row["Price"], src, lineno, "Price")
        sp = _num(row["SpotPrice"], src, lineno, "SpotPrice")
        count = _count(row, src, lineno)
        name = row["AcceleratorName"].strip()
        host = _GCP_HOST_OVERRIDE.get((name, count))
        if host is None and name in _GCP_HOST_FAMILY:
            host = f"{_GCP_HOST_FAMILY[name]}-{count}g"
        hp = hosts.get((row["Region"], row.get("AvailabilityZone") or None, host or ""))
        if hp is None:
            continue  # host VM price unknown: the total would be wrong
        total_od = od + hp[0] if od is not None else None
        total_sp = sp + hp[1] if sp is not None and hp[1] is not None else None
        if total_od is not None or total_sp is not None:
            offers.append(_offer(cloud, row, host or "", total_od, total_sp, src, lineno))
    return Catalog(offers, src)


def _count(row: dict[str, str], src: str, lineno: int) -> int:
    n = _num(row["AcceleratorCount"], src, lineno, "AcceleratorCount")
    if n is None or n <= 0 or n != int(n):
        raise CatalogError(f"{src}:{lineno}: AcceleratorCount {row['AcceleratorCount']!r} is not a count")
    return int(n)


def _offer(
    cloud: str, row: dict[str, str], itype: str, od: float | None, sp: float | None, src: str, lineno: int
) -> Offer:
    return Offer(
        cloud=cloud,
        region=row["Region"].strip(),
        zone=(row.get("AvailabilityZone") or "").strip() or None,
        instance_type=itype,
        accelerator=row["AcceleratorName"].strip(),
        count=_count(row, src, lineno),
        on_demand=od,
        spot=sp,
    )


# ---- defaults for the local provider ------------------------------------------------------


# accelerator -> LocalPrice(on-demand $/h, spot $/h) per GPU ('cpu': per node), used when a local job file
# gives no prices. Sources (files under shared/data/prices):
# - cpu:  GCP catalog, host VM part of a2-highgpu-1g (12 vCPU, 85 GB) in us-central1-a:
#         0.73948 / 0.29576 (skypilot_catalog_v7_gcp_gpu_subset.csv).
# - A100: GCP catalog, a2-highgpu-1g us-central1-a host + A100 row: 0.73948 + 2.93391 on-demand,
#         0.29576 + 1.1472 spot.
# - H100: GCP price history, a3-highgpu-1g us-central1, row of 2026-07-22: 11.06125 / 6.32619
#         (gcp_gpu_vm_price_history_2022_2026.csv; the catalog's H100 on-demand is inconsistent).
# - L4:   GCP price history, g2-standard-4 us-central1, row of 2026-07-22: 0.70683 / 0.39734.
# - V100: AWS catalog, p3.2xlarge us-east-1: 3.06 on-demand; cheapest AZ spot 0.5197 (use1-az1)
#         (skypilot_catalog_v7_aws_gpu_p_family.csv).
# - T4, L40S: NOT in the shared price files (their AWS g-family rows were not copied). On-demand is
#         AWS's public us-east-1 list price (g4dn.xlarge 0.526, g6e.xlarge 1.861); spot applies the
#         savings in aws_spot_advisor_data_2025.json for us-east-1 Linux (g4dn.xlarge 64%,
#         g6e.xlarge 58%).
class LocalPrice(NamedTuple):
    on_demand: float
    spot: float


DEFAULT_LOCAL_PRICES: dict[str, LocalPrice] = {
    "cpu": LocalPrice(0.73948, 0.29576),
    "A100": LocalPrice(3.67339, 1.44296),
    "H100": LocalPrice(11.06125, 6.32619),
    "L4": LocalPrice(0.70683, 0.39734),
    "V100": LocalPrice(3.06, 0.5197),
    "T4": LocalPrice(0.526, round(0.526 * (1 - 0.64), 5)),
    "L40S": LocalPrice(1.861, round(1.861 * (1 - 0.58), 5)),
}


def parse_accelerator(value: str | None) -> tuple[str, int]:
    """'A100:8' -> ('A100', 8); 'H100' -> ('H100', 1); None -> ('cpu', 1)."""
    if not value:
        return "cpu", 1
    name, _, n = value.partition(":")
    return name, int(n) if n else 1


def default_local_price(accelerator: str | None, *, spot: bool) -> float | None:
    """$/h for one node with `accelerator` ('NAME' or 'NAME:COUNT') from DEFAULT_LOCAL_PRICES."""
    name, count = parse_accelerator(accelerator)
    key = next((k for k in DEFAULT_LOCAL_PRICES if k.lower() == name.lower()), None)
    if key is None:
        return None
    od, sp = DEFAULT_LOCAL_PRICES[key]
    return (sp if spot else od) * (1 if key == "cpu" else count)
