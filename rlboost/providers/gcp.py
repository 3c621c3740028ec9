"""GCP provider (google-cloud-compute): spot VMs for workers, an on-demand VM for the trainer.

For users who do not run SkyPilot. Workers are `provisioning_model=SPOT` with
`instance_termination_action=DELETE` (a preempted worker deletes itself and stops billing), a
startup script (rlboost/templates/node_boot.sh) and labels naming the job and the instance, by which
`list_owned` finds what a job still holds. The trainer gets a network tag that one firewall rule
opens on the trainer port.

`insert` returns an operation at once; zone operations are checked in `poll` (capacity errors such as
ZONE_RESOURCE_POOL_EXHAUSTED arrive there, and the next zone of the region is tried on the next
launch). The zone operations client is our own, built with the same endpoint, so a test server (or a
private endpoint) sees every call.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlboost.contracts.env_names import Env
from rlboost.contracts.provider_kinds import provider_kind
from rlboost.providers.base import (
    INSTANCE_TAG,
    JOB_TAG,
    UID_TAG,
    CapacityError,
    InstanceEvent,
    InstanceState,
    LaunchRequest,
    Owner,
    ProviderError,
    Role,
    Tagged,
)
from rlboost.providers.bootstrap import TRAINER_PORT, boot_script, boot_size_problems
from rlboost.providers.credentials import gcp_project
from rlboost.providers.prices import placements

if TYPE_CHECKING:
    from rlboost.contracts.spec import JobSpec

log = logging.getLogger("rlboost.gcp")

CAPACITY_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED", "RESOURCE_POOL_EXHAUSTED", "QUOTA_EXCEEDED", "STOCKOUT")
# GCP takes at most 256 KB in one metadata value (512 KB in all of them)
METADATA_VALUE_LIMIT = 256 * 1024
IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11-py310"
TRAINER_TAG = "rlboost-trainer"
NO_PROJECT = "credentials: no GCP project; set GOOGLE_CLOUD_PROJECT or `gcloud config set project`"


@dataclass(frozen=True)
class GcpOptions:
    """How the provider launches and watches: the boot image, the trainer's port, how often it lists
    the job's VMs, and how long a zone that refused capacity is skipped."""

    image: str = IMAGE
    port: int = TRAINER_PORT
    list_every_s: float = 5.0
    zone_cooldown_s: float = 120.0


class GcpProvider:
    name = "gcp"
    kind = provider_kind("gcp")

    @classmethod
    def setup_problems(cls) -> list[str]:
        """Besides the credentials, a project to launch in."""
        return [NO_PROJECT] if gcp_project() is None else []

    @classmethod
    def boot_data_problems(cls, requests: list[LaunchRequest], saved: str) -> list[str]:
        # the startup-script is the one metadata value: within GCP's 256 KB a value (512 KB in all)
        return boot_size_problems(requests, saved, limit=METADATA_VALUE_LIMIT, what="startup-script metadata")

    @classmethod
    def for_job(cls, spec: JobSpec, run_dir: Path, *, owner: Owner, market: Any = None) -> GcpProvider:
        """In the project gcloud (or GOOGLE_CLOUD_PROJECT) names; RLBOOST_GCP_IMAGE overrides the image."""
        from rlboost.providers import PreflightError

        project = gcp_project()
        if project is None:
            raise PreflightError(NO_PROJECT)
        return cls(run_dir, owner, project, options=GcpOptions(image=os.environ.get(Env.GCP_IMAGE, IMAGE)))

    def __init__(
        self,
        run_dir: Path,
        owner: Owner,
        project: str,
        *,
        credentials: Any = None,
        api_endpoint: str | None = None,
        options: GcpOptions | None = None,
    ) -> None:
        from google.api_core.client_options import ClientOptions
        from google.cloud import compute_v1

        self.compute = compute_v1
        opts = ClientOptions(api_endpoint=api_endpoint) if api_endpoint else None
        kw: dict[str, Any] = {"credentials": credentials, "client_options": opts, "transport": "rest"}
        self.instances = compute_v1.InstancesClient(**kw)
        self.zone_ops = compute_v1.ZoneOperationsClient(**kw)
        self.firewalls = compute_v1.FirewallsClient(**kw)
        self.run_dir = run_dir
        self.owner = owner
        self.project = project
        opt = options or GcpOptions()
        self.image = opt.image
        self.port = opt.port
        self.list_every_s = opt.list_every_s
        self.zone_cooldown_s = opt.zone_cooldown_s
        self.reqs: dict[str, LaunchRequest] = {}
        self.zones: dict[str, str] = {}  # iid -> zone
        self.ops: dict[str, tuple[str, str]] = {}  # iid -> (zone, insert operation name)
        self.cool: dict[str, float] = {}  # zone/accelerator -> until (monotonic)
        self.seen: set[str] = set()  # listed at least once
        self.last: dict[str, str] = {}
        self.terminating: set[str] = set()
        self.done: set[str] = set()
        self.next_list = 0.0
        self.events: list[InstanceEvent] = []

    # ---- Provider protocol -------------------------------------------------------------
    def clock(self) -> float:
        return time.time()

    def launch(self, req: LaunchRequest) -> str:
        from google.api_core import exceptions as gexc

        if not req.region:
            raise ProviderError(f"{req.instance_id}: the gcp provider needs a region")
        spot = req.kind.value == "spot"
        now = time.monotonic()
        offers = [
            o
            for o in placements(req.accelerator, "gcp", req.region, spot=spot)
            if o.zone and self.cool.get(f"{o.zone}/{req.accelerator}", 0) <= now
        ]
        if not offers:
            raise CapacityError(f"no zone of {req.region} offers {req.accelerator} right now (catalog, cooldowns)")
        zone, machine = offers[0].zone or "", offers[0].instance_type
        try:
            if req.role is Role.TRAINER:
                self._ensure_firewall()
            inst = self._instance(req, zone, machine)
            op = self.instances.insert(project=self.project, zone=zone, instance_resource=inst)
        except gexc.TooManyRequests as e:
            raise CapacityError(f"{zone}: {e.message}") from e
        except gexc.GoogleAPICallError as e:
            if any(c in str(e) for c in CAPACITY_CODES):
                self.cool[f"{zone}/{req.accelerator}"] = now + self.zone_cooldown_s
                raise CapacityError(f"{zone}: {e.message}") from e
            raise ProviderError(f"instances.insert in {zone} failed: {e.message}") from e
        self.reqs[req.instance_id] = req
        self.zones[req.instance_id] = zone
        self.ops[req.instance_id] = (zone, op.name)
        self.next_list = 0.0
        self._emit(req.instance_id, InstanceState.PENDING, f"{machine} in {zone}")
        return f"{zone}/{req.instance_id}"

    def poll(self) -> list[InstanceEvent]:
        if time.monotonic() >= self.next_list and (set(self.reqs) - self.done):
            self.next_list = time.monotonic() + self.list_every_s
            self._check_ops()
            self._refresh()
        out, self.events = self.events, []
        return out

    def terminate(self, instance_id: str) -> None:
        from google.api_core import exceptions as gexc

        if instance_id in self.terminating or instance_id in self.done:
            return
        zone = self.zones.get(instance_id) or self._owned(self.owner).get(instance_id)
        if zone is None:
            return
        self.zones[instance_id] = zone
        self.terminating.add(instance_id)
        self.next_list = 0.0
        with contextlib.suppress(gexc.NotFound):  # already gone: the next listing reports it
            self.instances.delete(project=self.project, zone=zone, instance=instance_id)

    def list_owned(self, owner: Owner) -> list[str]:
        return sorted(self._owned(owner))

    def list_tagged(self) -> list[Tagged]:
        found = self._list(f"labels.{INSTANCE_TAG}:*")
        return sorted((Tagged.of(inst.name, dict(inst.labels)) for _, inst in found), key=lambda t: t.instance_id)

    def exit_clock(self, instance_id: str) -> float | None:
        """A deleted VM is gone from the API at once (a preempted spot VM deletes itself): no record."""
        return None

    def adopt(self, req: LaunchRequest) -> bool:
        zone = self._owned(req.owner).get(req.instance_id)
        if zone is None:
            return False
        self.zones[req.instance_id], self.reqs[req.instance_id] = zone, req
        return True

    def close(self) -> None:
        pass

    # ---- helpers -----------------------------------------------------------------------
    def _instance(self, req: LaunchRequest, zone: str, machine: str) -> Any:
        c = self.compute
        spot = req.kind.value == "spot"
        script = boot_script(req, self.run_dir, port=self.port)
        sched = c.Scheduling(on_host_maintenance="TERMINATE", automatic_restart=not spot)
        if spot:
            sched.provisioning_model = "SPOT"
            sched.instance_termination_action = "DELETE"
        return c.Instance(
            name=req.instance_id,
            machine_type=f"zones/{zone}/machineTypes/{machine}",
            scheduling=sched,
            disks=[
                c.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=c.AttachedDiskInitializeParams(source_image=self.image, disk_size_gb=200),
                )
            ],
            network_interfaces=[
                c.NetworkInterface(
                    network="global/networks/default",
                    access_configs=[c.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")],
                )
            ],
            metadata=c.Metadata(items=[c.Items(key="startup-script", value=script)]),
            labels=req.tags,  # set at creation: a VM is never without its owner's uid
            tags=c.Tags(items=[TRAINER_TAG] if req.role is Role.TRAINER else []),
        )

    def _ensure_firewall(self) -> None:
        from google.api_core import exceptions as gexc

        name = f"rlboost-trainer-{self.port}"
        try:
            self.firewalls.get(project=self.project, firewall=name)
            return
        except gexc.NotFound:
            pass
        rule = self.compute.Firewall(
            name=name,
            network="global/networks/default",
            direction="INGRESS",
            allowed=[self.compute.Allowed(I_p_protocol="tcp", ports=[str(self.port)])],
            source_ranges=["0.0.0.0/0"],
            target_tags=[TRAINER_TAG],
            description="rlboost trainer port (workers dial home; every route needs the job token)",
        )
        with contextlib.suppress(gexc.Conflict):  # created meanwhile by another job
            self.firewalls.insert(project=self.project, firewall_resource=rule)

    def _owned(self, owner: Owner) -> dict[str, str]:
        """The job's instances (a stopped VM still bills its disk: it counts): name -> zone. Listed
        by the uid label (by name for a job recorded before uids), each checked against the owner."""
        found = self._list(_label_filter(owner))
        return {inst.name: zone for zone, inst in found if owner.owns(inst.name, inst.labels)}

    def _list(self, filter: str) -> list[tuple[str, Any]]:
        """(zone, instance) of every instance in the project matching the filter."""
        req = self.compute.AggregatedListInstancesRequest(project=self.project, filter=filter)
        return [
            (scope.rsplit("/", 1)[-1], inst)
            for scope, listed in self.instances.aggregated_list(request=req)
            for inst in listed.instances
        ]

    def _check_ops(self) -> None:
        for iid, (zone, name) in list(self.ops.items()):
            try:
                op = self.zone_ops.get(project=self.project, zone=zone, operation=name)
            except Exception as e:
                log.warning("zone operation %s: %s", name, e)
                continue
            if op.status != self.compute.Operation.Status.DONE:
                continue
            del self.ops[iid]
            errors = list(op.error.errors) if op.error else []
            if errors and iid not in self.terminating:
                codes = ",".join(e.code for e in errors)
                capacity = any(e.code in CAPACITY_CODES for e in errors)
                if capacity:
                    self.cool[f"{zone}/{self.reqs[iid].accelerator}"] = time.monotonic() + self.zone_cooldown_s
                self.done.add(iid)
                self._emit(iid, InstanceState.FAILED, f"{codes}: {errors[0].message}", capacity=capacity)

    def _refresh(self) -> None:
        try:
            listed = {i.name: i for _, i in self._list(_label_filter(self.owner)) if self.owner.owns(i.name, i.labels)}
        except Exception as e:
            log.warning("listing instances failed: %s", e)
            return
        for iid in list(self.reqs):
            if iid in self.done:
                continue
            inst = listed.get(iid)
            if inst is None:
                if iid in self.ops:
                    continue  # insert not done yet
                self._gone(iid, "deleted")
                continue
            self.seen.add(iid)
            status = str(inst.status)
            if status == self.last.get(iid):
                continue
            self.last[iid] = status
            if status == "RUNNING":
                ep = None
                if self.reqs[iid].role is Role.TRAINER:
                    nics = list(inst.network_interfaces)
                    ip = nics[0].access_configs[0].nat_i_p if nics and nics[0].access_configs else ""
                    ep = f"http://{ip or nics[0].network_i_p}:{self.port}" if nics else None
                self._emit(iid, InstanceState.RUNNING, f"{iid} running", endpoint=ep)
            elif status in ("STOPPING", "TERMINATED", "SUSPENDED"):
                self._gone(iid, status)
                if iid not in self.terminating:  # a stopped VM still bills its disk: delete it
                    self.terminate(iid)

    def _gone(self, iid: str, how: str) -> None:
        self.done.add(iid)
        if iid in self.terminating:
            self._emit(iid, InstanceState.TERMINATED, "deleted")
        elif self.reqs[iid].kind.value == "spot":
            self._emit(iid, InstanceState.PREEMPTED, f"spot VM {how} (preempted, or the node powered off)")
        else:
            self._emit(iid, InstanceState.EXITED, f"VM {how}")

    def _emit(
        self, iid: str, state: InstanceState, detail: str = "", endpoint: str | None = None, capacity: bool = False
    ) -> None:
        self.events.append(InstanceEvent(iid, state, self.clock(), detail, endpoint, capacity))


def _label_filter(owner: Owner) -> str:
    key, value = (UID_TAG, owner.uid) if owner.uid else (JOB_TAG, owner.name)
    return f'labels.{key} = "{value}"'
