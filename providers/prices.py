"""Prices for real clouds: SkyPilot's catalog when it is on this machine, else a bundled snapshot.

SkyPilot keeps its catalog under `$SKY_RUNTIME_DIR/.sky/catalogs/<version>/<cloud>/vms.csv` (fetched
on its first use). rlboost reads it through `sky.catalog` so that the prices it ranks candidates by
are the ones SkyPilot launches at. Where that file is missing it never fetches anything itself: it
falls back to `contracts/data/*_vms.csv` and says so in the plan.
"""

from __future__ import annotations

import difflib
import math
import re
from functools import cache
from pathlib import Path

from contracts.bundled_data import bundled_path
from providers.catalog import Catalog, Offer, load_catalog, parse_accelerator

BUNDLED = {"aws": "aws_vms.csv", "gcp": "gcp_vms.csv"}


@cache
def bundled_catalog(cloud: str) -> Catalog | None:
    name = BUNDLED.get(cloud)
    if name is None:
        return None
    return load_catalog(bundled_path(name), cloud=cloud)


def sky_catalog_present(cloud: str) -> bool:
    try:
        from sky.catalog import common
    except ImportError:
        return False
    return Path(common.get_catalog_path(f"{cloud}/vms.csv")).is_file()


class CloudPrices:
    """`prices(accelerator, cloud, region, spot) -> $/h or None` for `providers.pricing`.

    `region=None` means "any region": the cheapest one (SkyPilot picks and fails over itself).
    `sources` records where each cloud's prices came from, for the plan.
    """

    def __init__(self, *, use_skypilot: bool = True) -> None:
        self.use_skypilot = use_skypilot
        self.sources: dict[str, str] = {}

    def __call__(self, accelerator: str | None, cloud: str, region: str | None, spot: bool) -> float | None:
        name, count = parse_accelerator(accelerator)
        if self.use_skypilot and sky_catalog_present(cloud):
            self.sources[cloud] = "SkyPilot catalog"
            return _sky_price(name, count, cloud, region, spot)
        cat = bundled_catalog(cloud)
        if cat is None:
            return None
        self.sources[cloud] = "bundled snapshot (contracts/data)"
        return cat.price(name, count, cloud=cloud, region=region, spot=spot)


    def explain_miss(self, accelerator: str | None, cloud: str, region: str | None) -> tuple[str, str] | None:
        """Why `self(...)` found no price, when the catalog can tell: a region it does not know (with
        close matches) or an accelerator it lacks (with the ones it has), as ("region" or "accelerator",
        the problem). None: it knows both, so the miss is the region's stock or spot vs on demand."""
        known = _catalog_rows(cloud, self.use_skypilot)
        if not known:
            return None
        name, count = parse_accelerator(accelerator)
        regions = sorted({r for _, _, r in known})
        if region is not None and region not in regions:
            close = difflib.get_close_matches(region, regions, n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(close)}?" if close else f"{cloud} regions: {', '.join(regions)}"
            return "region", f"{region!r} is not a region of {cloud} in the price catalog ({hint})"
        names = sorted({n for n, _, _ in known}, key=str.lower)
        if name.lower() not in {n.lower() for n in names}:
            return "accelerator", f"the {cloud} price catalog has no {name!r} (it has: {', '.join(names)})"
        counts = sorted({c for n, c, _ in known if n.lower() == name.lower()})
        if count not in counts:
            return "accelerator", f"{cloud} sells {name} in counts of {', '.join(map(str, counts))}, not {count}"
        return None


def _catalog_rows(cloud: str, use_skypilot: bool) -> set[tuple[str, int, str]]:
    """(accelerator, count, region) of every instance the cloud's catalog lists."""
    if use_skypilot and sky_catalog_present(cloud):
        from sky import catalog

        found = catalog.list_accelerators(gpus_only=False, clouds=cloud, all_regions=True)
        return {(n, int(i.accelerator_count), i.region) for n, infos in found.items() for i in infos}
    cat = bundled_catalog(cloud)
    return {(o.accelerator, o.count, o.region) for o in cat.all(cloud)} if cat is not None else set()


def _sky_price(name: str, count: int, cloud: str, region: str | None, spot: bool) -> float | None:
    from sky import catalog

    found = catalog.list_accelerators(
        gpus_only=False,  # the catalog's GpuInfo column may be empty
        name_filter=f"^{re.escape(name)}$",
        region_filter=f"^{re.escape(region)}$" if region else None,
        quantity_filter=count,
        clouds=cloud,
        case_sensitive=False,
        all_regions=True,
    )
    vals = [i.spot_price if spot else i.price for infos in found.values() for i in infos]
    vals = [float(v) for v in vals if v is not None and not math.isnan(v)]
    return min(vals) if vals else None


def placements(accelerator: str | None, cloud: str, region: str | None, *, spot: bool) -> list[Offer]:
    """Bundled catalog offers for direct providers (instance/machine type, zone), cheapest first."""
    cat = bundled_catalog(cloud)
    if cat is None:
        return []
    name, count = parse_accelerator(accelerator)
    return cat.offers(name, count, cloud=cloud, region=region, spot=spot)
