"""Stopping a job with Ctrl-C at a real terminal: however many times it is pressed, the teardown
finishes (a second Ctrl-C says how far it is), or a third gives up waiting and says `rlboost gc`;
the job's end is always recorded.

The CLI runs in a real pseudo-terminal as its session leader and foreground process group, so a
b"\\x03" written to the terminal is the kernel's SIGINT to it, as a user's Ctrl-C. The teardown is
made to last: the spot worker is frozen (SIGSTOP) first, so terminating it takes the provider's whole
grace period, and the next Ctrl-C is sent once the worker has been asked to terminate (SIGTERM
pending on it), i.e. while the teardown is under way, never after a sleep.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest
import yaml

from rlboost.cli.state import StateStore
from rlboost.cli.stopping import Abandon, Phase, Stop, StopSignals
from tests.chaos import signal_groups, wait_until_step
from tests.conftest import ROOT, rlboost_pids, run_cli
from tests.test_operate import assert_job_gone, env, job_row, wait_for

_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][0-9A-B]|\r")


class Terminal:
    """A command in a pseudo-terminal of its own (200 columns), its output collected as it comes."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))

        def session_leader() -> None:  # the terminal's own session: Ctrl-C reaches this process group
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            for s in (signal.SIGINT, signal.SIGHUP):  # a test runner may start us with them ignored
                signal.signal(s, signal.SIG_DFL)

        self.proc = subprocess.Popen(
            args, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT, preexec_fn=session_leader
        )
        os.close(slave)
        self.master = master
        self._out = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every process of the terminal has closed it
                return
            if not chunk:
                return
            with self._lock:
                self._out += chunk

    def text(self) -> str:
        with self._lock:
            return _ANSI.sub(b"", bytes(self._out)).decode(errors="replace")

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def wait_for_text(self, needle: str, timeout_s: float = 60) -> None:
        said = lambda: needle in self.text() or self.proc.poll() is not None  # noqa: E731
        wait_for(said, f"{needle!r} on the terminal", timeout_s)
        assert needle in self.text(), f"{needle!r} not said before exit:\n{self.text()}"

    def close(self) -> str:
        """Everything it said (killed first if it still runs); the terminal is closed once."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self._reader.join(10)
        if self.master >= 0:
            os.close(self.master)
            self.master = -1
        return self.text()


def job_file(tmp: Path, name: str) -> Path:
    """A long local job with one spot worker that the market never takes (capacity 1 throughout)."""
    trace = tmp / "one-node.csv"
    trace.write_text("0,add,node1\n")
    job = {
        "name": name,
        "provider": "local",
        "algorithm": {"steps": 100_000, "prompts_per_step": 4, "group_size": 2, "warm_start_steps": 5},
        "trainer": {"cloud": "local", "accelerators": "A100:8", "hourly_price": 32.77},
        "rollout": {
            "max_workers": 1,
            "candidates": [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.44, "on_demand_price": 3.67}],
        },
        "local": {"time_scale": 60, "notice_fraction": 0.0, "trace": str(trace)},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def sigterm_pending(pid: int) -> bool:
    """Has `pid` been sent SIGTERM that it has not taken yet (it is frozen)?"""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    pending = 0
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            pending |= int(line.split()[1], 16)
    return bool(pending & (1 << (signal.SIGTERM - 1)))


def start_and_freeze_worker(tmp_path: Path, home: Path, name: str) -> tuple[Terminal, int]:
    """The job running in a terminal, one step recorded, its spot worker frozen: (terminal, worker pid)."""
    term = Terminal([sys.executable, "-m", "rlboost.cli.main", "launch", str(job_file(tmp_path, name))], env(home))
    wait_until_step(home, name, 1)
    worker = f"RLBOOST_INSTANCE_ID={name}-1-w001"
    wait_for(lambda: rlboost_pids(worker, exact=True), "the spot worker to run")
    pids = rlboost_pids(worker, exact=True)
    assert signal_groups(pids, signal.SIGSTOP)
    leader = int((home / "jobs" / f"{name}-1" / "instances" / f"{name}-1-w001" / "pid").read_text())
    return term, leader


def stop_while_tearing_down(term: Terminal, worker_pid: int) -> None:
    """Ctrl-C, then a second one as soon as the teardown has asked the frozen worker to terminate."""
    term.ctrl_c()
    wait_for(lambda: sigterm_pending(worker_pid) or term.proc.poll() is not None, "the teardown to begin", 60)
    term.ctrl_c()


def kill_leftovers(name: str) -> None:
    pids = rlboost_pids(f"RLBOOST_INSTANCE_ID={name}-")
    signal_groups(pids, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.faults  # ~25 s: a real job to its first step, then a teardown that waits out a frozen worker
def test_a_second_ctrl_c_during_teardown_finishes_it_and_says_so(tmp_path, home):
    name = "ctrl-c-twice"
    term, worker_pid = start_and_freeze_worker(tmp_path, home, name)
    try:
        stop_while_tearing_down(term, worker_pid)
        term.wait_for_text("still stopping: 2 instance(s) left")
        rc = term.proc.wait(timeout=120)
        out = term.close()
    finally:
        term.close()
        kill_leftovers(name)
    assert rc == 1, out  # a stopped job is not a success
    assert f"stopping job {name} (id 1): terminating 2 instance(s)" in out, out
    assert "Traceback" not in out, out
    assert_job_gone(home, name, 1)  # no process left; stopped; every record closed, nothing bills
    assert "Ctrl-C" in job_row(home, 1).error


@pytest.mark.faults
def test_a_third_ctrl_c_abandons_the_teardown_saying_rlboost_gc_which_finds_what_is_left(tmp_path, home):
    name = "ctrl-c-thrice"
    term, worker_pid = start_and_freeze_worker(tmp_path, home, name)
    try:
        stop_while_tearing_down(term, worker_pid)
        term.wait_for_text("still stopping: 2 instance(s) left")
        term.ctrl_c()
        term.wait_for_text("run `rlboost gc` to terminate them")
        rc = term.proc.wait(timeout=60)
        out = term.close()
        assert rc == 1, out
        assert "Traceback" not in out, out
        job = job_row(home, 1)
        assert job.status == "stopped" and "rlboost gc" in (job.error or ""), (job.status, job.error)
        assert rlboost_pids(f"RLBOOST_INSTANCE_ID={name}-1-trainer"), "the abandoned teardown had not reached it"
        with StateStore(home / "state.db") as store:
            assert {i.id for i in store.live_instances(1)} == {f"{name}-1-trainer", f"{name}-1-w001"}
        gc = run_cli("gc", "--wait", "60", home=home, timeout=180)
        assert gc.returncode == 0, gc.stdout + gc.stderr
        assert f"job {name}: terminated 2 orphan(s)" in gc.stdout, gc.stdout
    finally:
        term.close()
        kill_leftovers(name)
    assert_job_gone(home, name, 1)


# ---- the state machine, signal by signal (no processes) ----------------------------------------


def machine(left: int = 2) -> tuple[StopSignals, list[str], list[str]]:
    said: list[str] = []
    hangups: list[str] = []
    return StopSignals(lambda: left, said.append, lambda: hangups.append("hup")), said, hangups


def test_the_first_signal_stops_and_later_ones_never_raise_before_the_teardown():
    sig, said, _ = machine()
    with pytest.raises(KeyboardInterrupt):
        sig.handle(signal.SIGINT)
    assert (sig.phase, sig.stopped_by) == (Phase.STOPPING, signal.SIGINT)
    # the second Ctrl-C 50 ms later, before the teardown has begun, and a `down`: they only say so
    sig.handle(signal.SIGINT)
    sig.handle(signal.SIGTERM)
    sig.handle(signal.SIGINT)  # a third, still before the teardown: nothing to abandon yet
    assert said[0].startswith("still stopping: 2 instance(s) left (Ctrl-C again")
    assert said[1] == "still stopping: 2 instance(s) left"
    assert len(said) == 3


def test_a_third_ctrl_c_abandons_the_teardown_once_and_the_end_is_never_interrupted():
    sig, said, _ = machine(left=3)
    with pytest.raises(Stop):
        sig.handle(signal.SIGTERM)  # `rlboost down`
    sig.phase = Phase.TEARDOWN
    sig.handle(signal.SIGTERM)  # `down` again: never abandons
    sig.handle(signal.SIGINT)
    sig.handle(signal.SIGINT)
    with pytest.raises(Abandon):
        sig.handle(signal.SIGINT)
    sig.handle(signal.SIGINT)  # once only: the teardown's caller catches exactly one
    sig.phase = Phase.FINISHING
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        sig.handle(s)
    assert said[-1] == "still stopping: recording the job's end" and len(said) == 6
    assert all("3 instance(s) left" in line for line in said[:3])


def test_a_hangup_moves_output_first_and_stops_with_its_reason():
    sig, said, hangups = machine()
    with pytest.raises(Stop, match="SIGHUP"):
        sig.handle(signal.SIGHUP)
    sig.handle(signal.SIGHUP)  # a closing terminal may hang up twice
    assert hangups == ["hup", "hup"] and said == ["still stopping: 2 instance(s) left"]


def test_handlers_are_restored_and_an_inherited_ignore_is_kept():
    sig, _, _ = machine()
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    # the premise set here, not inherited: pytest itself may run with SIGINT ignored (a `&` job of a
    # non-interactive shell ignores it), which `installed` would rightly keep
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # `nohup rlboost launch`
    try:
        with sig.installed():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGINT) == sig.handle == signal.getsignal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) == signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # `rlboost launch ... &` in a script: its Ctrl-C is not ours
        with sig.installed():
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == sig.handle  # SIGTERM (`kill`) always stops it
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        for s, h in before.items():
            signal.signal(s, h)
