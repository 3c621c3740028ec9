"""The job controller: launch the trainer, keep the desired spot workers alive, record every dollar.

Runs in the `rlboost launch` process. Every launch is written to the state store before the provider
is asked, and every state change the provider reports is written as it arrives, so the ledger is
derived from durable records and a crash never leaves a paid instance untracked.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import httpx
from rich.console import Console

from rlboost.cli.detach import controller_log
from rlboost.cli.disk import disk_full, no_room, release_room, reserve_room
from rlboost.cli.enrolment import TrainerEnrolment, TrainerEnrolmentError, pin_file, worker_credential
from rlboost.cli.event_lines import EventLines
from rlboost.cli.job_envs import Redactor, split_envs
from rlboost.cli.launch_requests import node_files, recorded_request, trainer_command, trainer_request, worker_request
from rlboost.cli.ledger import spent_dollars
from rlboost.cli.metrics_log import METRICS_FILE, MetricsLog
from rlboost.cli.metrics_sinks import open_sinks
from rlboost.cli.pause_points import TRAINER_ENROLLED, TRAINER_ENROLLING, TRAINER_LAUNCHED, pause_point
from rlboost.cli.pids import controller_tag
from rlboost.cli.progress import JobProgress
from rlboost.cli.state import InstanceRow, StateStore, UnknownInstanceError
from rlboost.cli.step_numbers import carry_on_message, checkpointed_steps, relaunch_message, shown
from rlboost.cli.step_recording import StepRecorder
from rlboost.cli.stopping import Abandon, Phase, Stop, StopSignals
from rlboost.cli.warnings_log import WarningsToLog
from rlboost.contracts.enrolment import Grant
from rlboost.contracts.env_names import Env
from rlboost.contracts.spec import JobSpec
from rlboost.contracts.status import TrainerStatus
from rlboost.contracts.step_record import StepRecord
from rlboost.contracts.tls import client_context, https_url
from rlboost.contracts.wording import spot_workers
from rlboost.providers.base import CapacityError, InstanceState, LaunchRequest, Owner, Provider, ProviderError, Role
from rlboost.providers.pricing import Offer
from rlboost.rollout.policies.fleet import StepSample, surplus
from rlboost.rollout.policies.reconcile import BACKOFF_CAP_S, CandidateBackoff, reconcile_fleet
from rlboost.rollout.scheduling import FleetClock


@dataclass
class Controller:
    spec: JobSpec
    store: StateStore
    job_id: int
    run_dir: Path
    provider: Provider
    token: str
    trainer_offer: Offer
    spot_offers: list[Offer]
    console: Console = field(default_factory=Console)
    record_rollouts: bool = False
    trainer_boot_timeout_s: float = 300.0
    poll_s: float = 0.25
    backoff_cap_s: float = BACKOFF_CAP_S  # a candidate that keeps failing cools down up to this long
    teardown_wait_s: float = 60.0  # how long teardown waits for the provider to confirm terminations
    touch_every_s: float = 2.0  # how often the store records that the live instances are still there

    def __post_init__(self) -> None:
        # ids are global in the store; the job id keeps a reused job name from clashing
        self.prefix = f"{self.spec.name}-{self.job_id}"
        # every instance's tags: the job's uid (never its reused name) and this controller (for another
        # store's `gc --all-stores`)
        uid = self.store.job_by_id(self.job_id).uid
        self.owner = Owner(self.spec.name, self.job_id, uid, self.store.store_id, controller_tag())
        self.touched_at = 0.0
        self.trainer_id = f"{self.prefix}-trainer"
        self.trainer_url: str | None = None
        self.worker_seq = 0
        self.backoff = {o.key: CandidateBackoff() for o in self.spot_offers}
        self.worker_offer: dict[str, str] = {}  # worker id -> offer key (async capacity errors back off it)
        from rlboost.rollout.scheduling import fleet_sizer, placement_tracker, shared_cores

        # which candidate to bid for next: price, observed preemptions/capacity, measured tokens/s
        self.placement = placement_tracker(self.spec, self.spot_offers)
        # how many of max_workers to hold: re-decided after each step (rlboost/rollout/policies/fleet.py)
        self.sizer = fleet_sizer(
            self.spec,
            self.spec.rollout.objective,
            self.trainer_offer.hourly_price,
            self.spot_offers,
            self.placement,
            shared_cores(self.spec),
        )
        self.fleet_target = self.sizer.max_workers
        self.snapshot: dict = {}  # the trainer's last status, less its step records and evaluations
        from rlboost.contracts.tls import client_context, job_tls

        # TLS unless the trainer binds loopback (trainer.tls: auto): a per-job certificate that the
        # controller trusts and every worker pins by fingerprint
        bind = "127.0.0.1" if self.provider.kind.runs_here else "0.0.0.0"
        self.tls = job_tls(self.spec.trainer.tls, self.run_dir, bind)
        self.http = httpx.Client(
            timeout=5.0,
            headers={"Authorization": f"Bearer {self.token}"},
            verify=client_context(self.tls.files.cert) if self.tls else True,
        )
        self.trainer_exit: str | None = None
        self.trainer_restarts = 0
        # the job's envs: plain ones from the job file, secret ones (`launch --env`) from the run dir
        self.user_envs, self.user_secrets = split_envs(self.spec, self.run_dir)
        self.redact = Redactor(self.user_secrets)
        # third-party warnings (wandb's first, at its start) to controller.log, off the attached console
        self.warnings_log = WarningsToLog(controller_log(self.run_dir)).install()
        self.events = EventLines(self.console, controller_log(self.run_dir))
        sinks = open_sinks(self.spec, self.run_dir, self.prefix, self._sink_failed)
        self.metrics_log = MetricsLog(self.run_dir / METRICS_FILE, sinks=sinks, on_error=self._sink_failed)
        self.steps = StepRecorder(self.store, self.job_id, self.metrics_log)

    def _sink_failed(self, name: str, err: Exception) -> None:
        """A metrics sink (TensorBoard, W&B) failed: the job goes on with metrics.jsonl."""
        why = self.redact(f"{type(err).__name__}: {err}".splitlines()[0]) or ""
        self.store.add_event(self.job_id, "metrics-sink-failed", f"{name}: {why}; metrics.jsonl is still written")
        self.console.print(f"{name}: {why}; the job goes on without it (metrics.jsonl is still written)", markup=False)

    def _node_files(self) -> dict:
        return node_files(self.spec, self.user_envs, self.user_secrets)

    # ---- main --------------------------------------------------------------------------
    def run(self, resume: bool = False) -> str:
        """Run the job to the end; returns the final job status. `resume`: a previous controller of
        this job died or was stopped; reattach to what still runs, relaunch what does not.

        Ctrl-C, `rlboost down` (SIGTERM) and a closed terminal (SIGHUP) stop the job; signals that
        come while it stops never cut its teardown short (rlboost/cli/stopping.py), and its end is
        always written, on a full disk too (rlboost/cli/disk.py)."""
        self.signals = StopSignals(self._instances_left, self._say, self._hung_up)
        status, error = "failed", None
        with self.signals.installed():
            try:
                try:
                    status, error = self._run_job(resume)
                finally:
                    # from here no signal raises (one that did on its way here set this itself)
                    self.signals.phase = Phase.STOPPING
            except KeyboardInterrupt:
                status, error = "stopped", "interrupted (Ctrl-C)"
            except Stop as e:
                status, error = "stopped", str(e) or "stopped by `rlboost down`"
            except (ProviderError, TrainerFailed) as e:
                status, error = "failed", str(e)
                if disk_full(e):
                    error = self._disk_full_why(e)
            except Exception as e:
                if not disk_full(e):
                    error = f"controller error: {type(e).__name__}: {e}"
                    raise  # a bug: its traceback is wanted (the job is torn down and marked failed first)
                status, error = "failed", self._disk_full_why(e)
            finally:
                status, error = self._finish(status, error)
                self.warnings_log.remove()
        return status

    def _run_job(self, resume: bool) -> tuple[str, str | None]:
        reserve_room(self.run_dir)  # before anything is launched: room to record the job's end on a full disk
        if resume:
            self.store.update_job(self.job_id, status="running", ended_at=None, error=None)
        else:
            self.store.update_job(self.job_id, status="running", started_at=time.time())
        progress = JobProgress(self.console, self.spec.algorithm.steps)
        with progress:
            if resume:
                self._reattach(progress)
            else:
                self._reconcile_on_start()
                self._launch_trainer(progress)
            return self._supervise(progress)

    def _finish(self, status: str, error: str | None) -> tuple[str, str | None]:
        """Tear the job down and write its end. Signals only say how far it is (a third Ctrl-C
        abandons the teardown: what is left is `rlboost gc`'s); a full disk frees the reserve."""
        sig = self.signals
        if status == "failed" and not (error or "").startswith("disk full") and no_room(self.run_dir):
            error = f"disk full (no space left where {self.run_dir} is): {error}"
        if sig.stopped_by is not None:
            self._say(f"stopping job {self.spec.name} (id {self.job_id}): terminating {sig.count_left()} instance(s)")
        problem = None
        try:
            try:
                sig.phase = Phase.TEARDOWN
                problem = self._teardown_all()
            finally:
                sig.phase = Phase.FINISHING
        except Abandon:  # raised once at most, and only while in TEARDOWN: nothing can interrupt from here
            sig.phase = Phase.FINISHING
            problem = self._abandoned()
        if problem:
            error = f"{error}; {problem}" if error else problem
        try:
            self.metrics_log.close()  # W&B: finish the run (an offline one is complete on disk)
        except Exception as e:
            with contextlib.suppress(Exception):
                self.store.add_event(self.job_id, "metrics-close-failed", self.redact(str(e)) or "")
        end = {"status": status, "ended_at": time.time(), "error": self.redact(error), "clock": self.provider.clock()}
        try:
            self.store.update_job(self.job_id, **end)
        except Exception as e:
            if not (disk_full(e) and release_room(self.run_dir)):
                raise
            self.store.update_job(self.job_id, **end)
        release_room(self.run_dir)  # the job has ended; a resume reserves anew
        self.http.close()
        return status, error

    def _teardown_all(self) -> str | None:
        """teardown(); on a full disk once more after freeing the reserve (its first pass terminated
        every instance before its first write failed, so nothing of the job takes the room). What
        went wrong, or None."""
        try:
            try:
                self.teardown()
            except Exception as e:
                if not (disk_full(e) and release_room(self.run_dir)):
                    raise
                self.teardown()
        except Exception as e:  # the job's end is recorded all the same; `rlboost gc` finds what is left
            with contextlib.suppress(Exception):
                self.store.add_event(self.job_id, "teardown-failed", self.redact(str(e)) or "")
            return f"teardown failed: {e}"
        return None

    def _abandoned(self) -> str:
        """The teardown was abandoned (a third Ctrl-C): record what is known gone, say what is left."""
        with contextlib.suppress(Exception):
            self._apply_events()  # what was terminated before the Ctrl-C
        n = self.signals.count_left()
        with contextlib.suppress(Exception):
            self.store.add_event(self.job_id, "teardown-abandoned", f"{n} instance(s) left for `rlboost gc`")
        self._say(
            f"stopped waiting: {n} instance(s) may still be running and billing; run `rlboost gc` to terminate them"
        )
        return f"teardown abandoned (Ctrl-C) with {n} instance(s) left: run `rlboost gc`"

    def _disk_full_why(self, e: BaseException) -> str:
        return (
            f"disk full ({self.redact(str(e))}): free space on the disk of {self.run_dir.resolve().parent.parent}, "
            f"then continue the job with `rlboost launch --resume {self.job_id}`"
        )

    def _instances_left(self) -> int:
        return len(self.store.live_instances(self.job_id))

    def _say(self, line: str) -> None:
        with contextlib.suppress(Exception):  # a closed terminal, a full disk under controller.log
            self.console.print(line, markup=False, highlight=False)

    def _hung_up(self) -> None:
        """SIGHUP: the terminal is gone. Writing to it would fail (EIO) in the middle of teardown, so
        stdout/stderr go to the job's controller log from here on."""
        with contextlib.suppress(OSError):
            fd = os.open(controller_log(self.run_dir), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)

    def _launch_trainer(self, progress: JobProgress) -> None:
        o = self.trainer_offer
        files = self._node_files()
        # a trainer that enrols boots with a commitment only: no token, no TLS key, no secret variable
        # in its boot data; they are delivered once it proved itself (rlboost/cli/enrolment.py)
        enrolment = None
        if self.provider.kind.trainer_enrols:
            grant = Grant(token=self.token, env=files.pop("user_secrets"))
            # its key on disk before the launch: a controller killed from here on is resumed by one that enrols it
            enrolment = TrainerEnrolment.begin(grant, self.run_dir, self.trainer_id)
            secret = enrolment.env
        else:
            secret = {Env.JOB_TOKEN: self.token, **(self.tls.trainer_env if self.tls else {})}
        cmd, env = trainer_command(self.spec, self.run_dir, self.provider.kind.runs_here, self.record_rollouts)
        env.update(secret)
        req = trainer_request(o, self.trainer_id, self.owner, env, cmd, files)
        self._launch(req, o.on_demand_price)
        pause_point(TRAINER_LAUNCHED, self.run_dir)
        progress.provisioning(f"trainer {self.trainer_id} ({o.describe()})")
        why = self._await_trainer(enrolment)
        if why is not None:
            raise TrainerFailed(f"{why}; {self._log_hint()}")
        self.store.update_job(self.job_id, trainer_url=self.trainer_url)
        progress.provisioned(f"trainer up at {self.trainer_url}")

    def _await_trainer(self, enrolment: TrainerEnrolment | None) -> str | None:
        """Wait for the trainer to serve, enrolling it on the way (`enrolment`); None once it serves, else
        why not. TrainerFailed when what answers at its address is not the node this job launched."""
        deadline = time.monotonic() + self.trainer_boot_timeout_s
        while True:
            self._apply_events()
            if self.trainer_exit:
                return f"trainer exited while starting ({self.trainer_exit})"
            if self.trainer_url is not None and (enrolment is None or self._enrolled(enrolment, deadline)):
                if enrolment is not None:
                    TrainerEnrolment.forget(self.run_dir, self.trainer_id)
                return None
            if time.monotonic() > deadline:
                why = f" ({enrolment.last_error})" if enrolment is not None and enrolment.last_error else ""
                return f"trainer did not come up in {self.trainer_boot_timeout_s:.0f}s{why}"
            time.sleep(self.poll_s)

    def _enrolled(self, enrolment: TrainerEnrolment, deadline: float) -> bool:
        """One step of a booting trainer's enrolment: True once it holds the token and serves as itself
        (after the delivery it loads its model first)."""
        assert self.trainer_url is not None
        if not enrolment.done:
            pause_point(TRAINER_ENROLLING, self.run_dir)
            try:
                enrolment.attempt(self.trainer_url, timeout=max(1.0, min(10.0, deadline - time.monotonic())))
            except TrainerEnrolmentError as e:
                raise TrainerFailed(f"{e}; {self._log_hint()}") from None
            if enrolment.pin is not None:  # it proved it holds this certificate
                self._trust_trainer_cert(enrolment.pin)
            if enrolment.done:
                pause_point(TRAINER_ENROLLED, self.run_dir)
        return enrolment.done and self._fetch_status() is not None

    def _trust_trainer_cert(self, pin: Path) -> None:
        """Pin the certificate an enrolled trainer made itself: the controller's requests and every
        worker launched from here on check it."""
        if self.tls is None or self.tls.files.cert == pin:
            return
        self.tls = self.tls.pinned_to(pin)
        self.http.close()
        self.http = httpx.Client(
            timeout=5.0, headers={"Authorization": f"Bearer {self.token}"}, verify=client_context(pin)
        )

    def _supervise(self, progress: JobProgress) -> tuple[str, str | None]:
        last_ok = time.monotonic()
        while True:
            self._apply_events()
            status = self._fetch_status()
            if status is not None:
                last_ok = time.monotonic()
                self._record_status(status, progress)
                if status.phase == "done":
                    with contextlib.suppress(httpx.HTTPError):
                        self.http.post(f"{self.trainer_url}/v1/shutdown")
                    return "succeeded", None
                if status.phase == "failed":  # the trainer ended the job (a reward over its error budget):
                    with contextlib.suppress(httpx.HTTPError):  # relaunching it would fail the same way
                        self.http.post(f"{self.trainer_url}/v1/shutdown")
                    why = self.redact(status.error) or "the trainer failed the job"
                    return "failed", f"{why}; {self._log_hint()}"
            if self.trainer_exit or time.monotonic() - last_ok > 60:
                why = (
                    f"trainer exited before the job finished ({self.trainer_exit})"
                    if self.trainer_exit
                    else "trainer status unreachable for 60s"
                )
                if self.trainer_restarts >= self.spec.trainer.max_restarts:
                    return "failed", f"{why}; {self._log_hint()}"
                self._recover_trainer(progress, why)
                last_ok = time.monotonic()
                continue
            if self._over_budget():
                return "stopped", f"budget cap ${self.spec.budget_usd:.2f} reached"
            self._touch_live()
            self._reconcile_workers(progress)
            progress.update(self.snapshot, self._live_workers(), self._preemptions())
            self.events.migrated(self.snapshot.get("migrated"))
            time.sleep(self.poll_s)

    # ---- recovery ----------------------------------------------------------------------
    def _recover_trainer(self, progress: JobProgress, why: str) -> None:
        """The trainer is lost: relaunch it (it resumes from its last checkpoint). Workers dialled the
        old endpoint, so they are replaced by ones that know the new one."""
        self.trainer_restarts += 1
        self.store.add_event(
            self.job_id,
            "trainer-lost",
            f"{why}; relaunching ({self.trainer_restarts}/{self.spec.trainer.max_restarts})",
            self.trainer_id,
            self.provider.clock(),
        )
        progress.note(f"trainer lost ({why}); relaunching from the last checkpoint")
        for inst in self.store.live_instances(self.job_id):
            self.provider.terminate(inst.id)  # records close when the provider confirms (billing too)
        self._apply_events()
        self.trainer_id = f"{self.prefix}-trainer-r{self.trainer_restarts}"
        self.trainer_url, self.trainer_exit = None, None
        self.steps.new_trainer()
        self._launch_trainer(progress)

    def _reattach(self, progress: JobProgress) -> None:
        """After a controller restart: adopt every recorded instance the provider still runs, close
        the records of those it does not (billed until the provider or their heartbeat says they
        stopped), terminate what it runs that no record names. A trainer that is not serving any more
        is relaunched, and the old workers go with it: they know only the old trainer's endpoint."""
        clock = self.provider.clock()
        records = self.store.instances(self.job_id)
        live = self.store.live_instances(self.job_id)
        owned = self._listed_settled({i.id for i in live})
        by_key = {(o.cloud, o.region, o.accelerator): o.key for o in self.spot_offers}
        adopted: list[str] = []
        for inst in live:
            req = recorded_request(inst, self.owner)
            if inst.id in owned and self.provider.adopt(req):
                adopted.append(inst.id)
                key = by_key.get((inst.cloud, inst.region, inst.accelerator))
                if key is not None and req.role is Role.WORKER:
                    self.worker_offer[inst.id] = key
                    self.placement.launched(inst.id, key, clock)
            else:
                self._close_gone(inst)
        for iid in sorted(owned - set(adopted)):  # running, but no live record: not ours to keep
            self.provider.terminate(iid)
        workers = [int(i.id.rsplit("-w", 1)[1]) for i in records if i.role == Role.WORKER.value]
        self.worker_seq = max(workers, default=0)
        trainers = [i for i in records if i.role == Role.TRAINER.value]
        self.trainer_restarts = max(len(trainers) - 1, 0)
        self.store.add_event(self.job_id, "reattached", f"adopted {adopted}", clock=clock)
        progress.note(f"reattached to {len(adopted)} running instance(s)")
        latest = trainers[-1].id if trainers else None
        if latest is not None and latest in adopted:
            self.trainer_id = latest
            # a trainer still booting or waiting for its enrolment when the last controller died is
            # enrolled now, with the key that controller kept, rather than taken for lost
            resumed = TrainerEnrolment.resumed(Grant(token=self.token, env=self.user_secrets), self.run_dir, latest)
            if self._await_trainer(resumed) is None:
                self.store.update_job(self.job_id, trainer_url=self.trainer_url)
                progress.provisioned(f"trainer {latest} still serving at {self.trainer_url}")
                progress.note(carry_on_message(latest))
                return
        stale = [i for i in adopted if i != latest and self.store.instance(i).role == Role.WORKER.value]
        for iid in stale:  # they dial the old trainer's endpoint: replaced by workers that know the new one
            self.store.add_event(self.job_id, "worker-replaced", "its trainer is relaunched", iid, clock)
            self.provider.terminate(iid)
        if stale:
            progress.note(f"terminating {len(stale)} worker(s) of the old trainer; new ones will dial the new one")
        if latest is not None:
            self.trainer_restarts += 1
            self.trainer_id = f"{self.prefix}-trainer-r{self.trainer_restarts}"
        self.trainer_url, self.trainer_exit = None, None
        if latest is not None:  # what the relaunched trainer starts from (said here: only now is it known)
            done = self.store.job_by_id(self.job_id).step or 0
            progress.note(relaunch_message(done, checkpointed_steps(self.run_dir)))
        self._launch_trainer(progress)

    def _listed_settled(self, want: set[str]) -> set[str]:
        from rlboost.cli.reconcile import listed_settled

        return listed_settled(self.provider, self.owner, want, lag_s=self.provider.kind.listing_lag_s)

    def _close_gone(self, inst: InstanceRow) -> None:
        """An instance that went while no controller watched: its record ends when the provider says
        it stopped, else at the last time the store saw it alive (its heartbeat), never at the resume."""
        at = self.provider.exit_clock(inst.id)
        how = "stopped (per the provider)"
        if at is None:
            at = inst.last_clock if inst.last_clock is not None else inst.started_clock
            how = "last seen alive"
        if at is None:  # never seen running: nothing to bill
            at, how = self.provider.clock(), "never seen running"
        at = max(at, inst.started_clock or at)
        self.store.update_instance(inst.id, InstanceState.EXITED, at, f"gone while the controller was down ({how})")

    # ---- instances ---------------------------------------------------------------------
    def _launch(self, req: LaunchRequest, on_demand_price: float | None) -> None:
        # durable first: a crash between these two lines leaves a record to reconcile, not a leak
        self.store.record_launch(self.job_id, req, self.provider.name, on_demand_price)
        try:
            handle = self.provider.launch(req)
        except CapacityError as e:
            why = self.redact(str(e)) or ""
            self.store.update_instance(req.instance_id, InstanceState.FAILED, self.provider.clock(), why)
            raise
        except Stop:  # `down` arrived mid-launch: the record stays live, so teardown terminates what started
            raise
        except Exception as e:
            why = self.redact(str(e)) or type(e).__name__
            self._failed_launch(req, why)
            # not chained: a printed traceback would show the unredacted message
            raise ProviderError(f"could not launch {req.instance_id}: {why}") from None
        if handle:  # at once: what gc and a resume look the instance up by
            self.store.set_instance_handle(req.instance_id, handle)

    def _failed_launch(self, req: LaunchRequest, why: str) -> None:
        """A launch call raised, maybe after the cloud made the instance (a timeout on the reply): look
        for it by its tags (over the listing's lag) before calling it failed. Found, it is tracked and
        terminated, and billed until the provider confirms; not found, it never started."""
        if req.instance_id in self._listed_settled({req.instance_id}) and self.provider.adopt(req):
            what = f"{why}; the instance exists: terminating it"
            self.store.add_event(self.job_id, "launch-error-instance-found", what, req.instance_id)
            self.provider.terminate(req.instance_id)
            return
        self.store.update_instance(req.instance_id, InstanceState.FAILED, self.provider.clock(), why)

    def _reconcile_on_start(self) -> None:
        """Terminate what the provider still holds under this job's name from earlier runs (a crashed
        controller's leftovers) before launching anything."""
        from rlboost.cli.reconcile import reconcile

        res = reconcile(self.store, self.provider, self.store.job_by_id(self.job_id), wait_s=self.teardown_wait_s)
        if res.terminated or res.unconfirmed:
            self.store.add_event(
                self.job_id, "reconciled", f"terminated leftovers {res.terminated}; unconfirmed {res.unconfirmed}"
            )

    def _apply_events(self) -> None:
        for ev in self.provider.poll():
            ev = replace(ev, detail=self.redact(ev.detail) or "")
            try:
                self.store.update_instance(ev.instance_id, ev.state, ev.at, ev.detail)
            except UnknownInstanceError:
                continue  # a leftover of an earlier run that reconciliation terminated
            key = self.worker_offer.get(ev.instance_id)
            if key is not None and ev.state is InstanceState.RUNNING:
                self.backoff[key].ok()
            elif key is not None and ev.capacity:  # capacity refused after the request was accepted
                self.placement.capacity_failure(key)
                self.backoff[key].fail(time.monotonic(), cap=self.backoff_cap_s)
                self.store.add_event(self.job_id, "capacity-unavailable", ev.detail, ev.instance_id, ev.at)
            if key is not None and ev.state.terminal:
                self.placement.ended(ev.instance_id, ev.at, preempted=ev.state is InstanceState.PREEMPTED)
            if key is not None and ev.state in (InstanceState.NOTICE, InstanceState.PREEMPTED):
                self.events.preemption(ev.instance_id, ev.state is InstanceState.NOTICE, ev.detail)
            if ev.instance_id == self.trainer_id:
                if ev.endpoint:  # clouds report http://ip:port
                    self.trainer_url = https_url(ev.endpoint) if self.tls else ev.endpoint
                    pin = pin_file(self.run_dir, self.trainer_id)
                    if pin.exists():  # enrolled under an earlier controller (a resume): trust it again
                        self._trust_trainer_cert(pin)
                if ev.state.terminal:
                    self.trainer_exit = f"{ev.state.value}: {ev.detail}"

    def _touch_live(self) -> None:
        """Every few seconds: the live instances are still there (the bound a restarted controller
        bills one up to when it went unseen and the provider cannot say when)."""
        if time.monotonic() - self.touched_at >= self.touch_every_s:
            self.touched_at = time.monotonic()
            self.store.touch_live(self.job_id, self.provider.clock())

    def _live_workers(self) -> list:
        return [i for i in self.store.live_instances(self.job_id) if i.role == Role.WORKER.value]

    def _preemptions(self) -> int:
        return sum(1 for i in self.store.instances(self.job_id) if i.state == InstanceState.PREEMPTED.value)

    def _reconcile_workers(self, progress: JobProgress) -> None:
        """Keep the fleet policy's number of spot workers, cheapest expected $/token first."""
        live = [i for i in self._live_workers() if i.state != InstanceState.NOTICE.value]
        order = self.placement.order(self.spot_offers, self.provider.clock())
        reconcile_fleet(
            self.fleet_target - len(live),
            order,
            self.backoff,
            time.monotonic(),
            partial(self._launch_worker, progress),
            cap=self.backoff_cap_s,
        )

    def _launch_worker(self, progress: JobProgress, offer: Offer) -> bool:
        """One spot worker at `offer`; False when the provider refused it for capacity."""
        self.worker_seq += 1
        iid = f"{self.prefix}-w{self.worker_seq:03d}"
        # no token in a worker's boot data: a credential it trades once for the token and the job's
        # secret variables, at this trainer, within the hour
        enrol = worker_credential(self.token, iid, self.trainer_id)
        tls_env = self.tls.worker_env if self.tls else {}
        files = self._node_files()
        req = worker_request(self.spec, offer, iid, self.owner, self.trainer_url or "", enrol, tls_env, files)
        self.worker_offer[iid] = offer.key
        try:
            self._launch(req, offer.on_demand_price)
        except CapacityError as e:
            self.placement.capacity_failure(offer.key)
            self.store.add_event(
                self.job_id, "capacity-unavailable", self.redact(str(e)) or "", iid, self.provider.clock()
            )
            return False
        self.placement.launched(iid, offer.key, self.provider.clock())
        progress.note(f"launched spot worker {iid} ({offer.describe()})")
        return True

    def _size_fleet(self, rec: StepRecord, progress: JobProgress) -> None:
        """After a step, as the simulator: the fleet policy picks the size from the step's measured
        length; surplus workers are released, newest first (their responses move on, token by token)."""
        if not self.spot_offers or rec.spot_workers is None:  # the coordinator timed no step
            return
        clock = self.provider.clock()
        sample = StepSample(rec.spot_workers, rec.step_s, rec.gen_s, rec.train_s, rec.tokens)
        started = [i.started_clock for i in self.store.instances(self.job_id) if i.started_clock is not None]
        spent = spent_dollars(self.store, self.job_id)
        at = FleetClock(shown(rec.step), clock - min(started, default=clock), spent)  # this step included
        d = self.sizer.decide(sample, at, clock, self.fleet_target)
        if d.deadline_at_risk:
            self.store.add_event(self.job_id, "deadline-at-risk", d.why, clock=clock)
        if d.workers == self.fleet_target:
            return
        self.store.add_event(
            self.job_id, "fleet-size", f"{self.fleet_target} -> {spot_workers(d.workers)} ({d.why})", clock=clock
        )
        self.events.say(f"fleet: {self.fleet_target} -> {spot_workers(d.workers)} ({d.why})")
        self.fleet_target = d.workers
        live = [i for i in self._live_workers() if i.state != InstanceState.NOTICE.value]
        for inst in surplus(live, lambda i: i.started_clock or 0.0, d.workers):
            self.store.add_event(self.job_id, "fleet-scale-down", "released", inst.id, clock)
            self.provider.terminate(inst.id)  # records close when the provider confirms (billing too)

    def _over_budget(self) -> bool:
        if self.spec.budget_usd is None:
            return False
        self.store.update_job(self.job_id, clock=self.provider.clock())
        return spent_dollars(self.store, self.job_id) >= self.spec.budget_usd

    # ---- trainer status ----------------------------------------------------------------
    def _fetch_status(self) -> TrainerStatus | None:
        if not self.trainer_url:
            return None
        try:
            r = self.http.get(f"{self.trainer_url}/v1/status", params=self.steps.query())
            r.raise_for_status()
            # as contracts/status.py defines it (a ValidationError is a ValueError)
            return TrainerStatus.model_validate(r.json())
        except (httpx.HTTPError, ValueError):
            return None

    def _record_status(self, status: TrainerStatus, progress: JobProgress) -> None:
        clock = self.provider.clock()
        self.steps.take(
            status,
            clock,
            progress,
            totals=lambda: (spent_dollars(self.store, self.job_id), self._preemptions()),
            on_step=partial(self._size_fleet, progress=progress),
        )
        snap = status.model_dump(mode="json", exclude={"history", "history_from", "evals", "evals_from"})
        self.placement.on_workers(snap["workers"], self.provider.clock())
        self._note_draining(snap["workers"])
        self.snapshot = snap
        self.store.update_job(
            self.job_id,
            snapshot=snap,
            step=status.step,
            version=status.version,
            reward=status.reward,
            tokens_total=status.tokens_total,
            clock=clock,
        )

    def _note_draining(self, workers: list[dict]) -> None:
        """A worker that saw its cloud's preemption notice drains and says so: mark it NOTICE now, so
        its replacement launches before the cloud takes it (a cloud provider cannot see the notice)."""
        live = {i.id: i.state for i in self._live_workers()}
        for w in workers:
            iid = w.get("worker_id")
            if w.get("state") == "draining" and live.get(iid) == InstanceState.RUNNING.value:
                self.store.update_instance(iid, InstanceState.NOTICE, self.provider.clock(), "draining on notice")
                self.events.preemption(iid, True, "draining on notice")

    # ---- teardown ----------------------------------------------------------------------
    def teardown(self) -> None:
        """Terminate every instance this job owns: what the store knows and what the provider lists."""
        live = {i.id for i in self.store.live_instances(self.job_id)}
        owned = set(self.provider.list_owned(self.owner))
        # workers first, the trainer last (it may still be serving its final status)
        order = sorted(live | owned, key=lambda i: (i == self.trainer_id, i))
        for iid in order:
            self.provider.terminate(iid)
        # a cloud confirms asynchronously: wait until the provider no longer lists them
        remaining, deadline = set(order), time.monotonic() + self.teardown_wait_s
        while True:
            self._apply_events()
            try:
                remaining &= set(self.provider.list_owned(self.owner))
            except Exception as e:  # unreachable: keep them as unconfirmed rather than crash teardown
                self.store.add_event(self.job_id, "teardown-check-failed", self.redact(str(e)) or "")
            if not remaining or time.monotonic() > deadline:
                break
            time.sleep(max(self.poll_s, 1.0))
            for iid in sorted(remaining):  # idempotent; the local provider SIGKILLs stragglers
                self.provider.terminate(iid)
        clock = self.provider.clock()
        for inst in self.store.live_instances(self.job_id):
            if inst.id in remaining:  # left live in the store, so `rlboost gc` finds it
                self.store.add_event(
                    self.job_id, "termination-unconfirmed", "still listed; run `rlboost gc`", inst.id, clock
                )
            else:
                self.store.update_instance(inst.id, InstanceState.TERMINATED, clock, "torn down")

    def _log_hint(self) -> str:
        return f"see {self.run_dir / 'instances' / self.trainer_id / 'log'}"


class TrainerFailed(Exception):
    pass
