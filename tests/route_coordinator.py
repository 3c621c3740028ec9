"""A coordinator with no engines and no step: what tests of the trainer's HTTP routes (status, metrics,
the token check) put behind `build_app`."""

from __future__ import annotations

from rlboost.rollout.live import CoordinatorConfig, LiveCoordinator


def idle_coordinator() -> LiveCoordinator:
    return LiveCoordinator(
        CoordinatorConfig(
            job_seed=0, temperature=1.0, chunk_tokens=4, heartbeat_s=0.5, heartbeat_timeout_s=3,
            weights_url="", model={}, engine_dtype="float32", engine_batch=4, eos_id=2,
        )
    )
