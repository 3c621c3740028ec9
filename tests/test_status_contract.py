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


# ---- step records (rlboost/contracts/step_record.py) ----------------------------------------------

RECORD = {
    "step": 3,
    "version": 3,
    "reward": 0.5,
    "loss": 0.1,
    "responses": 8,
    "tokens": 80,
    "len_max": 12,
    "engines": 2,
    "migrated": 1,
    "reward_errors": 0,
    "step_s": 2.0,
    "gen_s": 1.5,
    "train_s": 0.6,
    "tail_train_s": 0.2,
}


def test_the_coordinators_measurements_of_a_step_fit_the_record() -> None:
    """What the live coordinator's end_step returns (StepTiming) goes onto the step record."""
    import asyncio

    from rlboost.contracts.step_record import StepRecord
    from rlboost.rollout import scheduling
    from rlboost.rollout.live import LiveCoordinator
    from rlboost.trainer.runtime import _TIMING_IN_RECORD

    coord = LiveCoordinator(scheduling.coordinator_config(JobSpec(name="st", rollout={"max_workers": 0}), eos_id=2))
    asyncio.run(coord.run_step(0, 0, []))
    timing = coord.end_step(train_busy_s=0.5, train_tokens=10)
    assert timing is not None and timing.spot_workers == 0 and timing.offload_s is None
    rec = StepRecord(**RECORD, **timing.model_dump(include=_TIMING_IN_RECORD))
    assert rec.timed and rec.trainer_idle_s == timing.trainer_idle_s
    assert coord.end_step() is None  # no step timed: the record says so (rec.timed False)
    assert not StepRecord(**RECORD).timed


def test_a_step_record_an_older_rlboost_wrote_reads_by_todays_names() -> None:
    """A checkpoint (or a still-running trainer) of before the typed record: seconds, box_s, n_remote."""
    from rlboost.contracts.step_record import StepRecord

    old = {k: v for k, v in RECORD.items() if k != "step_s"}
    old |= {"seconds": 2.5, "step_s": 2.4, "box_s": 0.7, "n_remote": 3, "trainer_idle_s": 0.1, "remote_idle_s": 0.0}
    rec = StepRecord.model_validate({**old, "gen_tokens": 90, "spot_tokens": 60, "publish_s": 0.05})
    assert (rec.step_s, rec.offload_s, rec.spot_workers, rec.trainer_idle_s) == (2.5, 0.7, 3, 0.1)


def test_a_step_record_with_a_field_renamed_is_refused_by_name(served: dict) -> None:
    doc = {**served, "history": [{**RECORD, "idle_s": 0.1}]}
    with pytest.raises(ValidationError, match=r"history\.0\.idle_s"):
        TrainerStatus.model_validate(doc)
    assert TrainerStatus.model_validate({**served, "history": [RECORD]}).history[0].step_s == 2.0
