"""The `http` transport: the pull (rlboost/weights/pull.py), which every worker can always use.

The trainer's end has nothing to do beyond the publisher, whose routes serve every version; it offers
nothing, so every receiver pulls. A worker's end pulls the version into its store: as a delta from
the version it holds, from peers in its region (the tracker's region relay,
rlboost/weights/region_fanout.py) and from the trainer, or from the trainer's shared memory on the
trainer's own machine. It is also where every other transport's receivers fall back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlboost.contracts.protocol import Offer
from rlboost.weights.pull import pull_weights
from rlboost.weights.transports.base import Fetch, Receiver, WeightTransport

if TYPE_CHECKING:
    import torch


class HttpPull(WeightTransport):
    name = "http"

    async def publish(self, version: int, receivers: Sequence[Receiver]) -> dict[str, Offer]:
        return {}  # staged in the publisher: served from its routes

    async def fetch(self, job: Fetch, plan: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        return await pull_weights(
            job.base_url,
            job.version,
            job.pull,
            session=job.session,
            stats=job.stats,
            store=job.store,
            on_progress=job.on_progress,
        )
