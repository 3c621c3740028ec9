"""The job file's `logging:` and `weights:` sections: where metrics go, and how weights travel."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from rlboost.contracts.spec.base import LaxPath, Strict
from rlboost.contracts.transport_names import check_transport


class WandbSpec(Strict):
    """A W&B run per job (rlboost/cli/metrics_sinks.py), written by the job's controller."""

    project: Annotated[str, Field(min_length=1)]
    entity: str | None = None  # your W&B user or team; None = your default entity
    # None = online when WANDB_API_KEY is set where the controller runs, else offline (no network:
    # the run is kept on disk for `wandb sync`)
    mode: Literal["online", "offline", "disabled"] | None = None


class LoggingSpec(Strict):
    """Where each step's metrics go besides metrics.jsonl (`pip install 'rlboost[logging]'`)."""

    # a TensorBoard log directory; relative = relative to the job's run directory
    tensorboard: LaxPath | None = None
    wandb: WandbSpec | None = None


class WeightsSpec(Strict):
    """How workers get each weight version (README: Weight transfer)."""

    # auto: a torch.distributed broadcast (rlboost/weights/transports/torch_broadcast.py: NCCL) when every
    # worker is on a GPU in the trainer's network (same cloud and region, or local), else the HTTP pull;
    # http: always the pull; torch: always the broadcast (gloo without GPUs). A worker the broadcast
    # fails pulls. Or a transport registered from outside (contracts/transport_names.py).
    transport: Annotated[str, AfterValidator(check_transport)] = "auto"
