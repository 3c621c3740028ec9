"""The job file's `trainer:` section."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from rlboost.contracts.cloud_kinds import DEFAULT_CLOUD
from rlboost.contracts.spec.base import Price, Strict, check_accelerator
from rlboost.contracts.spec.text_limits import region_problem


class TrainerSpec(Strict):
    """The reserved, on-demand trainer cluster."""

    cloud: str = DEFAULT_CLOUD
    region: str | None = None
    accelerators: str | None = None
    nodes: Annotated[int, Field(ge=1, le=1024)] = 1
    # Price per node-hour. Defaults to the provider's catalog when omitted.
    hourly_price: Price | None = None
    # Training across the cluster's GPUs/nodes when launched under torchrun (rlboost/trainer/distributed.py):
    # ddp = replicated weights, gradients all-reduced; fsdp = weights, gradients and optimizer sharded.
    strategy: Literal["ddp", "fsdp"] = "ddp"
    # TLS on the trainer's port (self-signed per job, pinned by fingerprint in every worker):
    # auto = on unless the trainer binds a loopback address (local jobs), on, off.
    tls: Literal["auto", "on", "off"] = "auto"
    # Checkpoint (model, optimizer, step, data position, RNG) every N steps; also at the end and on a
    # drain (SIGTERM). 0 = only then.
    checkpoint_every: Annotated[int, Field(ge=0, le=1_000_000)] = 10
    # Where the trainer writes checkpoints. Local provider: the job's run dir (always). Clouds: a path
    # on the trainer node; make it durable (a bucket mounted by SkyPilot) to survive losing the node.
    checkpoint_dir: str | None = None
    # Relaunch a lost trainer (it resumes from its last checkpoint) this many times before failing.
    max_restarts: Annotated[int, Field(ge=0, le=1000)] = 3
    # Host memory for past versions' weight deltas (rlboost/weights/delta_chain.py): a worker that many
    # deltas behind gets the latest as one composed delta; further behind, it pulls in full.
    delta_history_mib: Annotated[int, Field(ge=0, le=1 << 20)] = 512

    _acc = field_validator("accelerators")(classmethod(lambda cls, v: check_accelerator(v)))

    @field_validator("region")
    @classmethod
    def _region(cls, v: str | None) -> str | None:
        problem = region_problem(v) if v is not None else None
        if problem:
            raise ValueError(problem)
        return v
