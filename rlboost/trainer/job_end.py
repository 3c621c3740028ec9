"""What ends a job from inside the trainer, rather than crashing it (a crash is relaunched from the
last checkpoint): the trainer says why in its status (phase failed) and the controller fails the job."""

from __future__ import annotations

from rlboost.contracts.disk_full import full_disk_error
from rlboost.contracts.rewards import RewardBudgetExceeded


def ends_the_job(e: BaseException) -> str | None:
    """Why `e` ends the job (None: a crash, the trainer is relaunched from its last checkpoint). A
    full disk anywhere in the trainer (a checkpoint, a record, metrics) would only fill again."""
    if isinstance(e, RewardBudgetExceeded):
        return str(e)
    if (full := full_disk_error(e)) is None:
        return None
    where = f" writing {full.filename}" if full.filename else ""
    return (
        f"disk full on the trainer{where} ({full.strerror}): free space there, then continue the job "
        "with `rlboost launch --resume`"
    )
