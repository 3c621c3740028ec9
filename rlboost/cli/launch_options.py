"""The `launch` options that change what a job does, kept with the job in the state store, so that
`launch --resume` continues the job as it was launched. (`--set` is in the saved spec, `--env` values
in the run dir; `-d` and `--yes` say how this command runs, not what the job does.)"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

from rlboost.cli.output import fail
from rlboost.cli.state import JobRow


class LaunchOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # a newer rlboost's options are not ours to refuse
    record_rollouts: bool = False


def saved_options(job: JobRow) -> LaunchOptions | None:
    """What the job was launched with (None: a job recorded before options were kept)."""
    if job.launch_options is None:
        return None
    try:
        return LaunchOptions.model_validate_json(job.launch_options)
    except ValidationError:
        return None


def resume_options(job: JobRow, record_rollouts: bool) -> LaunchOptions:
    """The options `launch --resume` runs the job with: those it was launched with. A flag given
    again must agree (a bool flag given means True): a resumed job cannot start recording halfway,
    since its earlier steps' rollouts were never written. A job recorded before options were kept
    takes the flags as given."""
    saved = saved_options(job)
    if saved is None:
        return LaunchOptions(record_rollouts=record_rollouts)
    if record_rollouts and not saved.record_rollouts:
        fail(
            f"--record-rollouts: job {job.name!r} (id {job.id}) was launched without it, and `launch --resume` "
            "continues a job with the options it was launched with (its steps so far have no rollouts "
            "recorded); resume without --record-rollouts, or launch the job anew with it",
            2,
        )
    return saved
