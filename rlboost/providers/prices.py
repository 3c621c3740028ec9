"""Prices for real clouds: SkyPilot's catalog when it is on this machine, else a bundled snapshot.

SkyPilot keeps its catalog under `$SKY_RUNTIME_DIR/.sky/catalogs/<version>/<cloud>/vms.csv` (fetched
on its first use). rlboost reads it through `sky.catalog` so that the prices it ranks candidates by
are the ones SkyPilot launches at. Where that file is missing it never fetches anything itself: it
falls back to `rlboost/contracts/data/*_vms.csv` and says so in the plan.
"""

from __future__ import annotations

import difflib
import math
import re
from functools import cache
from pathlib import Path

from rlboost.contracts.bundled_data import bundled_path
from rlboost.contracts.cloud_kinds import CLOUD_KINDS
from rlboost.providers.catalog import Catalog, Offer, load_catalog, parse_accelerator


@cache
def bundled_catalog(cloud: str) -> Catalog | None:
    """The price snapshot shipped for `cloud` (its record's `catalog`), if any."""
    kind = CLOUD_KINDS.get(cloud)
    name = kind.catalog if kind is not None else None
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

    `region=None` means "any region": the cheapest one (SkyPilot picks and fails over itself). A spot
    offer's on-demand reference comes from `spot_pair`, never from a separate `spot=False` call: with
    `region=None` that would be the cheapest on-demand price anywhere, often another region's.
    For the plan: `sources` records where each cloud's prices came from, and `skipped` the candidate
    placements (cloud, region) that the catalog sells no spot offer for, which `providers.pricing`
    leaves out of a candidate that other clouds or regions still price (one line each).
    """

    def __init__(self, *, use_skypilot: bool = True) -> None:
        self.use_skypilot = use_skypilot
        self.sources: dict[str, str] = {}
        self.skipped: list[str] = []

    def __call__(self, accelerator: str | None, cloud: str, region: str | None, spot: bool) -> float | None:
        name, count = parse_accelerator(accelerator)
        if self.use_skypilot and sky_catalog_present(cloud):
            self.sources[cloud] = "SkyPilot catalog"
            return _sky_price(name, count, cloud, region, spot)
        cat = bundled_catalog(cloud)
        if cat is None:
            return None
        self.sources[cloud] = "bundled snapshot (rlboost/contracts/data)"
        return cat.price(name, count, cloud=cloud, region=region, spot=spot)

    def spot_pair(self, accelerator: str | None, cloud: str, region: str | None) -> tuple[float, float | None] | None:
        """(spot $/h, on-demand $/h) of one place: the cheapest spot offer in `region` (any region when
        None) and the on-demand price of the same region (and instance type, where the catalog tells),
        None for it where that region sells none on demand. None: no spot offer.

        In a named region the spot price is `self(..., spot=True)`'s, so that a subclass pricing spot
        live (`providers.aws.AwsLivePrices`) pairs its live price with that region's on-demand one."""
        name, count = parse_accelerator(accelerator)
        if self.use_skypilot and sky_catalog_present(cloud):
            self.sources[cloud] = "SkyPilot catalog"
            pair = _sky_pair(name, count, cloud, region)
        else:
            cat = bundled_catalog(cloud)
            if cat is None:
                return None
            self.sources[cloud] = "bundled snapshot (rlboost/contracts/data)"
            pair = cat.spot_pair(name, count, cloud=cloud, region=region)
        if pair is None or region is None:
            return pair
        spot = self(accelerator, cloud, region, True)
        return (spot, pair[1]) if spot is not None else None

    def explain_miss(self, accelerator: str | None, cloud: str, region: str | None) -> tuple[str, str] | None:
        """Why `self(...)` found no price, when the catalog can tell: a region it does not know (with
        close matches) or an accelerator it lacks (with the ones it has), as ("region" or "accelerator",
        the problem). None: it knows both, so the miss is the region's stock or spot vs on demand."""
        known = _catalog_rows(cloud, self.use_skypilot)
        if not known:
            return None
        name, count = parse_accelerator(accelerator)
        regions = sorted({r for _, _, r, _ in known})
        if region is not None and region not in regions:
            close = difflib.get_close_matches(region, regions, n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(close)}?" if close else f"{cloud} regions: {', '.join(regions)}"
            return "region", f"{region!r} is not a region of {cloud} in the price catalog ({hint})"
        names = sorted({n for n, _, _, _ in known}, key=str.lower)
        if name.lower() not in {n.lower() for n in names}:
            return "accelerator", f"the {cloud} price catalog has no {name!r} (it has: {', '.join(names)})"
        counts = sorted({c for n, c, _, _ in known if n.lower() == name.lower()})
        if count not in counts:
            types = {
                c: ", ".join(sorted({t for n, k, _, t in known if n.lower() == name.lower() and k == c}))
                for c in counts
            }
            sold = ", ".join(f"{c} as {types[c]}" for c in counts)
            listed = ", ".join(map(str, counts))
            return "accelerator", f"{cloud} sells {name} in counts of {listed}, not {count}: {sold}"
        return None


def _catalog_rows(cloud: str, use_skypilot: bool) -> set[tuple[str, int, str, str]]:
    """(accelerator, count, region, instance type) of every instance the cloud's catalog lists."""
    if use_skypilot and sky_catalog_present(cloud):
        from sky import catalog

        found = catalog.list_accelerators(gpus_only=False, clouds=cloud, all_regions=True)
        return {
            (n, int(i.accelerator_count), i.region, i.instance_type or "") for n, infos in found.items() for i in infos
        }
    cat = bundled_catalog(cloud)
    return {(o.accelerator, o.count, o.region, o.instance_type) for o in cat.all(cloud)} if cat is not None else set()


def _num(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


def _sky_price(name: str, count: int, cloud: str, region: str | None, spot: bool) -> float | None:
    vals = [_num(i.spot_price if spot else i.price) for i in _sky_infos(name, count, cloud, region)]
    vals = [v for v in vals if v is not None]
    return min(vals) if vals else None


def _sky_pair(name: str, count: int, cloud: str, region: str | None) -> tuple[float, float | None] | None:
    """`CloudPrices.spot_pair` from SkyPilot's catalog: one entry per instance type and region, the
    cheapest spot one (ties: by region, then instance type, as the bundled catalog orders them)."""
    infos = _sky_infos(name, count, cloud, region)
    spots = [(s, i.region, i.instance_type or "", i) for i in infos if (s := _num(i.spot_price)) is not None]
    if not spots:
        return None
    spot, where, _, best = min(spots, key=lambda e: e[:3])
    od = _num(best.price)
    if od is None:  # not sold on demand as this type: the region's cheapest on-demand instance of it
        here = [v for i in infos if i.region == where and (v := _num(i.price)) is not None]
        od = min(here) if here else None
    return spot, od


def _sky_infos(name: str, count: int, cloud: str, region: str | None) -> list:
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
    return [i for infos in found.values() for i in infos]


def placements(accelerator: str | None, cloud: str, region: str | None, *, spot: bool) -> list[Offer]:
    """Bundled catalog offers for direct providers (instance/machine type, zone), cheapest first."""
    cat = bundled_catalog(cloud)
    if cat is None:
        return []
    name, count = parse_accelerator(accelerator)
    return cat.offers(name, count, cloud=cloud, region=region, spot=spot)
