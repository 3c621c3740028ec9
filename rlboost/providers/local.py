"""The embedded local provider: every instance is a real local process; spot capacity is a replayed trace.

Billing time is trace time: `time_scale` trace seconds pass per wall second, so a few minutes on a
laptop exercise hours of a real spot market. When the trace's capacity drops below the number of
live spot workers, victims get a notice file (the worker's stand-in for a cloud metadata notice)
and are SIGKILLed `notice_seconds` later - or at once, for preemptions without notice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlboost.contracts.env_names import Env
from rlboost.contracts.heartbeat import last_beat
from rlboost.contracts.mounts import copy_mounts
from rlboost.contracts.provider_kinds import provider_kind
from rlboost.providers.base import (
    CapacityError,
    InstanceEvent,
    InstanceKind,
    InstanceState,
    LaunchRequest,
    Owner,
    ProviderError,
    Role,
    Tagged,
    instance_name_re,
)
from rlboost.providers.bootstrap import notice_env
from rlboost.providers.spot_market import SpotMarket

if TYPE_CHECKING:
    from rlboost.contracts.spec import JobSpec


class LocalProvider:
    name = "local"
    kind = provider_kind("local")

    @classmethod
    def setup_problems(cls) -> list[str]:
        return []  # nothing beyond its clouds' credentials, which preflight checks

    @classmethod
    def boot_data_problems(cls, requests: list[LaunchRequest], saved: str) -> list[str]:
        return []  # its processes get their variables and files here, not as boot data

    @classmethod
    def for_job(cls, spec: JobSpec, run_dir: Path, *, owner: Owner, market: Any = None) -> LocalProvider:
        """`market`: the spot market to replay (default: the built-in trace, no notices)."""
        from rlboost.providers.spot_market import BUILTIN_TRACE

        market = market or SpotMarket(BUILTIN_TRACE, notice_fraction=0, seed=0)
        loc = spec.local
        return cls(run_dir, market, time_scale=loc.time_scale, notice_seconds=loc.notice_seconds, owner=owner)

    def __init__(
        self,
        run_dir: Path,
        market: SpotMarket,
        *,
        time_scale: float = 60.0,
        notice_seconds: float = 1.0,
        term_grace_s: float = 3.0,
        owner: Owner | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.owner = owner  # the run dir's job (one job a run dir): what list_tagged reports
        self.market = market
        self.time_scale = time_scale
        self.notice_seconds = notice_seconds
        self.term_grace_s = term_grace_s
        (run_dir / "instances").mkdir(parents=True, exist_ok=True)
        # The market clock survives a controller restart: its origin is kept on disk.
        t0_file = run_dir / "market-t0"
        if t0_file.exists():
            self.t0 = float(t0_file.read_text())
        else:
            self.t0 = time.time()
            t0_file.write_text(repr(self.t0))
        self.procs: dict[str, subprocess.Popen] = {}
        self.reqs: dict[str, LaunchRequest] = {}
        self.victims: dict[str, float | None] = {}  # id -> wall time of the kill (None: already killed)
        self.terminating: set[str] = set()
        self.announced: set[str] = set()  # trainers whose endpoint was reported
        self.events: list[InstanceEvent] = []

    # ---- Provider protocol -------------------------------------------------------------
    def clock(self) -> float:
        return (time.time() - self.t0) * self.time_scale

    def launch(self, req: LaunchRequest) -> str:
        if not req.command:
            raise ProviderError(f"{req.instance_id}: nothing to run (empty command)")
        if req.kind is InstanceKind.SPOT:
            cap = self.market.capacity(self.clock())
            live = len(self._live_spot())
            if live >= cap:
                raise CapacityError(
                    f"no local spot capacity at trace t={self.clock():.0f}s ({cap} available, {live} in use)"
                )
        idir = self._dir(req.instance_id)
        idir.mkdir(parents=True, exist_ok=True)
        try:  # the instance directory stands in for the node: file_mounts and workdir are copied there
            copy_mounts(idir, req.file_mounts, req.workdir)
        except (OSError, ValueError) as e:
            raise ProviderError(f"{req.instance_id}: could not copy file_mounts/workdir ({e})") from e
        env = {
            **os.environ,
            **req.user_envs,
            **req.user_secrets,
            **req.env,
            Env.INSTANCE_ID: req.instance_id,
            Env.RUN_DIR: str(idir),
            Env.MOUNT_ROOT: str(idir),
        }
        if req.kind is InstanceKind.SPOT:  # the spot market writes it; the cloud's record names the source
            env[Env.NOTICE_FILE] = str(idir / "notice")
            env.update(notice_env(req))
        with open(idir / "log", "ab") as out:
            proc = subprocess.Popen(
                req.command,
                env=env,
                cwd=idir / "workdir" if req.workdir else idir,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # own process group: one killpg takes the whole node
            )
        (idir / "pid").write_text(str(proc.pid))
        self.procs[req.instance_id] = proc
        self.reqs[req.instance_id] = req
        state = InstanceState.PENDING if req.role is Role.TRAINER else InstanceState.RUNNING
        self._emit(req.instance_id, state, f"pid {proc.pid}")
        return f"pid {proc.pid}"

    def poll(self) -> list[InstanceEvent]:
        now = time.time()
        for iid, proc in list(self.procs.items()):
            code = proc.poll()
            if code is not None:
                del self.procs[iid]
                if iid in self.victims:
                    self._emit(iid, InstanceState.PREEMPTED, "capacity reclaimed by the spot market")
                elif iid in self.terminating:
                    self._emit(iid, InstanceState.TERMINATED, "terminated")
                else:
                    self._emit(iid, InstanceState.EXITED, f"exit code {code}")
                continue
            if self.reqs[iid].role is Role.TRAINER and iid not in self.announced:
                ep = self._dir(iid) / "endpoint"
                if ep.exists():
                    self.announced.add(iid)
                    self._emit(iid, InstanceState.RUNNING, "serving", endpoint=ep.read_text().strip())
        for iid, when in list(self.victims.items()):
            if when is not None and now >= when:
                self.victims[iid] = None
                self._kill(iid, signal.SIGKILL)
        self._replay_market()
        out, self.events = self.events, []
        return out

    def terminate(self, instance_id: str) -> None:
        pid = self._pid(instance_id)
        if pid is None:
            self._kill_stragglers(instance_id)
            return
        self.terminating.add(instance_id)
        self._kill(instance_id, signal.SIGTERM)
        deadline = time.time() + self.term_grace_s
        while time.time() < deadline and pid_alive(pid):
            self._reap(instance_id)
            time.sleep(0.05)
        if pid_alive(pid):
            self._kill(instance_id, signal.SIGKILL)
            while pid_alive(pid) and time.time() < deadline + 5:
                self._reap(instance_id)
                time.sleep(0.05)
        self._reap(instance_id)
        self.procs.pop(instance_id, None)
        state = InstanceState.PREEMPTED if instance_id in self.victims else InstanceState.TERMINATED
        self._emit(instance_id, state, "terminated")

    def list_owned(self, owner: Owner) -> list[str]:
        # a run dir is one job's (of one store), and a process carries no tags: the names rlboost
        # gives that job's instances (its store job id included) are its instances
        names = instance_name_re(owner.name, owner.job_id)
        return sorted(i for i in self._live() if names.match(i))

    def list_tagged(self) -> list[Tagged]:
        """What lives in this run dir: one job's instances (no other store's can be here)."""
        o = self.owner
        return [Tagged(i, o.name if o else None, o.uid if o else None, o.store if o else None) for i in self._live()]

    def exit_clock(self, instance_id: str) -> float | None:
        """A node process beats a file in its directory every second (rlboost/contracts/heartbeat.py): gone, it
        stopped within a second of its last beat."""
        if self._pid(instance_id) is not None:
            return None
        beat = last_beat(self._dir(instance_id))
        return None if beat is None else (beat - self.t0) * self.time_scale

    def _live(self) -> set[str]:
        out = set(self._stragglers())  # also processes whose pid file was never written
        for pid_file in sorted((self.run_dir / "instances").glob("*/pid")):
            iid = pid_file.parent.name
            if self._pid(iid) is not None:
                out.add(iid)
        return out

    def adopt(self, req: LaunchRequest) -> bool:
        pid = self._pid(req.instance_id)
        if pid is None:
            return False
        self.procs[req.instance_id] = _Adopted(pid)  # type: ignore[assignment]
        self.reqs[req.instance_id] = req
        return True

    def close(self) -> None:
        pass

    # ---- the market --------------------------------------------------------------------
    def _live_spot(self) -> list[str]:
        return [i for i in self.procs if self.reqs[i].kind is InstanceKind.SPOT and i not in self.victims]

    def _replay_market(self) -> None:
        running = self._live_spot()
        if not running:
            return
        for iid, with_notice in self.market.choose_victims(self.clock(), running):
            if with_notice and self.notice_seconds > 0:
                (self._dir(iid) / "notice").write_text(repr(time.time() + self.notice_seconds))
                self.victims[iid] = time.time() + self.notice_seconds
                self._emit(iid, InstanceState.NOTICE, f"preemption notice, {self.notice_seconds:g}s lead")
            else:
                self.victims[iid] = None
                self._kill(iid, signal.SIGKILL)  # reported as preempted once its exit is seen

    # ---- process plumbing --------------------------------------------------------------
    def _dir(self, iid: str) -> Path:
        return self.run_dir / "instances" / iid

    def _pid(self, iid: str) -> int | None:
        """The live pid of an instance, also after a controller restart (checked against its env)."""
        proc = self.procs.get(iid)
        if proc is not None:
            return proc.pid if proc.poll() is None else None
        pid_file = self._dir(iid) / "pid"
        if not pid_file.exists():
            return None
        pid = int(pid_file.read_text())
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return None
        return pid if f"{Env.INSTANCE_ID}={iid}".encode() in environ.split(b"\0") else None

    def _stragglers(self) -> dict[str, list[int]]:
        """Live processes of this run dir's instances, found by their environment: covers a controller
        killed between spawning a node and writing its pid file, and children of a dead leader."""
        prefix = f"{Env.RUN_DIR}={self.run_dir / 'instances'}/".encode()
        found: dict[str, list[int]] = {}
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                env = (p / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            for var in env:
                if var.startswith(prefix) and pid_alive(int(p.name)):
                    found.setdefault(var[len(prefix) :].decode(errors="replace"), []).append(int(p.name))
        return found

    def _kill_stragglers(self, iid: str) -> None:
        pids = self._stragglers().get(iid, [])
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 5
        while any(pid_alive(p) for p in pids) and time.time() < deadline:
            time.sleep(0.05)
        if pids:
            self._emit(iid, InstanceState.TERMINATED, f"killed {len(pids)} leftover process(es)")

    def _kill(self, iid: str, sig: signal.Signals) -> None:
        pid = self._pid(iid)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)

    def _reap(self, iid: str) -> None:
        proc = self.procs.get(iid)
        if proc is not None:
            proc.poll()

    def _emit(self, iid: str, state: InstanceState, detail: str = "", endpoint: str | None = None) -> None:
        self.events.append(InstanceEvent(iid, state, self.clock(), detail, endpoint))


class _Adopted:
    """A process an earlier controller started: not our child, so watched by pid (the env check in
    LocalProvider._pid guards against pid reuse when it is looked up)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not pid_alive(self.pid):
            self.returncode = -9  # its real status went to its dead parent
        return self.returncode


def pid_alive(pid: int) -> bool:
    """Is process `pid` there? A zombie (exited, not yet reaped) is not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True  # no /proc (macOS): kill(0) said it exists; on Linux, gone by the next poll
