"""Operating a job like a service: detached runs, signals, job ids, rm/gc, liveness, logs, step numbers.

Every job here is a real local job (real trainer and worker processes). Tests force the event
(a signal, `down`, a hang-up) and then wait on state (the job row, the process table) with a
generous deadline; none sleeps for an outcome.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from rlboost.cli.pids import controller_identity
from rlboost.cli.reconcile import controller_alive
from rlboost.cli.state import StateStore, StepMetrics
from rlboost.providers.base import InstanceKind, LaunchRequest, Owner, Role
from tests.chaos import job_step, wait_until_step
from tests.conftest import ROOT, rlboost_pids, run_cli, run_json

pytestmark = pytest.mark.integration

PY = sys.executable


def job_file(tmp: Path, name: str, steps: int = 100_000, max_workers: int = 1) -> Path:
    job = {
        "name": name,
        "provider": "local",
        "algorithm": {"steps": steps, "prompts_per_step": 4, "group_size": 2, "warm_start_steps": 5},
        "trainer": {"cloud": "local", "accelerators": "A100:8", "hourly_price": 32.77},
        "rollout": {
            "max_workers": max_workers,
            "candidates": [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.44, "on_demand_price": 3.67}],
        },
        "local": {"time_scale": 60, "notice_fraction": 0.0},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def wait_for(pred: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.05)


class Lines:
    """A subprocess's stdout, line by line, each wait bounded (a silent process fails the test, not hangs it)."""

    def __init__(self, pipe) -> None:
        self.q: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=lambda: [self.q.put(ln) for ln in pipe], daemon=True)
        self.reader.start()

    def rest(self, timeout_s: float = 60) -> str:
        """Everything after the lines already taken, once the process has closed its stdout."""
        self.reader.join(timeout_s)
        assert not self.reader.is_alive(), "stdout still open"
        out = []
        while not self.q.empty():
            out.append(self.q.get())
        return "".join(out)

    def next(self, timeout_s: float = 60) -> str:
        try:
            return self.q.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout_s}s") from None


def terminal_signals() -> None:
    """preexec_fn: SIGHUP and SIGINT as in a terminal's session. A process started in the background
    (`nohup`, `cmd &` in a script, some CI runners) inherits them ignored, and Python then never turns
    SIGINT into KeyboardInterrupt: these tests stand in for a user at a terminal."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def attached_launch(jf: Path, home: Path, out: Path, preexec: Callable[[], None]) -> subprocess.Popen:
    """`rlboost launch JOB` in the foreground of a stand-in terminal (output to `out`)."""
    with open(out, "wb") as f:
        return subprocess.Popen(
            [PY, "-m", "rlboost.cli.main", "launch", str(jf)],
            env=env(home),
            cwd=ROOT,
            stdout=f,
            stderr=f,
            preexec_fn=preexec,
        )


def env(home: Path) -> dict[str, str]:
    return {**os.environ, "RLBOOST_HOME": str(home), "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}


def job_row(home: Path, ref: str | int):
    store = StateStore(home / "state.db")
    try:
        return store.job_by_id(ref) if isinstance(ref, int) else store.get_job(ref)
    finally:
        store.close()


def assert_job_gone(home: Path, name: str, job_id: int) -> None:
    """No process of the job remains, every instance record is closed, nothing bills any more."""
    marker = f"RLBOOST_INSTANCE_ID={name}-{job_id}-"
    wait_for(lambda: not rlboost_pids(marker), "every instance process of the job to exit", 60)
    job = job_row(home, job_id)
    wait_for(lambda: not controller_alive(job.controller_pid), "the controller to exit", 60)
    assert job.status == "stopped", (job.status, job.error)
    store = StateStore(home / "state.db")
    try:
        insts = store.instances(job_id)
        assert insts, "the job launched nothing"
        # terminal with an end on the billing clock: the ledger cannot grow after this
        assert [(i.id, i.state) for i in insts if not i.terminal or i.ended_clock is None] == []
    finally:
        store.close()


@pytest.fixture
def no_job_left(home):
    """Whatever a failing test left running (a detached job would train on for hours) is stopped."""
    yield
    db = home / "state.db"
    if db.exists():
        store = StateStore(db)
        active = [j for j in store.list_jobs() if j.active]
        store.close()
        if active:
            run_cli("down", "--all", home=home, timeout=300)


# ---- detached runs -----------------------------------------------------------------------------


def test_detached_launch_outlives_its_shell_and_down_stops_it(tmp_path, home, no_job_left):
    name = "ops-detach"
    jf = job_file(tmp_path, name)
    # the launching shell, in a session of its own so that its hang-up can be sent like a terminal's
    shell = subprocess.Popen(
        ["bash", "-c", f"'{PY}' -m rlboost.cli.main launch -d '{jf}' && echo LAUNCHED && exec sleep 600"],
        env=env(home),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=terminal_signals,
    )
    out = ""
    for line in shell.stdout:  # returns at once: the launch prints and exits while the job runs on
        out += line
        if "LAUNCHED" in line:
            break
    m = re.search(r"job id (\d+): controller running in the background \(pid (\d+)\)", out)
    assert m, out
    job_id, pid = int(m.group(1)), int(m.group(2))
    # the commands for it one a line, whole at 80 columns (piped), ready to copy
    assert f"\n  follow: rlboost logs {job_id} -f\n  status: rlboost status {job_id}\n" in out, out
    assert f"\n  stop:   rlboost down {job_id}\n" in out, out
    assert job_row(home, job_id).controller_pid == pid
    assert os.getsid(pid) == pid != os.getsid(shell.pid), "the controller must lead its own session"
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
    run_dir = home / "jobs" / f"{name}-{job_id}"
    assert os.readlink(f"/proc/{pid}/fd/1") == str(run_dir / "controller.log")

    wait_until_step(home, name, 1)
    shell.stdout.close()
    os.killpg(shell.pid, signal.SIGHUP)  # the terminal closes
    shell.wait(timeout=30)
    after = job_step(home, name)
    wait_until_step(home, name, after + 2)  # still training with its shell gone
    assert job_row(home, job_id).status == "running" and controller_alive(pid)

    st = run_json("status", str(job_id), home=home)["jobs"][0]
    assert (st["id"], st["controller_alive"], st["status_text"]) == (job_id, True, "running")

    follower = subprocess.Popen(
        [PY, "-m", "rlboost.cli.main", "logs", str(job_id), "-f", "-n", "5"],
        env=env(home), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines, seen = Lines(follower.stdout), ""
    while f"{name}-{job_id}-trainer | " not in seen:  # the tail is printed; wait until it follows
        seen += lines.next()
    down = run_cli("down", str(job_id), home=home, timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"{name} (id {job_id}): stopped" in down.stdout
    assert_job_gone(home, name, job_id)
    # `logs -f` returns by itself once the job has ended, with the controller's last words
    assert follower.wait(timeout=60) == 0
    ferr = follower.stderr.read()
    fout = seen + lines.rest()
    assert "controller |" in fout and f"{name}-{job_id}-trainer |" in fout
    assert "stopped by `rlboost down`" in fout and "stopped" in ferr
    logs = run_cli("logs", name, "-n", "1000000", home=home, check=True).stdout  # every line, however long it ran
    assert f"controller pid {pid}" in logs  # the detached controller's own log


# ---- an attached launch and its terminal --------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT])
def test_signal_to_attached_launch_stops_the_job_like_down(tmp_path, home, sig, no_job_left):
    name = f"ops-{sig.name.lower()}"
    jf = job_file(tmp_path, name)
    out = tmp_path / "launch.out"
    proc = attached_launch(jf, home, out, terminal_signals)
    try:
        wait_until_step(home, name, 1)
        wait_for(lambda: len(rlboost_pids(f"RLBOOST_INSTANCE_ID={name}-1-w")) > 0, "a spot worker to run")
        proc.send_signal(sig)
        rc = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 1, out.read_text()  # a stopped job is not a success
    assert_job_gone(home, name, 1)
    why = job_row(home, 1).error
    assert ("SIGHUP" in why) if sig == signal.SIGHUP else ("Ctrl-C" in why), why
    # after a hang-up the controller writes to the job's log, not to the terminal that is gone
    said = home / "jobs" / f"{name}-1" / "controller.log" if sig == signal.SIGHUP else out
    assert f"job {name} (id 1): stopped" in said.read_text(errors="replace")


def test_nohup_launch_outlives_its_terminal(tmp_path, home, no_job_left):
    """`nohup rlboost launch` (SIGHUP inherited ignored): the hang-up is ignored and the job trains on."""
    name = "ops-nohup"
    jf = job_file(tmp_path, name)

    def as_nohup() -> None:
        terminal_signals()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    out = tmp_path / "nohup.out"
    proc = attached_launch(jf, home, out, as_nohup)
    try:
        wait_until_step(home, name, 1)
        proc.send_signal(signal.SIGHUP)
        target = job_step(home, name) + 2
        # the launch either stops (wrong) or trains two more steps: whichever comes first
        wait_for(lambda: proc.poll() is not None or job_step(home, name) >= target, "two more steps or an exit", 300)
        assert proc.poll() is None and job_row(home, 1).status == "running", out.read_text()
        down = run_cli("down", name, home=home, timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr
        assert proc.wait(timeout=60) == 1, out.read_text()  # stopped, not a success
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_job_gone(home, name, 1)


# ---- step numbers ------------------------------------------------------------------------------


def test_launch_status_and_steps_table_number_steps_from_one(tmp_path, home):
    name = "ops-steps"
    proc = run_cli("launch", str(job_file(tmp_path, name, steps=3, max_workers=0)), home=home, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    printed = [int(n) for n in re.findall(r"step +(\d+) +reward", proc.stdout)]
    assert printed == [1, 2, 3], proc.stdout
    assert "step 1 " in proc.stdout and "→ step 3 " in proc.stdout
    st = run_json("status", name, home=home)["jobs"][0]
    assert st["step"] == 3 and [s["step"] for s in st["recent_steps"]] == [1, 2, 3]
    assert run_json("cost-report", "1", home=home)["steps"] == 3
    table = run_cli("status", "1", home=home, check=True).stdout
    assert "3/3" in table
    trainer_log = run_cli("logs", "1", home=home, check=True).stdout
    assert "step   3/3" in trainer_log and "checkpoint after step 3" in trainer_log


def test_resume_message_names_the_step_the_trainer_continues_at(tmp_path):
    from rlboost.cli.step_numbers import checkpointed_steps, relaunch_message

    assert checkpointed_steps(tmp_path) is None
    (tmp_path / "checkpoints").mkdir()
    for n in (8, 10):
        (tmp_path / "checkpoints" / f"ckpt-{n:08d}.pt").write_bytes(b"")
    assert checkpointed_steps(tmp_path) == 10
    # the trainer's own words after that checkpoint: "continuing at step 11"
    relaunched = ", relaunched from its last checkpoint"
    assert relaunch_message(10, 10) == "the trainer continues at step 11" + relaunched
    assert relaunch_message(12, 10) == "the trainer continues at step 11 (steps 11-12 run again)" + relaunched
    assert relaunch_message(11, 10) == "the trainer continues at step 11 (step 11 runs again)" + relaunched  # not 11-11


def test_resume_message_claims_no_step_runs_again_before_the_reattach_knows():
    """`launch --resume` speaks before it reattaches: a trainer that outlived its controller carries on
    and runs nothing again (issue 56: "steps 31-31 run again" when nothing was re-run); whichever way
    it goes is said once known."""
    from rlboost.cli.step_numbers import carry_on_message, resume_message

    assert resume_message(31) == "31 step(s) done"
    assert "run" not in resume_message(31)
    said = carry_on_message("j-1-trainer")
    assert said == "trainer j-1-trainer is still running: it carries on where it is, no step runs again"


def test_resume_reapplies_the_launch_options_and_refuses_one_the_job_was_not_launched_with(tmp_path, capsys):
    import typer

    from rlboost.cli.launch_options import LaunchOptions, resume_options
    from rlboost.cli.state import StateStore

    store = StateStore(tmp_path / "state.db")
    recorded = store.create_job("with", "name: with\n", "local")
    store.update_job(recorded, launch_options=LaunchOptions(record_rollouts=True).model_dump_json())
    assert resume_options(store.job_by_id(recorded), False).record_rollouts  # not given again: as launched
    assert resume_options(store.job_by_id(recorded), True).record_rollouts  # given again: it agrees
    before = store.create_job("old", "name: old\n", "local")  # recorded before options were kept
    assert resume_options(store.job_by_id(before), True).record_rollouts
    assert not resume_options(store.job_by_id(before), False).record_rollouts
    without = store.create_job("without", "name: without\n", "local")
    store.update_job(without, launch_options=LaunchOptions().model_dump_json())
    with pytest.raises(typer.Exit) as exc:
        resume_options(store.job_by_id(without), True)
    assert exc.value.exit_code == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "--record-rollouts: job 'without' (id 3) was launched without it" in said
    assert "resume without --record-rollouts, or launch the job anew with it" in said
    store.close()


# ---- job ids, liveness, rm and gc (records only: no processes needed) --------------------------


def _record(store: StateStore, job_id: int, iid: str, role: Role) -> None:
    req = LaunchRequest(
        instance_id=iid, owner=Owner("x", 1, "uid-x"), role=role,
        kind=InstanceKind.ON_DEMAND if role is Role.TRAINER else InstanceKind.SPOT,
        cloud="local", region=None, accelerator=None, hourly_price=1.0,
    )
    store.record_launch(job_id, req, "local", None)


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_ids_newest_first_and_dead_controller_is_shown(home):
    store = StateStore(home / "state.db")
    a = store.create_job("ops-ids", "name: ops-ids\n", "local")
    store.update_job(a, status="succeeded", ended_at=time.time())
    b = store.create_job("ops-ids", "name: ops-ids\n", "local")  # a second run of the same name
    store.update_job(b, status="running", controller_pid=_dead_pid())
    c = store.create_job("ops-live", "name: ops-live\n", "local")
    store.update_job(c, status="running", **controller_identity())
    store.close()

    jobs = run_json("status", home=home)["jobs"]
    assert [j["id"] for j in jobs] == [c, b, a]  # newest first
    dead = next(j for j in jobs if j["id"] == b)
    assert dead["controller_alive"] is False and f"rlboost launch --resume {b}" in dead["status_text"]
    assert next(j for j in jobs if j["id"] == c)["controller_alive"] is True
    assert next(j for j in jobs if j["id"] == a)["controller_alive"] is None  # ended: no controller to have

    table = run_cli("status", home=home, check=True).stdout
    assert "controller dead" in table and f"rlboost launch --resume {b}" in table
    # a name means its newest run; an id (or #id) means that run, old ones included
    assert run_json("status", "ops-ids", home=home)["jobs"][0]["id"] == b
    assert run_json("status", str(a), home=home)["jobs"][0]["status"] == "succeeded"
    assert run_json("status", f"#{a}", home=home)["jobs"][0]["id"] == a
    assert run_json("cost-report", str(a), home=home)["job_id"] == a
    missing = run_cli("status", "999", home=home)
    assert missing.returncode == 1 and "no job with id 999" in missing.stderr
    # launch --resume takes an id too: this one finished, that one's controller is alive
    done = run_cli("launch", "--resume", str(a), home=home)
    assert done.returncode == 2 and "already succeeded" in done.stderr
    busy = run_cli("launch", "--resume", str(c), home=home)
    assert busy.returncode == 1 and "ops-live" in busy.stderr and "still running" in busy.stderr
    assert "no job with id 999" in run_cli("launch", "--resume", "999", home=home).stderr


def test_rm_refuses_an_active_job_and_removes_an_ended_one(home):
    store = StateStore(home / "state.db")
    old = store.create_job("ops-rm", "name: ops-rm\n", "local")
    _record(store, old, "ops-rm-1-trainer", Role.TRAINER)
    store.update_instance("ops-rm-1-trainer", "terminated", 10.0)
    store.record_step(old, StepMetrics(1, 1, 0.5, 10, 8, 0, 1.0, 5.0))
    store.update_job(old, status="stopped", ended_at=time.time())
    live = store.create_job("ops-rm", "name: ops-rm\n", "local")
    store.update_job(live, status="running", **controller_identity())
    store.close()
    run_dir = home / "jobs" / f"ops-rm-{old}"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.yaml").write_text("name: ops-rm\n")

    refused = run_cli("rm", "ops-rm", home=home)  # the name means the newest run: the active one
    assert refused.returncode == 1 and "is running" in refused.stderr and f"rlboost down {live}" in refused.stderr
    unasked = run_cli("rm", str(old), home=home)  # stdin is not a terminal: nobody to ask
    assert unasked.returncode == 2 and "pass --yes" in unasked.stderr and run_dir.exists()
    assert run_cli("rm", str(old), "--yes", home=home, check=True).stdout.strip() == f"removed job ops-rm (id {old})"
    assert not run_dir.exists()
    assert "no job with id" in run_cli("status", str(old), home=home).stderr
    assert [j["id"] for j in run_json("status", home=home)["jobs"]] == [live]


def test_gc_older_than_removes_only_old_ended_jobs(home):
    month_ago = time.time() - 30 * 86400
    store = StateStore(home / "state.db", now=lambda: month_ago)
    ids = {}
    for name, ended_ago in (("ops-ancient", 8 * 86400), ("ops-recent", 3600)):
        ids[name] = store.create_job(name, f"name: {name}\n", "local")
        store.update_job(ids[name], status="succeeded", ended_at=time.time() - ended_ago)
    # created a month ago but still active (its controller is this process): never removed
    ids["ops-active"] = store.create_job("ops-active", "name: ops-active\n", "local")
    store.update_job(ids["ops-active"], status="running", **controller_identity())
    store.close()
    bad = run_cli("gc", "--older-than", "soon", home=home)
    assert bad.returncode == 2 and "7d" in bad.stderr
    unasked = run_cli("gc", "--older-than", "7d", home=home)  # stdin is not a terminal: nobody to ask
    assert unasked.returncode == 2 and "pass --yes" in unasked.stderr
    assert {j["name"] for j in run_json("status", home=home)["jobs"]} == {"ops-ancient", "ops-recent", "ops-active"}
    out = run_cli("gc", "--older-than", "7d", "-y", home=home, check=True).stdout
    assert f"removed 1 ended job(s) older than 7d: ops-ancient (id {ids['ops-ancient']})" in out
    left = {j["name"] for j in run_json("status", home=home)["jobs"]}
    assert left == {"ops-recent", "ops-active"}


# ---- logs and markup ---------------------------------------------------------------------------


def test_logs_show_controller_and_every_trainer_filter_access_lines_and_never_parse_markup(home):
    store = StateStore(home / "state.db")
    jid = store.create_job("ops-logs", "name: ops-logs\n", "local")
    for iid, role in (("ops-logs-1-trainer", Role.TRAINER), ("ops-logs-1-w001", Role.WORKER),
                      ("ops-logs-1-trainer-r1", Role.TRAINER)):
        _record(store, jid, iid, role)
        store.update_instance(iid, "terminated", 1.0)
    store.update_job(jid, status="failed", ended_at=time.time())
    store.close()
    run_dir = home / "jobs" / f"ops-logs-{jid}"
    logs = {
        "controller.log": "controller says [bold]hi[/bold]\n",
        "instances/ops-logs-1-trainer/log": "first trainer [/]\n"
        '2026 aiohttp.access INFO 127.0.0.1 "GET /v1/status HTTP/1.1" 200\n',
        "instances/ops-logs-1-trainer-r1/log": "restarted trainer [red]\n",
        "instances/ops-logs-1-w001/log": "worker line [local]\n",
    }
    for rel, text in logs.items():
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / rel).write_text(text)

    out = run_cli("logs", "ops-logs", home=home, check=True).stdout
    for needle in ("controller says [bold]hi[/bold]", "first trainer [/]", "restarted trainer [red]"):
        assert needle in out, out
    assert out.index("first trainer") < out.index("restarted trainer")
    assert "aiohttp.access" not in out and "worker line" not in out
    assert "aiohttp.access" in run_cli("logs", str(jid), "--all", home=home, check=True).stdout
    one = run_cli("logs", str(jid), "--instance", "ops-logs-1-w001", home=home, check=True).stdout
    assert one == "worker line [local]\n"
    # the job has ended: following prints what there is and returns
    followed = run_cli("logs", str(jid), "-f", home=home, timeout=60, check=True)
    assert "restarted trainer [red]" in followed.stdout and "failed" in followed.stderr
    bad = run_cli("logs", str(jid), "--instance", "nope", home=home)
    assert bad.returncode == 1 and "ops-logs-1-w001" in bad.stderr


def test_error_messages_print_brackets(tmp_path, home):
    missing = tmp_path / "[local]" / "job.yaml"
    proc = run_cli("launch", str(missing), home=home)
    assert proc.returncode == 2 and "[local]" in proc.stderr, proc.stderr
    assert "MarkupError" not in proc.stderr



def test_logs_follow_picks_up_a_restarted_trainer_and_returns_when_the_job_ends(home):
    controller = subprocess.Popen(["sleep", "600"])  # stands in for a live controller process
    try:
        store = StateStore(home / "state.db")
        jid = store.create_job("ops-follow", "name: ops-follow\n", "local")
        store.update_job(jid, status="running", **controller_identity(controller.pid))
        _record(store, jid, "ops-follow-1-trainer", Role.TRAINER)
        run_dir = home / "jobs" / f"ops-follow-{jid}"
        first = run_dir / "instances" / "ops-follow-1-trainer" / "log"
        first.parent.mkdir(parents=True)
        first.write_text("old line\n")
        follower = subprocess.Popen(
            [PY, "-m", "rlboost.cli.main", "logs", str(jid), "-f"],
            env=env(home), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        lines = Lines(follower.stdout)
        assert lines.next() == "old line\n"  # the tail, then it follows
        with open(first, "a") as f:
            f.write("trainer lost [sic]\n")
        assert lines.next() == "ops-follow-1-trainer | trainer lost [sic]\n"
        # the trainer is relaunched: its log appears after following began, and is followed from its start
        _record(store, jid, "ops-follow-1-trainer-r1", Role.TRAINER)
        second = run_dir / "instances" / "ops-follow-1-trainer-r1" / "log"
        second.parent.mkdir(parents=True)
        second.write_text("resumed from ckpt-00000004.pt: continuing at step 5\n")
        assert lines.next() == "ops-follow-1-trainer-r1 | resumed from ckpt-00000004.pt: continuing at step 5\n"
        store.update_job(jid, status="succeeded", ended_at=time.time())
        store.close()
        controller.kill()
        controller.wait()
        assert follower.wait(timeout=60) == 0
        assert lines.rest() == "" and "succeeded" in follower.stderr.read()
    finally:
        controller.kill()
        controller.wait()
