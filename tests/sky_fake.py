"""A fake of the `sky` client SDK at its boundary: the calls rlboost makes, returning request ids.

Like the real client, `launch/status/down/endpoints` return a `RequestId` at once and `get(rid)`
blocks until the request is done (`latency_s` later), then returns its result or raises the real
`sky.exceptions`. Capacity, preemption and failing downs are scripted per test. Everything it was
asked is recorded (task YAMLs, the client config in force at launch) so tests can check them.

Importing this module prepares an offline SkyPilot: no local API server, and a private
SKY_RUNTIME_DIR holding the shared price catalogs, set before `sky` is imported anywhere.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
PRICES = ROOT.parent / "shared" / "data" / "prices"


def prepare_sky_runtime(runtime_dir: Path) -> Path:
    """Put the shared SkyPilot catalog subsets where SkyPilot looks for them (`.sky/catalogs/v8`)."""
    cat = runtime_dir / ".sky" / "catalogs" / "v8"
    for cloud, src in (
        ("aws", "skypilot_catalog_v7_aws_gpu_p_family.csv"),
        ("gcp", "skypilot_catalog_v7_gcp_gpu_subset.csv"),
    ):
        (cat / cloud).mkdir(parents=True, exist_ok=True)
        shutil.copy(PRICES / src, cat / cloud / "vms.csv")
    return runtime_dir


os.environ["SKYPILOT_DISABLE_LOCAL_API_SERVER"] = "1"
if "RLBOOST_TEST_SKY_RUNTIME" not in os.environ:
    os.environ["RLBOOST_TEST_SKY_RUNTIME"] = tempfile.mkdtemp(prefix="rlboost-sky-")
    prepare_sky_runtime(Path(os.environ["RLBOOST_TEST_SKY_RUNTIME"]))
os.environ["SKY_RUNTIME_DIR"] = os.environ["RLBOOST_TEST_SKY_RUNTIME"]

import sky  # noqa: E402  (after the environment above)
from sky import skypilot_config  # noqa: E402
from sky.server.common import RequestId  # noqa: E402


def _acc(value: Any) -> str | None:
    """'V100' / 'V100:1' / {'V100': 1} -> 'V100:1'."""
    if value is None:
        return None
    if isinstance(value, dict):
        (name, n), = value.items()
        return f"{name}:{int(n)}"
    name, _, n = str(value).partition(":")
    return f"{name}:{int(n or 1)}"


@dataclass
class FakeCluster:
    name: str
    status: str  # UP | INIT | STOPPED
    task: dict[str, Any]
    labels: dict[str, str]
    identity: Any  # aws.remote_identity in the client config at launch
    autostop: int | None
    down_on_idle: bool


@dataclass
class StatusRecord:
    """The fields of sky's StatusResponse that rlboost reads."""

    name: str
    status: Any
    labels: dict[str, str]
    cloud: str | None = None
    region: str | None = None


@dataclass
class _Request:
    fn: Callable[[], Any]
    ready_at: float
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    cancelled: bool = False


@dataclass
class FakeSky:
    latency_s: float = 0.02
    clusters: dict[str, FakeCluster] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    no_capacity: list[Callable[[dict[str, Any]], bool]] = field(default_factory=list)
    leave_init_on_failure: bool = True
    status_script: dict[str, list[str | None]] = field(default_factory=dict)
    failing_downs: dict[str, int] = field(default_factory=dict)
    launch_latency_s: float | None = None
    endpoint: str | None = None  # what sky.endpoints answers (default: a made-up private address)

    def __post_init__(self) -> None:
        self.lock = threading.RLock()
        self.requests: dict[str, _Request] = {}

    # ---- scripting ---------------------------------------------------------------------
    def refuse(self, *, cloud: str | None = None, accelerator: str | None = None) -> None:
        """Launches matching cloud/accelerator fail with ResourcesUnavailableError."""

        def match(res: dict[str, Any]) -> bool:
            return (cloud is None or res.get("cloud") == cloud) and (
                accelerator is None or _acc(res.get("accelerators")) == _acc(accelerator)
            )

        self.no_capacity.append(match)

    def preempt(self, name: str, how: str | None = None) -> None:
        """The cloud takes the cluster: gone (None), or left INIT/STOPPED."""
        with self.lock:
            if how is None:
                self.clusters.pop(name, None)
            else:
                self.clusters[name].status = how

    def live(self) -> list[str]:
        with self.lock:
            return sorted(self.clusters)

    def snapshot(self) -> dict[str, str]:
        """Each cluster's status now (a copy: safe while the controller's threads launch and down)."""
        with self.lock:
            return {name: c.status for name, c in self.clusters.items()}

    # ---- the SDK surface ---------------------------------------------------------------
    def _request(self, fn: Callable[[], Any], latency: float | None = None) -> RequestId:
        rid = RequestId(uuid.uuid4().hex)
        with self.lock:
            self.requests[rid] = _Request(fn, time.monotonic() + (self.latency_s if latency is None else latency))
        return rid

    def launch(self, task: Any, cluster_name: str | None = None, **kw: Any) -> RequestId:
        assert isinstance(task, sky.Task), "rlboost must hand SkyPilot a validated sky.Task"
        full = task.to_yaml_config()
        # the YAML rlboost generated, as SkyPilot kept it (tests validate it against the schema)
        cfg = yaml.safe_load(full["_user_specified_yaml"]) if full.get("_user_specified_yaml") else full
        identity = skypilot_config.get_nested(("aws", "remote_identity"), None)
        self.calls.append(("launch", (cluster_name, cfg, identity, kw)))
        res = cfg.get("resources") or {}
        name = str(cluster_name)

        def run() -> tuple[int, None]:
            with self.lock:
                labels = dict(res.get("labels") or {})
                c = FakeCluster(
                    name, "INIT", cfg, labels, identity, kw.get("idle_minutes_to_autostop"), bool(kw.get("down"))
                )
                self.clusters[name] = c
                if any(m(res) for m in self.no_capacity):
                    if not self.leave_init_on_failure:
                        del self.clusters[name]
                    raise sky.exceptions.ResourcesUnavailableError(
                        f"Failed to acquire resources in all zones for {res.get('accelerators')} on {res.get('cloud')}"
                    )
                c.status = "UP"
            return 1, None

        return self._request(run, self.launch_latency_s)

    def status(self, cluster_names: list[str] | None = None, refresh: Any = None, **kw: Any) -> RequestId:
        self.calls.append(("status", (cluster_names, refresh)))

        def run() -> list[StatusRecord]:
            with self.lock:
                if refresh == sky.StatusRefreshMode.FORCE:
                    for name, seq in self.status_script.items():
                        if (cluster_names is None or name in cluster_names) and seq and name in self.clusters:
                            nxt = seq.pop(0)
                            self.preempt(name, nxt)
                recs = []
                for c in self.clusters.values():
                    if cluster_names is None or c.name in cluster_names:
                        res = c.task.get("resources") or {}
                        st = sky.ClusterStatus(c.status)
                        recs.append(StatusRecord(c.name, st, c.labels, res.get("cloud"), res.get("region")))
                return recs

        return self._request(run)

    def down(self, cluster_name: str, purge: bool = False, **kw: Any) -> RequestId:
        self.calls.append(("down", cluster_name))

        def run() -> None:
            with self.lock:
                if self.failing_downs.get(cluster_name, 0) > 0:
                    self.failing_downs[cluster_name] -= 1
                    raise sky.exceptions.NetworkError(f"transient error downing {cluster_name}")
                if cluster_name not in self.clusters:
                    raise sky.exceptions.ClusterDoesNotExist(f"Cluster {cluster_name!r} does not exist.")
                del self.clusters[cluster_name]

        return self._request(run)

    def endpoints(self, cluster: str, port: int | str | None = None) -> RequestId:
        self.calls.append(("endpoints", (cluster, port)))

        def run() -> dict[int, str]:
            with self.lock:
                if cluster not in self.clusters or self.clusters[cluster].status != "UP":
                    raise sky.exceptions.ClusterNotUpError(f"cluster {cluster} is not up", None)
            return {int(port or 0): self.endpoint or f"10.0.0.{len(cluster) % 200}:{port}"}

        return self._request(run)

    def cancel(self, cluster_name: str, all: bool = False, **kw: Any) -> RequestId:
        self.calls.append(("cancel", (cluster_name, all)))

        def run() -> None:
            with self.lock:
                if cluster_name not in self.clusters:
                    raise sky.exceptions.ClusterDoesNotExist(f"Cluster {cluster_name!r} does not exist.")

        return self._request(run)

    def api_cancel(self, request_ids: Any = None, silent: bool = False, **kw: Any) -> RequestId:
        ids = request_ids if isinstance(request_ids, list) else [request_ids]
        with self.lock:
            for rid in ids:
                r = self.requests.get(rid)
                if r is not None and not r.done:
                    r.cancelled = True
        return self._request(lambda: list(ids))

    def get(self, request_id: str) -> Any:
        with self.lock:
            r = self.requests[request_id]
        delay = r.ready_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        with self.lock:
            if not r.done:
                r.done = True
                if r.cancelled:
                    r.error = sky.exceptions.RequestCancelled(f"request {request_id} cancelled")
                else:
                    try:
                        r.result = r.fn()
                    except Exception as e:
                        r.error = e
        if r.error is not None:
            raise r.error
        return r.result


# For a controller in another process (RLBOOST_SKY_SDK=tests.sky_fake:SDK): its own fake cloud.
SDK = FakeSky()
