"""How a running controller answers Ctrl-C, SIGTERM (`rlboost down`) and SIGHUP (its terminal closed).

The first of them stops the job: it is raised into whatever the controller is doing (Ctrl-C as
KeyboardInterrupt, the others as Stop), and from that moment no signal interrupts the teardown that
follows: a signal that arrives while the job stops (a second Ctrl-C 50 ms after the first, a
repeated `down`, a hang-up) only says how far it is. A third Ctrl-C during the teardown gives up
waiting (Abandon, raised into the teardown): the controller then writes the job's end and says what
is left for `rlboost gc`. While it writes the job's end no signal interrupts it at all.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from types import FrameType


class Stop(Exception):
    """Raised by SIGTERM (`rlboost down`) and SIGHUP to unwind the running job into its teardown."""


class Abandon(BaseException):
    """A third Ctrl-C during teardown: stop waiting for the instances to go. A BaseException, like
    KeyboardInterrupt, so no `except Exception` in a provider's or the teardown's code swallows it."""


class Phase(Enum):
    RUNNING = "running"  # the first signal stops the job
    STOPPING = "stopping"  # stopped, teardown not begun yet
    TEARDOWN = "teardown"  # terminating the instances: a third Ctrl-C abandons
    FINISHING = "finishing"  # writing the job's end: nothing interrupts


HANGUP_WHY = "stopped: the launching terminal closed (SIGHUP)"
ABANDON_AT = 3  # the Ctrl-C that abandons the teardown


class StopSignals:
    """The signal handlers of one controller run, and the phase it is in.

    `left()`: how many instances are still live (for "still stopping: N instances left");
    `say(line)`: print a line to the user (never raises); `hung_up()`: the terminal is gone, so
    output must go elsewhere from now on (called once per SIGHUP, before anything is said).
    """

    def __init__(self, left: Callable[[], int], say: Callable[[str], None], hung_up: Callable[[], None]) -> None:
        self.left, self.say, self.hung_up = left, say, hung_up
        self.phase = Phase.RUNNING
        self.interrupts = 0  # Ctrl-Cs seen
        self.abandoned = False
        self.stopped_by: int | None = None  # the signal that stopped the job (None: it ended by itself)

    @contextmanager
    def installed(self) -> Iterator[StopSignals]:
        """Handle SIGINT, SIGTERM and SIGHUP for the body; the previous handlers come back after.
        A signal inherited ignored stays ignored: `nohup rlboost launch` asks to outlive the terminal
        (SIGHUP), a job started in the background of a script is not stopped by its Ctrl-C (SIGINT)."""
        prev = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        for s, h in prev.items():
            if s == signal.SIGTERM or h != signal.SIG_IGN:
                signal.signal(s, self.handle)
        try:
            yield self
        finally:
            for s, h in prev.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)

    def handle(self, signum: int, frame: FrameType | None = None) -> None:
        if signum == signal.SIGHUP:
            self.hung_up()
        if signum == signal.SIGINT:
            self.interrupts += 1
        if self.phase is Phase.RUNNING:
            self.phase, self.stopped_by = Phase.STOPPING, signum
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Stop(HANGUP_WHY if signum == signal.SIGHUP else "")
        if self.phase is Phase.FINISHING:
            self.say("still stopping: recording the job's end")
            return
        if signum == signal.SIGINT and self.interrupts >= ABANDON_AT and self.phase is Phase.TEARDOWN:
            if not self.abandoned:  # once: the teardown's caller catches exactly one
                self.abandoned = True
                raise Abandon
            return
        hint = " (Ctrl-C again stops waiting; `rlboost gc` then terminates what is left)"
        self.say(f"still stopping: {self.count_left()} instance(s) left" + (hint if signum == signal.SIGINT else ""))

    def count_left(self) -> str:
        """How many instances are left, as said ("some" when the store cannot tell)."""
        with contextlib.suppress(Exception):
            return str(self.left())
        return "some"
