"""The trainer's status document is one model (rlboost/contracts/status.py): what a real TrainerRuntime serves
validates, and a document with a field missing, renamed or of the wrong type is refused by name."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rlboost.contracts.spec import AlgorithmSpec, JobSpec, TaskSpec
from rlboost.contracts.status import TrainerStatus, WorkerStatus


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict:
    from rlboost.trainer.runtime import TrainerRuntime

    spec = JobSpec(
        name="st",
        algorithm=AlgorithmSpec(max_new_tokens=8, steps=2, warm_start_steps=0),
        task=TaskSpec(name="reverse", min_len=3, max_len=4),
        rollout={"max_workers": 0},
    )
    return TrainerRuntime(spec, "token", tmp_path_factory.mktemp("st")).status()


def test_the_runtime_serves_the_model(served: dict) -> None:
    doc = TrainerStatus.model_validate(served)
    assert doc.phase == "starting" and doc.version == -1 and doc.workers == [] and doc.steps == 2
    assert TrainerStatus.model_validate(doc.model_dump(mode="json")) == doc


def test_every_engine_the_coordinator_knows_fits_the_model() -> None:
    """An engine as it connects (no weights yet, nothing measured) and one at work."""
    from rlboost.rollout import scheduling
    from rlboost.rollout.live import LiveCoordinator
    from rlboost.rollout.live_pool import EngineConn

    spec = JobSpec(name="st", rollout={"max_workers": 0})
    coord = LiveCoordinator(scheduling.coordinator_config(spec, eos_id=2))
    coord.engines["new"] = EngineConn("new", "spot", "torch", 8, ws=None)  # type: ignore[arg-type]
    coord.engines["busy"] = EngineConn("busy", "reserved", "torch", 8, None, "ready", 3, tokens=40)  # type: ignore[arg-type]
    snap = coord.workers_snapshot()
    assert [WorkerStatus.model_validate(w).version for w in snap] == [None, 3]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.pop("tokens_total"), "tokens_total"),
        (lambda d: d.update(tokens=1), "tokens"),
        (lambda d: d.update(step="two"), "step"),
        (lambda d: d.update(workers=[{"worker_id": "w"}]), "workers.0"),
    ],
)
def test_a_wrong_document_is_refused_by_name(served: dict, change, field: str) -> None:
    doc = dict(served)
    change(doc)
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        TrainerStatus.model_validate(doc)
