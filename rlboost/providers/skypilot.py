"""SkyPilot provider: the trainer is one on-demand cluster, every spot rollout worker its own small cluster.

Every SkyPilot client call returns a request id at once; the result is fetched with `sky.get`, which
blocks. So `launch`, `terminate` and the periodic status refresh only *submit* requests, and a small
thread pool waits on `sky.get`: `poll()` collects what has finished and never blocks the controller,
and many launches are in flight at once.

- Capacity: `ResourcesUnavailableError` becomes a FAILED event with `capacity=True` (the controller
  backs off that candidate), and the half-made cluster is downed.
- Preemption: `sky.status(refresh=FORCE)` every `status_every_s`; a worker cluster that is gone,
  INIT or STOPPED was preempted (or its worker exited and powered the node off) and is downed.
- Teardown: `sky.down`, always; a down that fails is retried.
- Orphans: `list_owned(owner)` lists the clusters labelled with the job's uid (a cluster SkyPilot
  reports without labels, e.g. one whose provisioning failed, by its exact name `{job}-{id}-…`).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rlboost.contracts.env_names import Env
from rlboost.contracts.provider_kinds import provider_kind
from rlboost.contracts.tls import SECRET_ENV
from rlboost.providers.base import (
    INSTANCE_TAG,
    CapacityError,
    InstanceEvent,
    InstanceState,
    LaunchRequest,
    Owner,
    ProviderError,
    Role,
    Tagged,
    instance_name_re,
)
from rlboost.providers.bootstrap import (
    CONTROL_PORT,
    SOURCE_ROOT,
    TRAINER_PORT,
    cloud_spec_yaml,
    is_source_checkout,
    job_extras,
    node_env,
    pip_spec,
    template,
)

if TYPE_CHECKING:
    from rlboost.contracts.spec import JobSpec

log = logging.getLogger("rlboost.skypilot")

# Worker nodes get no cloud identity at all (task YAML cannot override this key, so it is set as a
# client-side config override for the worker launch request).
WORKER_IDENTITY = {"aws": {"remote_identity": "NO_UPLOAD"}, "gcp": {"remote_identity": "NO_UPLOAD"}}
# redacted by SkyPilot, never in task files (a spot worker's enrolment credential too)
SECRET_KEYS = (Env.JOB_TOKEN, Env.ENROL, *SECRET_ENV)
GONE_STATES = ("INIT", "STOPPED")

# How long a node stays up idle once its controller has exited (the launching machine downs it at once
# when it is there to see the end; this is the bound when it is not).
NODE_AUTOSTOP_MIN = 5
# The node bids for spot workers itself: SkyPilot gives it the launching machine's credentials, as it
# does its own managed-jobs controller (SkyPilot's default identity, named here so a user config that
# says otherwise for clusters does not leave the node unable to launch).
NODE_IDENTITY = {"aws": {"remote_identity": "LOCAL_CREDENTIALS"}, "gcp": {"remote_identity": "LOCAL_CREDENTIALS"}}


def _sdk_from_env() -> Any:
    """RLBOOST_SKY_SDK=module:attribute: an object with the `sky` client calls rlboost makes, used
    instead of SkyPilot's (the cloud boundary; tests give a node's controller tests/sky_fake.py's)."""
    ref = os.environ.get(Env.SKY_SDK)
    if not ref:
        return None
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass
class _Req:
    kind: str  # launch | endpoints | down | cleanup | status
    iid: str | None
    rid: str
    future: Future
    names: tuple[str, ...] = ()  # status: the clusters it was asked about


def _status_name(x: Any) -> str:
    v = getattr(x, "status", None)
    if v is None and isinstance(x, dict):
        v = x.get("status")
    return str(getattr(v, "value", v))


def _field(x: Any, name: str) -> Any:
    return x.get(name) if isinstance(x, dict) else getattr(x, name, None)


class SkyPilotProvider:
    name = "skypilot"
    kind = provider_kind("skypilot")

    @classmethod
    def setup_problems(cls) -> list[str]:
        return []  # nothing beyond its clouds' credentials, which preflight checks

    @classmethod
    def boot_data_problems(cls, requests: list[LaunchRequest], saved: str) -> list[str]:
        return []  # SkyPilot hands a node its setup, variables and files itself, not as boot data

    @classmethod
    def for_job(cls, spec: JobSpec, run_dir: Path, *, owner: Owner, market: Any = None) -> SkyPilotProvider:
        return cls(run_dir)

    def __init__(
        self,
        run_dir: Path,
        *,
        sdk: Any = None,
        trainer_port: int = TRAINER_PORT,
        status_every_s: float = 30.0,
        trainer_autostop_min: int = 30,
        redown_after_s: float = 30.0,
        threads: int = 32,
        sync_workdir: bool | None = None,
    ) -> None:
        import sky  # the real SDK is needed for Task/schema validation even when `sdk` is a fake

        self._sky = sky
        self.sdk = sdk if sdk is not None else _sdk_from_env() or sky
        self.run_dir = run_dir
        self.port = trainer_port
        self.status_every_s = status_every_s
        self.trainer_autostop_min = trainer_autostop_min
        self.redown_after_s = redown_after_s
        self.sync_workdir = is_source_checkout() if sync_workdir is None else sync_workdir
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sky-get")
        self.lock = threading.Lock()
        self.reqs: dict[str, LaunchRequest] = {}
        self.inflight: list[_Req] = []
        self.launching: dict[str, str] = {}  # iid -> launch request id
        self.up: set[str] = set()  # launched, not known to be gone
        self.terminating: set[str] = set()
        self.gone: set[str] = set()  # downed (confirmed)
        self.redown: dict[str, float] = {}  # iid -> when to retry a failed down
        self.next_status = time.monotonic() + status_every_s
        self.events: list[InstanceEvent] = []
        self.tasks: dict[str, str] = {}  # iid -> the task YAML it was launched with (secrets redacted)

    # ---- task YAML ---------------------------------------------------------------------
    def task_config(self, req: LaunchRequest) -> dict[str, Any]:
        """The SkyPilot task for this request: the template plus what the request decides."""
        trainer = req.role is Role.TRAINER
        cfg = yaml.safe_load(template("trainer.sky.yaml" if trainer else "worker.sky.yaml"))
        # a job's own workdir takes the place of rlboost's source checkout: rlboost is then installed
        # from RLBOOST_PIP_SPEC or the released package of this version
        sync_source = self.sync_workdir and not req.workdir
        env = node_env(req, port=self.port, from_workdir=sync_source)
        res: dict[str, Any] = {
            "cloud": req.cloud,
            "use_spot": not trainer,
            "labels": req.tags,
        }
        if req.region:
            res["region"] = req.region
        if req.accelerator and req.accelerator.lower() != "cpu":
            res["accelerators"] = req.accelerator
        if trainer:
            res["ports"] = [self.port]
            # safety net if the controller dies: the cluster downs itself once idle
            res["autostop"] = {"idle_minutes": self.trainer_autostop_min, "down": True}
            spec = self.run_dir / "spec.cloud.yaml"
            spec.write_text(cloud_spec_yaml(self.run_dir))
            cfg["file_mounts"] = {"~/.rlboost/spec.yaml": str(spec)}
            cfg["num_nodes"] = int((yaml.safe_load(spec.read_text()).get("trainer") or {}).get("nodes", 1))
        cfg["name"] = req.instance_id
        cfg["resources"] = res
        secret = {*SECRET_KEYS, *req.user_secrets}
        cfg["envs"] = {k: v for k, v in env.items() if k not in secret}
        cfg["secrets"] = {k: v for k, v in env.items() if k in secret}  # redacted by SkyPilot
        if req.file_mounts:
            cfg["file_mounts"] = {**req.file_mounts, **(cfg.get("file_mounts") or {})}
        if req.workdir:
            cfg["workdir"] = req.workdir
        elif sync_source:
            cfg["workdir"] = str(SOURCE_ROOT)
        return cfg

    # ---- Provider protocol -------------------------------------------------------------
    def clock(self) -> float:
        return time.time()

    def launch(self, req: LaunchRequest) -> str:
        cfg = self.task_config(req)
        try:
            task = self._sky.Task.from_yaml_str(yaml.safe_dump(cfg, sort_keys=False))  # schema check
        except Exception as e:
            raise ProviderError(f"{req.instance_id}: invalid SkyPilot task ({e})") from e
        identity = WORKER_IDENTITY if req.role is Role.WORKER else None
        with self._sky.skypilot_config.override_skypilot_config(identity):
            try:
                rid = self.sdk.launch(
                    task,
                    cluster_name=req.instance_id,
                    retry_until_up=False,
                    # the trainer autostops (down) when idle; workers are downed by us, or power off
                    idle_minutes_to_autostop=self.trainer_autostop_min if req.role is Role.TRAINER else None,
                    down=req.role is Role.TRAINER,
                )
            except self._sky.exceptions.ResourcesUnavailableError as e:
                raise CapacityError(str(e)) from e
        self.reqs[req.instance_id] = req
        self.tasks[req.instance_id] = yaml.safe_dump({**cfg, "secrets": dict.fromkeys(cfg["secrets"], "<redacted>")})
        self.launching[req.instance_id] = rid
        self._submit("launch", req.instance_id, rid)
        self._emit(req.instance_id, InstanceState.PENDING, f"sky.launch request {rid}")
        return f"cluster {req.instance_id} (sky.launch request {rid})"

    def poll(self) -> list[InstanceEvent]:
        for r in [r for r in self.inflight if r.future.done()]:
            self.inflight.remove(r)
            self._resolve(r)
        now = time.monotonic()
        for iid, when in list(self.redown.items()):
            if now >= when:
                del self.redown[iid]
                self._submit("down", iid, self.sdk.down(iid))
        if now >= self.next_status and not any(r.kind == "status" for r in self.inflight):
            self.next_status = now + self.status_every_s
            names = tuple(sorted(self.up - self.terminating))
            if names:
                rid = self.sdk.status(cluster_names=list(names), refresh=self._sky.StatusRefreshMode.FORCE)
                self._submit("status", None, rid, names)
        with self.lock:
            out, self.events = self.events, []
        return out

    def terminate(self, instance_id: str) -> None:
        if instance_id in self.terminating or instance_id in self.gone:
            return
        rid = self.launching.pop(instance_id, None)
        if rid is not None:  # stop provisioning first; the down below removes what it made
            with contextlib.suppress(Exception):
                self.sdk.api_cancel(rid, silent=True)
        self.terminating.add(instance_id)
        self._submit("down", instance_id, self.sdk.down(instance_id))

    def list_owned(self, owner: Owner) -> list[str]:
        exact = instance_name_re(owner.name, owner.job_id)
        return sorted(
            name
            for name, labels in self._clusters()
            # a cluster whose resources SkyPilot never recorded has no labels: its exact name decides
            if owner.owns(name, labels) or (not labels and exact.match(name))
        )

    def list_tagged(self) -> list[Tagged]:
        return [Tagged.of(name, labels) for name, labels in self._clusters() if INSTANCE_TAG in labels]

    def exit_clock(self, instance_id: str) -> float | None:
        """A downed or preempted cluster leaves SkyPilot's status: no record of when."""
        return None

    def _clusters(self) -> list[tuple[str, dict[str, str]]]:
        """(name, labels) of every cluster SkyPilot lists, less those downed here."""
        records = self.sdk.get(self.sdk.status(cluster_names=None, refresh=self._sky.StatusRefreshMode.NONE))
        out = [(str(_field(r, "name")), dict(_field(r, "labels") or {})) for r in records or []]
        return sorted((n, labels) for n, labels in out if n not in self.gone)

    def adopt(self, req: LaunchRequest) -> bool:
        if req.instance_id not in self.list_owned(req.owner):
            return False
        self.up.add(req.instance_id)
        self.reqs[req.instance_id] = req
        return True

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    # ---- the trainer node of a job whose controller runs there (`controller: trainer`) -----------
    def node_task_config(self, req: LaunchRequest, *, job_id: int, resume: bool) -> dict[str, Any]:
        """The trainer cluster's task with the job's controller on its head (rlboost/templates/node.sky.yaml):
        the trainer task's resources plus the control port, and rlboost installed with SkyPilot."""
        cfg = self.task_config(req)
        node = yaml.safe_load(template("node.sky.yaml"))
        cfg["setup"], cfg["run"] = node["setup"], node["run"]
        cfg["resources"]["ports"] = [self.port, CONTROL_PORT]
        cfg["resources"]["autostop"] = {"idle_minutes": NODE_AUTOSTOP_MIN, "down": True}
        engine = req.env.get(Env.ENGINE, "torch")
        # the controller writes the job's metrics sinks (`logging:`), so their libraries go where it runs
        sinks = (yaml.safe_load((self.run_dir / "spec.cloud.yaml").read_text()).get("logging")) or {}
        # and its trainer runs there too: the job's own extras (`hf`, `data`) as well
        extras = (*job_extras(req), "skypilot", *(("logging",) if any(sinks.values()) else ()))
        cfg["envs"].update(
            {
                Env.JOB_ID: str(job_id),
                Env.JOB_UID: req.owner.uid or "",
                Env.CONTROL_PORT: str(CONTROL_PORT),
                Env.RESUME_FLAG: "--resume" if resume else "",
                Env.PIP_SPEC: pip_spec(engine, from_workdir=self.sync_workdir, extras=extras),
            }
        )
        return cfg

    def start_node(self, req: LaunchRequest, *, job_id: int, resume: bool) -> str:
        """Launch the trainer node (or run its task again on it: `--resume`), blocking until SkyPilot has
        it up; the URL of its control port. Capacity errors are raised as CapacityError."""
        cfg = self.node_task_config(req, job_id=job_id, resume=resume)
        sky, sdk = self._sky, self.sdk
        try:
            task = sky.Task.from_yaml_str(yaml.safe_dump(cfg, sort_keys=False))
        except Exception as e:
            raise ProviderError(f"{req.instance_id}: invalid SkyPilot task ({e})") from e
        try:
            with sky.skypilot_config.override_skypilot_config(NODE_IDENTITY):
                sdk.get(
                    sdk.launch(
                        task,
                        cluster_name=req.instance_id,
                        retry_until_up=False,
                        idle_minutes_to_autostop=NODE_AUTOSTOP_MIN,
                        down=True,
                    )
                )
            eps = sdk.get(sdk.endpoints(req.instance_id, CONTROL_PORT)) or {}
        except sky.exceptions.ResourcesUnavailableError as e:
            raise CapacityError(str(e)) from e
        except Exception as e:  # SkyPilot's own errors carry the reason; the caller shows it
            raise ProviderError(f"{req.instance_id}: {type(e).__name__}: {e}") from e
        ep = eps.get(CONTROL_PORT) or eps.get(str(CONTROL_PORT))
        if not ep:
            raise ProviderError(f"{req.instance_id}: sky.endpoints gave no endpoint for control port {CONTROL_PORT}")
        return ep if "://" in ep else f"http://{ep}"

    def node_up(self, instance_id: str) -> bool:
        """Is the trainer node UP, per a fresh `sky.status` (blocking)?"""
        recs = self.sdk.get(self.sdk.status(cluster_names=[instance_id], refresh=self._sky.StatusRefreshMode.FORCE))
        return any(str(_field(r, "name")) == instance_id and _status_name(r) == "UP" for r in recs or [])

    def cancel_node_jobs(self, instance_id: str) -> None:
        """Cancel every SkyPilot job on the trainer node (blocking); a node that is gone or not up
        has none."""
        exc = self._sky.exceptions
        with contextlib.suppress(exc.ClusterDoesNotExist, exc.ClusterNotUpError):
            self.sdk.get(self.sdk.cancel(instance_id, all=True))

    def down_node(self, instance_id: str) -> None:
        """Terminate the trainer node (blocking); a node already gone is fine."""
        with contextlib.suppress(self._sky.exceptions.ClusterDoesNotExist):
            self.sdk.get(self.sdk.down(instance_id))

    # ---- request bookkeeping -----------------------------------------------------------
    def _submit(self, kind: str, iid: str | None, rid: str, names: tuple[str, ...] = ()) -> None:
        self.inflight.append(_Req(kind, iid, rid, self.pool.submit(self.sdk.get, rid), names))

    def _resolve(self, r: _Req) -> None:
        exc = r.future.exception()
        if r.kind == "launch":
            self._launched(r, exc)
        elif r.kind == "endpoints":
            self._endpoint(r, exc)
        elif r.kind in ("down", "cleanup"):
            self._downed(r, exc)
        elif r.kind == "status":
            self._statuses(r, exc)

    def _launched(self, r: _Req, exc: BaseException | None) -> None:
        iid = r.iid or ""
        if self.launching.get(iid) == r.rid:
            del self.launching[iid]
        if iid in self.terminating or iid in self.gone:
            return  # cancelled by terminate(); its down reports the end
        if exc is not None:
            capacity = isinstance(exc, self._sky.exceptions.ResourcesUnavailableError)
            what = "no capacity" if capacity else f"launch failed ({type(exc).__name__})"
            self._emit(iid, InstanceState.FAILED, f"{what}: {exc}", capacity=capacity)
            self._submit("cleanup", iid, self.sdk.down(iid))  # never leave a half-made cluster
            return
        self.up.add(iid)
        if self.reqs[iid].role is Role.TRAINER:
            self._submit("endpoints", iid, self.sdk.endpoints(iid, self.port))
        else:
            self._emit(iid, InstanceState.RUNNING, "cluster up; worker started")

    def _endpoint(self, r: _Req, exc: BaseException | None) -> None:
        iid = r.iid or ""
        if iid in self.terminating:
            return
        if exc is not None:
            self._emit(iid, InstanceState.FAILED, f"trainer port {self.port} not exposed: {exc}")
            return
        eps = r.future.result() or {}
        ep = eps.get(self.port) or eps.get(str(self.port)) or next(iter(eps.values()), None)
        if not ep:
            self._emit(iid, InstanceState.FAILED, f"sky.endpoints returned no endpoint for port {self.port}")
            return
        url = ep if "://" in ep else f"http://{ep}"
        self._emit(iid, InstanceState.RUNNING, "trainer cluster up", endpoint=url)

    def _downed(self, r: _Req, exc: BaseException | None) -> None:
        iid = r.iid or ""
        if exc is not None and not isinstance(exc, (self._sky.exceptions.ClusterDoesNotExist, ValueError)):
            log.warning("sky.down %s failed (%s); retrying in %.0fs", iid, exc, self.redown_after_s)
            self.redown[iid] = time.monotonic() + self.redown_after_s
            return
        self.up.discard(iid)
        if r.kind == "cleanup":
            return
        self.gone.add(iid)
        self.terminating.discard(iid)
        self._emit(iid, InstanceState.TERMINATED, "sky.down done")

    def _statuses(self, r: _Req, exc: BaseException | None) -> None:
        if exc is not None:
            log.warning("sky.status refresh failed: %s", exc)
            return
        seen = {str(_field(rec, "name")): _status_name(rec) for rec in r.future.result() or []}
        for iid in r.names:
            if iid not in self.up or iid in self.terminating:
                continue
            st = seen.get(iid)
            if st is not None and st not in GONE_STATES:
                continue
            self.up.discard(iid)
            why = "cluster gone" if st is None else f"cluster {st}"
            self._emit(iid, InstanceState.PREEMPTED, f"{why} (spot preemption or the node powered off)")
            self.terminating.add(iid)
            self._submit("down", iid, self.sdk.down(iid))

    def _emit(
        self, iid: str, state: InstanceState, detail: str = "", endpoint: str | None = None, capacity: bool = False
    ) -> None:
        with self.lock:
            self.events.append(InstanceEvent(iid, state, self.clock(), detail, endpoint, capacity))
