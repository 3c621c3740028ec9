"""Region-aware fan-out: which chunks a puller fetches from the trainer, and which peers it may use.

Why regions: workers in one region (one cloud's region, one VPC) trade at LAN speed, while links
across regions are slow, billed per byte, and often not routable at all. So the swarm of a version
is split by region: a chunk crosses into a region once (from the trainer, granted to one puller
there), and the region's other pullers fetch it from that puller. Trainer egress is then about
one copy of the model per region, and no peer bytes cross a region boundary.

When the puller that held or was fetching a chunk dies (stops announcing, or is reported bad), the
chunk is open again in that region, and the next announce grants it from the trainer: the fallback
when a region's seed dies is the trainer, never a peer in another region.

Pure functions of the tracker's view (rlboost/weights/tracker.py holds the state and the clock).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# cloud/region names as providers spell them (`aws/us-east-1`, `gcp/us-central1`, `local/local`)
REGION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,126}$"
UNKNOWN = ""  # workers that report no region form one group of their own (the region-blind swarm)


def region_key(cloud: str | None, region: str | None) -> str | None:
    """The region a node reports: `cloud/region`, since one region name can exist in two clouds."""
    if not cloud and not region:
        return None
    key = f"{cloud or 'unknown'}/{region or 'unknown'}"
    # a name the tracker would refuse: better region-blind than every announce rejected
    return key if re.fullmatch(REGION_PATTERN, key) else None


def group_of(region: str | None, *, by_region: bool) -> str:
    """The swarm group of a puller: its region, or one group for all when grouping is off."""
    return region if by_region and region else UNKNOWN


@dataclass(frozen=True)
class RegionView:
    """What the tracker knows of one region's swarm of one version."""

    n_chunks: int
    held: frozenset[int]  # chunks a serving peer of the region, or the caller itself, holds
    leased: Mapping[int, str]  # chunk -> the puller of this region fetching it from the trainer
    pullers: int  # live pullers of this region that are not done yet


def origin_grants(view: RegionView, caller: str, want: int) -> list[int]:
    """The chunks `caller` fetches from the trainer: its live leases, topped up with chunks nobody
    in its region holds or fetches, up to `want` and to its fair share of what the region still
    needs from the trainer (spread over the region's pullers, every chunk enters the region sooner
    and no single puller's link carries it all). Ascending chunk order."""
    mine = sorted(c for c, p in view.leased.items() if p == caller)
    open_chunks = [c for c in range(view.n_chunks) if c not in view.held and c not in view.leased]
    share = -(-(len(open_chunks) + len(view.leased)) // max(1, view.pullers))
    room = max(0, min(want, share) - len(mine))
    return sorted(mine + open_chunks[:room])


def may_trade(caller_group: str, peer_group: str) -> bool:
    """Peers are offered only within a region: across regions the trainer is as close, and reliable."""
    return caller_group == peer_group
