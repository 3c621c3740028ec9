"""Placement: which spot candidate to bid for next.

Every candidate is scored by expected dollars per useful token:

    price / (rate * useful)          (lower is better)

- rate: the measured decode tokens/s of this candidate's workers (tokens over worker-hours), or,
  before any measurement, its relative `throughput` times the rate measured per unit of throughput
  on the others (1.0 when nothing is measured yet, i.e. the static $/throughput order).
- useful: the share of a worker's paid life spent generating. Each preemption wastes a boot (launch,
  boot, first weight pull): useful = 1 - boot_h * lambda, with lambda the preemption rate per
  worker-hour estimated as (preemptions + 1) / (worker-hours + prior_lifetime_h), and every
  capacity failure counts as a fraction of a boot. boot_h is learned: the mean time from launch to
  the worker dialling in over the boots seen so far, with `boot_s` as one prior observation.

The tracker is fed events (launches, capacity failures, preemptions, worker rates) by the controller
or the simulator; it never reads a clock or the network.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


class OfferLike(Protocol):
    @property
    def key(self) -> str: ...
    @property
    def hourly_price(self) -> float: ...
    @property
    def throughput(self) -> float: ...


@dataclass
class OfferStats:
    launches: int = 0
    capacity_failures: int = 0
    preemptions: int = 0
    worker_hours: float = 0.0  # closed lifetimes
    tokens_per_s: dict[str, float] = field(default_factory=dict)  # live workers' measured rates


@dataclass
class PlacementTracker:
    boot_s: float = 120.0  # prior: launch -> worker dialled in (seconds of the clock it is fed)
    prior_lifetime_h: float = 4.0
    failure_weight: float = 0.25  # a capacity failure costs this fraction of a boot
    stats: dict[str, OfferStats] = field(default_factory=dict)
    # tokens/s per offer key before anything is measured (e.g. from the performance model)
    prior_rate: dict[str, float] = field(default_factory=dict)
    offer_of: dict[str, str] = field(default_factory=dict)  # instance id -> offer key
    started_at: dict[str, float] = field(default_factory=dict)  # instance id -> clock (s)
    booted: set[str] = field(default_factory=set)  # instance ids seen dialled in
    boot_total_s: float = 0.0  # launch -> dialled in, summed over the boots seen
    boots_seen: int = 0

    def _s(self, key: str) -> OfferStats:
        return self.stats.setdefault(key, OfferStats())

    # ---- events ------------------------------------------------------------------------
    def launched(self, instance_id: str, key: str, clock: float) -> None:
        self._s(key).launches += 1
        self.offer_of[instance_id] = key
        self.started_at[instance_id] = clock

    def joined(self, instance_id: str, clock: float) -> None:
        """The worker dialled in (the controller: first seen in the trainer's status)."""
        t0 = self.started_at.get(instance_id)
        if t0 is not None and instance_id not in self.booted:
            self.booted.add(instance_id)
            self.boot_total_s += max(0.0, clock - t0)
            self.boots_seen += 1

    def capacity_failure(self, key: str) -> None:
        self._s(key).capacity_failures += 1

    def ended(self, instance_id: str, clock: float, preempted: bool) -> None:
        key = self.offer_of.pop(instance_id, None)
        if key is None:
            return
        s = self._s(key)
        t0 = self.started_at.pop(instance_id, clock)
        self.booted.discard(instance_id)
        s.worker_hours += max(0.0, clock - t0) / 3600.0
        s.preemptions += int(preempted)
        s.tokens_per_s.pop(instance_id, None)

    def worker_rate(self, instance_id: str, tokens_per_s: float) -> None:
        key = self.offer_of.get(instance_id)
        if key is not None and tokens_per_s > 0:
            self._s(key).tokens_per_s[instance_id] = tokens_per_s

    def on_workers(self, workers: Sequence[Mapping], clock: float) -> None:
        """The trainer's status `workers` list (worker_id, tokens_per_s), read at `clock`."""
        for w in workers:
            wid = str(w.get("worker_id", ""))
            self.joined(wid, clock)
            self.worker_rate(wid, float(w.get("tokens_per_s") or 0.0))

    # ---- decisions ---------------------------------------------------------------------
    def boot_estimate_s(self) -> float:
        """What a new worker costs before it can generate: the boots seen so far, and the prior."""
        return (self.boot_s + self.boot_total_s) / (1 + self.boots_seen)

    def rate(self, offer: OfferLike, per_throughput: float) -> float:
        s = self.stats.get(offer.key)
        if s and s.tokens_per_s:
            return sum(s.tokens_per_s.values()) / len(s.tokens_per_s)
        if offer.key in self.prior_rate:
            return self.prior_rate[offer.key]
        return offer.throughput * per_throughput

    def useful(self, offer: OfferLike, clock: float) -> float:
        s = self.stats.get(offer.key) or OfferStats()
        live_h = sum(max(0.0, clock - self.started_at[i]) / 3600.0 for i, k in self.offer_of.items() if k == offer.key)
        lam = (s.preemptions + 1.0) / (s.worker_hours + live_h + self.prior_lifetime_h)
        boots = lam * (1.0 + self.failure_weight * s.capacity_failures / max(1, s.launches))
        return max(0.05, 1.0 - (self.boot_estimate_s() / 3600.0) * boots)

    def score(self, offer: OfferLike, clock: float, per_throughput: float) -> float:
        """Dollars per useful token-second (lower is better)."""
        return offer.hourly_price / max(1e-9, self.rate(offer, per_throughput) * self.useful(offer, clock))

    def order(self, offers: Sequence[OfferLike], clock: float) -> list:
        """Candidates best first."""
        per = []
        for o in offers:
            s = self.stats.get(o.key)
            if s and s.tokens_per_s:
                per.append(sum(s.tokens_per_s.values()) / len(s.tokens_per_s) / o.throughput)
            elif o.key in self.prior_rate:
                per.append(self.prior_rate[o.key] / o.throughput)
        per_throughput = sum(per) / len(per) if per else 1.0
        return sorted(offers, key=lambda o: (self.score(o, clock, per_throughput), o.key))
