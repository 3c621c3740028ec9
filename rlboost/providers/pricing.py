"""Offers: what the trainer and each spot candidate cost per hour, and in which order to bid.

Spot candidates are ranked by expected dollars per generated token: hourly price ÷ relative
throughput. Prices come from the job file first, then a catalog, then the built-in local table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlboost.contracts.cloud_kinds import CLOUD_KINDS
from rlboost.contracts.spec import JobSpec, SpotCandidate

# A real cloud's price source: (accelerator, cloud, region or None = any, spot) -> $/h or None.
# When given, it replaces the built-in local table (a real cloud is never priced from it).
# A spot candidate's two prices come from its `spot_pair(accelerator, cloud, region)` where it has one
# (`providers.prices.CloudPrices`): (spot, on-demand) of one place, so that the on-demand reference a
# spot offer's savings are measured against is never another region's. Its `skipped` list, where it has
# one, collects the placements a candidate lost for want of a spot offer, as lines for the plan.
PriceLookup = Callable[[str | None, str, str | None, bool], float | None]
Pair = tuple[float, float | None]  # (spot $/h, on-demand $/h or None) of one place


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
    from rlboost.providers.catalog import DEFAULT_LOCAL_PRICES

    name, count = _split(acc)
    entry = DEFAULT_LOCAL_PRICES.get(name) or DEFAULT_LOCAL_PRICES.get(name.upper())
    if entry is None:
        return None
    return count * (entry.spot if spot else entry.on_demand)


def _catalog_cloud(cloud: str | None) -> str | None:
    """The cloud whose rows of `local.catalog` price a placement: a cloud of this machine (the local
    provider's) is priced by any cloud's rows."""
    kind = CLOUD_KINDS.get(cloud or "")
    return None if kind is not None and kind.shares_machine else cloud


def _catalog_price(spec: JobSpec, acc: str | None, cloud: str | None, region: str | None, spot: bool) -> float | None:
    if spec.local.catalog is None:
        return None
    from rlboost.providers.catalog import load_catalog

    name, count = _split(acc)
    cat = load_catalog(spec.local.catalog)
    return cat.price(name, count, cloud=_catalog_cloud(cloud), region=region, spot=spot)


def _catalog_pair(spec: JobSpec, acc: str | None, cloud: str, region: str | None) -> Pair | None:
    """`local.catalog`'s (spot, on-demand) of its cheapest spot offer's zone; None: no spot offer."""
    if spec.local.catalog is None:
        return None
    from rlboost.providers.catalog import load_catalog

    name, count = _split(acc)
    cat = load_catalog(spec.local.catalog)
    return cat.spot_pair(name, count, cloud=_catalog_cloud(cloud), region=region)


def _lookup_pair(prices: PriceLookup, acc: str | None, cloud: str, region: str | None) -> Pair | None:
    """(spot, on-demand) from a price source, both of one place where it can tell (`spot_pair`); a
    plain lookup is asked twice, which pairs them only where `region` is named."""
    pair = getattr(prices, "spot_pair", None)
    if pair is not None:
        return pair(acc, cloud, region)
    spot = prices(acc, cloud, region, True)
    return None if spot is None else (spot, prices(acc, cloud, region, False))


def _why_missing(prices: PriceLookup, acc: str | None, cloud: str, region: str | None) -> tuple[str, str] | None:
    """("region" | "accelerator", problem) when the price source can tell why it has no price (a
    region typo, an accelerator its catalog lacks); None when the miss is only this offer's."""
    explain = getattr(prices, "explain_miss", None)
    return explain(acc, cloud, region) if explain is not None else None


def catalog_sells_trainer(spec: JobSpec) -> bool:
    """Whether `local.catalog` prices the trainer's accelerators on demand where it runs (trainer_offer
    then takes that price, unless trainer.hourly_price is set)."""
    t = spec.trainer
    return _catalog_price(spec, t.accelerators, t.cloud, t.region, spot=False) is not None


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
    skipped: list[tuple[str, str | None]] = []  # (cloud, region) with no spot offer, left out
    for cloud in c.clouds:
        for region in c.regions or [None]:
            # spot and on-demand of one place: the catalog's cheapest spot offer and its own on-demand
            # price (with region=None, two separate minima would often be two regions' prices)
            pair = None
            if c.spot_price is None or c.on_demand_price is None:
                pair = _catalog_pair(spec, c.accelerator, cloud, region)
                if pair is None and prices is not None:
                    pair = _lookup_pair(prices, c.accelerator, cloud, region)
            spot = c.spot_price if c.spot_price is not None else (pair[0] if pair else None)
            if spot is None and prices is not None:
                why = _why_missing(prices, c.accelerator, cloud, region)
                if why is not None:
                    misses[(cloud, region)] = why
                skipped.append((cloud, region))
                continue  # not offered as spot there (a region lists only what it sells)
            if spot is None:
                spot = default_price(c.accelerator, spot=True)
            if spot is None:
                raise PricingError(
                    f"rollout.candidates[{i}]: no spot price known for {c.accelerator!r} on {cloud}; "
                    "set spot_price (and on_demand_price) or local.catalog"
                )
            od = _on_demand(spec, c, cloud, region, prices, pair)
            out.append(Offer(cloud, region, c.accelerator, spot, od, c.throughput))
    _raise_candidate_miss(i, c, misses, found_any=bool(out))
    if not out:
        where = ", ".join(c.clouds) + (f" in {', '.join(c.regions)}" if c.regions else "")
        raise PricingError(
            f"rollout.candidates[{i}]: no cloud offers {c.accelerator!r} as spot ({where}, per the price "
            "catalog); pick another accelerator, cloud or region, or set spot_price"
        )
    _note_skipped(prices, i, c, skipped, misses)
    return out


def _on_demand(
    spec: JobSpec,
    c: SpotCandidate,
    cloud: str,
    region: str | None,
    prices: PriceLookup | None,
    pair: Pair | None,
) -> float | None:
    """The on-demand $/h a spot offer is measured against: the job file's, else that of the place of
    the catalog's spot offer (`pair`; None where that place sells none on demand), else, with no spot
    offer in any catalog (`spot_price` set, or the built-in table), the on-demand price alone."""
    if c.on_demand_price is not None:
        return c.on_demand_price
    if pair is not None:
        if pair[1] is not None or prices is not None:
            return pair[1]
        return default_price(c.accelerator, spot=False)  # local.catalog without it: the built-in table
    od = _catalog_price(spec, c.accelerator, cloud, region, spot=False)
    if od is None and prices is not None:
        od = prices(c.accelerator, cloud, region, False)
    elif od is None:
        od = default_price(c.accelerator, spot=False)
    return od


def _note_skipped(
    prices: PriceLookup | None,
    i: int,
    c: SpotCandidate,
    skipped: list[tuple[str, str | None]],
    misses: dict[tuple[str, str | None], tuple[str, str]],
) -> None:
    """One line per placement a priced candidate lost for want of a spot offer, in `prices.skipped`
    (for the plan: otherwise a cloud listed in `clouds` vanishes without a word)."""
    notes = getattr(prices, "skipped", None)
    if notes is None:
        return
    name, count = _split(c.accelerator)
    for cloud, region in skipped:
        why = misses.get((cloud, region))
        reason = why[1] if why else "the price catalog lists no spot offer for it there"
        where = cloud + (f"/{region}" if region else "")
        line = f"rollout.candidates[{i}]: {where}: no {name}:{count} spot offer ({reason}); skipped"
        if line not in notes:
            notes.append(line)


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
