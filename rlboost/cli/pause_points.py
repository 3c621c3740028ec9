"""Test-only pause points: with RLBOOST_TEST_PAUSE_AT=NAME the controller stops for good at the point
NAME, once it has written `paused-NAME` (its pid) in the job's run dir, so that a fault test kills it
(kill -9) at exactly that point of the job rather than at a moment a sleep hopes for. Unset, as rlboost
always leaves it, a pause point does nothing."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from rlboost.contracts.env_names import Env

# the controller's points (tests/test_faults_recovery.py kills it at each)
TRAINER_LAUNCHED = "trainer-launched"  # the provider launched the trainer; nothing heard from it yet
TRAINER_ENROLLING = "trainer-enrolling"  # the trainer serves its enrolment; nothing delivered yet
TRAINER_ENROLLED = "trainer-enrolled"  # the trainer took its delivery; not seen serving yet


def pause_point(name: str, run_dir: Path) -> None:
    if os.environ.get(Env.TEST_PAUSE_AT) != name:
        return
    marker = run_dir / f"paused-{name}"
    marker.write_text(str(os.getpid()))
    while True:  # until killed; a handled signal (a Ctrl-C, `down`) raises out of here as anywhere else
        signal.pause()
