"""Fleet events while a job runs (issue 40): a preemption notice, a preemption, responses migrated and a
fleet resize each print one line on the attached console and in controller.log (what `logs -f`
follows), not only a counter on the progress bar. A detached controller's console is that log: once."""

from __future__ import annotations

import io
import os

from rich.console import Console

from rlboost.cli.detach import controller_log
from rlboost.cli.event_lines import EventLines
from rlboost.cli.state import StateStore
from rlboost.providers.base import InstanceEvent, InstanceKind, InstanceState, LaunchRequest, Owner, Role
from rlboost.rollout.policies.reconcile import CandidateBackoff
from tests.test_job_envs import sky_controller_that_fails_to_launch


def test_a_line_goes_to_the_console_and_the_log_once(tmp_path):
    log = tmp_path / "controller.log"
    out = io.StringIO()
    with open(os.devnull, "w") as tty:  # an attached controller: its stdout is not the log
        EventLines(Console(file=out, width=200), log, stdout_fd=tty.fileno, clock=lambda: 0.0).say("preempted: w1")
    assert "preempted: w1" in out.getvalue()
    assert log.read_text().endswith("] preempted: w1\n")
    assert oct(log.stat().st_mode & 0o777) == oct(0o600)
    # a detached controller: stdout is controller.log, and the console line is the log line
    with open(log, "a") as same:
        detached = EventLines(Console(file=same, width=200), log, stdout_fd=same.fileno)
        detached.say("fleet: 2 -> 1 spot worker (cost)")
    assert log.read_text().count("fleet: 2 -> 1 spot worker") == 1


def test_the_controller_prints_each_preemption_and_migration(tmp_path):
    store = StateStore(tmp_path / "state.db")
    out = io.StringIO()
    ctl, provider, job_id = sky_controller_that_fails_to_launch(tmp_path, store, "events", out)
    try:
        iid = "events-1-w001"
        req = LaunchRequest(iid, Owner("events", 1), Role.WORKER, InstanceKind.SPOT, "skypilot", "us-east-1", "A100", 1)
        store.record_launch(job_id, req, "skypilot", 3.0)
        ctl.worker_offer[iid] = "an-offer"  # the job asks for no spot worker: one as if it had launched
        ctl.backoff["an-offer"] = CandidateBackoff()
        events = [
            InstanceEvent(iid, InstanceState.RUNNING, 1.0),
            InstanceEvent(iid, InstanceState.NOTICE, 2.0, "spot interruption notice"),
            InstanceEvent(iid, InstanceState.PREEMPTED, 3.0, "reclaimed"),
        ]
        real_poll = provider.poll
        provider.poll = lambda: [events.pop(0)] if events else []  # type: ignore[method-assign]
        for _ in range(3):
            ctl._apply_events()
        provider.poll = real_poll  # type: ignore[method-assign]  # the failing trainer launch, reported
        for migrated in (0, 0, 3, 3, 4):  # the trainer's running count, poll after poll
            ctl.events.migrated(migrated)
        assert ctl.run() == "failed"
    finally:
        store.close()
    lines = [ln for ln in controller_log(ctl.run_dir).read_text().splitlines() if "] " in ln]
    said = [ln.split("] ", 1)[1] for ln in lines]
    assert said[:4] == [
        f"preemption notice: spot worker {iid} (spot interruption notice)",
        f"preempted: spot worker {iid} (reclaimed)",
        "migrated: 3 partial responses continued on other engines (3 in all)",
        "migrated: 1 partial response continued on other engines (4 in all)",
    ], said
    console = out.getvalue()
    assert f"preempted: spot worker {iid} (reclaimed)" in console and "migrated: 1 partial response" in console
