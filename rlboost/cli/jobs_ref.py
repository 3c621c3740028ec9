"""How a command names a job: its id (`12` or `#12`) or its name (the newest run of that name).

Job names start with a letter (spec.py), so a reference of digits is always an id.
"""

from __future__ import annotations

from rlboost.cli.state import JobRow, StateStore, UnknownJobError


def resolve_job(store: StateStore, ref: str) -> JobRow:
    """The job `ref` names; UnknownJobError (user-facing message) when none does."""
    ref = ref.strip()
    digits = ref[1:] if ref.startswith("#") else ref
    if digits.isdigit():
        try:
            return store.job_by_id(int(digits))
        except UnknownJobError:
            raise UnknownJobError(f"no job with id {digits} (run `rlboost status` to list jobs)") from None
    return store.get_job(ref)

