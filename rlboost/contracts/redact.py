"""Scrubbing secret values out of text (a user's exception message) before it is logged or reported."""

from __future__ import annotations

from collections.abc import Iterable

# shorter values are left alone: they would mangle ordinary words and numbers (as rlboost/cli/job_envs.py)
MIN_SECRET_LEN = 4


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret of at least MIN_SECRET_LEN characters replaced by `***`."""
    # longest first, so a secret that contains another is replaced whole
    for value in sorted({s for s in secrets if s and len(s) >= MIN_SECRET_LEN}, key=len, reverse=True):
        text = text.replace(value, "***")
    return text
