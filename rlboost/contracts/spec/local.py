"""The job file's `local:` section (the local provider)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from rlboost.contracts.spec.base import LaxPath, Seconds, Strict


class LocalSpec(Strict):
    """The embedded local provider: real processes, a replayed spot market."""

    # An availability trace: Bamboo-style `t_ms,add|remove,nodeK` CSV, GCP `date, time, N` lines,
    # or JSON `{"metadata": {"gap_seconds": G}, "data": [n0, n1, ...]}`. None = the built-in trace.
    # `bundled:traces/<file>` names one shipped with the package (rlboost/contracts/data/traces).
    trace: LaxPath | None = None
    # Trace seconds that pass per wall-clock second.
    time_scale: Annotated[float, Field(gt=0, le=100_000)] = 60.0
    # Preemption notice lead time, in wall seconds; 0 = killed without notice.
    notice_seconds: Seconds = 1.0
    # Fraction of preemptions that come with a notice (the rest are abrupt SIGKILLs).
    notice_fraction: Annotated[float, Field(ge=0, le=1)] = 0.5
    # Scale the trace's node counts down to this machine (e.g. 32 nodes -> 3 workers).
    capacity_scale: Annotated[float, Field(gt=0, le=1000)] = 1.0
    # Optional SkyPilot-style catalog CSV for prices (vms.csv columns); `bundled:aws_vms.csv` or
    # `bundled:gcp_vms.csv` names the one shipped with the package.
    catalog: LaxPath | None = None
