"""Offers: what the trainer and each spot candidate cost per hour, and in which order to bid.

Spot candidates are ranked by expected dollars per generated token: hourly price ÷ relative
throughput. Prices come from the job file first, then a catalog, then the built-in local table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from contracts.spec import JobSpec, SpotCandidate

# A real cloud's price source: (accelerator, cloud, region or None = any, spot) -> $/h or None.
# When given, it replaces the built-in local table (a real cloud is never priced from it).
PriceLookup = Callable[[str | None, str, str | None, bool], float | None]


class PricingError(Exception):
    """No usable offer; the message says what to change."""


@dataclass(frozen=True)
class Offer:
    cloud: str
    region: str | None
    accelerator: str | None
    hourly_price: float
    on_demand_price: float | None
    throughput: float = 1.0
    spot: bool = True

    @property
    def key(self) -> str:
        return f"{self.cloud}/{self.region or '*'}/{self.accelerator}"

    @property
    def dollars_per_unit_throughput(self) -> float:
        return self.hourly_price / self.throughput

    def describe(self) -> str:
        where = self.cloud + (f"/{self.region}" if self.region else "")
        return f"{self.accelerator or 'cpu'} on {where}, ${self.hourly_price:.3f}/h"


def _split(acc: str | None) -> tuple[str, int]:
    if not acc:
        return "cpu", 1
    name, _, count = acc.partition(":")
    return name, int(count or 1)


def default_price(acc: str | None, spot: bool) -> float | None:
    from providers.catalog import DEFAULT_LOCAL_PRICES

    name, count = _split(acc)
    entry = DEFAULT_LOCAL_PRICES.get(name) or DEFAULT_LOCAL_PRICES.get(name.upper())
    if entry is None:
        return None
    return count * (entry.spot if spot else entry.on_demand)


def _catalog_price(spec: JobSpec, acc: str | None, cloud: str | None, region: str | None, spot: bool) -> float | None:
    if spec.local.catalog is None:
        return None
    from providers.catalog import load_catalog

    name, count = _split(acc)
    cat = load_catalog(spec.local.catalog)
    return cat.price(name, count, cloud=None if cloud == "local" else cloud, region=region, spot=spot)


def _why_missing(prices: PriceLookup, acc: str | None, cloud: str, region: str | None) -> tuple[str, str] | None:
    """("region" | "accelerator", problem) when the price source can tell why it has no price (a
    region typo, an accelerator its catalog lacks); None when the miss is only this offer's."""
    explain = getattr(prices, "explain_miss", None)
    return explain(acc, cloud, region) if explain is not None else None


def trainer_offer(spec: JobSpec, prices: PriceLookup | None = None) -> Offer:
    t = spec.trainer
    od = t.hourly_price
    if od is None:
        od = _catalog_price(spec, t.accelerators, t.cloud, t.region, spot=False)
    if od is None and prices is not None:
        od = prices(t.accelerators, t.cloud, t.region, False)
        if od is None:
            why = _why_missing(prices, t.accelerators, t.cloud, t.region)
            if why is not None:
                raise PricingError(f"trainer.{'region' if why[0] == 'region' else 'accelerators'}: {why[1]}")
            where = t.cloud + (f"/{t.region}" if t.region else "")
            raise PricingError(
                f"trainer.accelerators: {t.cloud} does not offer {t.accelerators!r} on demand in {where} "
                "(per the price catalog); pick another accelerator/region or set trainer.hourly_price"
            )
    if od is None:
        od = default_price(t.accelerators, spot=False)
    if od is None:
        raise PricingError(
            f"trainer.accelerators: no price known for {t.accelerators!r}; set trainer.hourly_price or local.catalog"
        )
    return Offer(t.cloud, t.region, t.accelerators, od * t.nodes, od * t.nodes, spot=False)


def spot_offers(spec: JobSpec, prices: PriceLookup | None = None) -> list[Offer]:
    """Candidates as offers, cheapest $/throughput first, filtered by max_hourly_price."""
    offers: list[Offer] = []
    for i, c in enumerate(spec.rollout.candidates):
        offers.extend(_candidate_offers(spec, i, c, prices))
    cap = spec.rollout.max_hourly_price
    if cap is not None and spec.rollout.max_workers > 0:
        under = [o for o in offers if o.hourly_price <= cap]
        if not under:
            cheapest = min(offers, key=lambda o: o.hourly_price)
            raise PricingError(
                f"rollout.max_hourly_price ${cap:.3f}/h is below every spot offer (cheapest: "
                f"{cheapest.describe()}); raise the cap or add cheaper candidates"
            )
        offers = under
    return sorted(offers, key=lambda o: (o.dollars_per_unit_throughput, o.key))


def _candidate_offers(spec: JobSpec, i: int, c: SpotCandidate, prices: PriceLookup | None = None) -> list[Offer]:
    out = []
    # (cloud, region) -> why the catalog has no spot price there; a miss in one of several clouds or
    # regions is normal, so these become errors only below, when they explain the candidate as a whole
    misses: dict[tuple[str, str | None], tuple[str, str]] = {}
    for cloud in c.clouds:
        for region in c.regions or [None]:
            spot = c.spot_price
            if spot is None:
                spot = _catalog_price(spec, c.accelerator, cloud, region, spot=True)
            if spot is None and prices is not None:
                spot = prices(c.accelerator, cloud, region, True)
                if spot is None:
                    why = _why_missing(prices, c.accelerator, cloud, region)
                    if why is not None:
                        misses[(cloud, region)] = why
                    continue  # not offered as spot there (a region lists only what it sells)
            if spot is None:
                spot = default_price(c.accelerator, spot=True)
            if spot is None:
                raise PricingError(
                    f"rollout.candidates[{i}]: no spot price known for {c.accelerator!r} on {cloud}; "
                    "set spot_price (and on_demand_price) or local.catalog"
                )
            od = c.on_demand_price
            if od is None:
                od = _catalog_price(spec, c.accelerator, cloud, region, spot=False)
            if od is None and prices is not None:
                od = prices(c.accelerator, cloud, region, False)
            elif od is None:
                od = default_price(c.accelerator, spot=False)
            out.append(Offer(cloud, region, c.accelerator, spot, od, c.throughput))
    _raise_candidate_miss(i, c, misses, found_any=bool(out))
    if not out:
        where = ", ".join(c.clouds) + (f" in {', '.join(c.regions)}" if c.regions else "")
        raise PricingError(
            f"rollout.candidates[{i}]: no cloud offers {c.accelerator!r} as spot ({where}, per the price "
            "catalog); pick another accelerator, cloud or region, or set spot_price"
        )
    return out


def _raise_candidate_miss(i: int, c: SpotCandidate, misses: dict, *, found_any: bool) -> None:
    """A region no listed cloud knows is a typo; an accelerator is an error once no cloud sells it."""
    for region in c.regions:
        why = [misses.get((cloud, region)) for cloud in c.clouds]
        if all(w is not None and w[0] == "region" for w in why):
            raise PricingError(f"rollout.candidates[{i}].regions: {'; '.join(w[1] for w in why if w)}")
    if not found_any:
        for kind, problem in misses.values():
            if kind == "accelerator":
                raise PricingError(f"rollout.candidates[{i}].accelerator: {problem}")
