"""AWS provider (boto3): EC2 spot instances for workers, an on-demand instance for the trainer.

For users who do not run SkyPilot. Each instance is a `run_instances` call with a user-data boot
script (rlboost/templates/node_boot.sh), spot market options for workers, IMDSv2 (the worker reads its
spot interruption notice from it), terminate-on-shutdown, and tags naming the job's uid, the store,
the job and the instance, by which `list_owned` finds everything a job still holds in the regions it
uses (by uid: never another job of the same name).

`launch` returns once EC2 accepted the request; `poll` describes the job's instances every
`describe_every_s` and turns state changes into events.
"""

from __future__ import annotations

import logging
import os
import re
import time
from datetime import datetime, timedelta, timezone
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
    job_regions,
)
from rlboost.providers.bootstrap import TRAINER_PORT, boot_script, boot_size_problems
from rlboost.providers.prices import CloudPrices, placements

if TYPE_CHECKING:
    from rlboost.contracts.spec import JobSpec

log = logging.getLogger("rlboost.aws")

# run_instances error codes that mean "no capacity here, try elsewhere later"
CAPACITY_CODES = {
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "SpotMaxPriceTooLow",
    "MaxSpotInstanceCountExceeded",
    "InsufficientFreeAddressesInSubnet",
    "VcpuLimitExceeded",
}
# a Deep Learning AMI with NVIDIA drivers; override with RLBOOST_AWS_AMI / ami=
DLAMI_PARAM = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
LIVE = ["pending", "running", "stopping", "stopped", "shutting-down"]
# EC2 takes at most 16 KB of user-data, counted before the base64 encoding boto3 adds
USER_DATA_LIMIT = 16 * 1024


class AwsProvider:
    name = "aws"
    kind = provider_kind("aws")

    @classmethod
    def setup_problems(cls) -> list[str]:
        return []  # nothing beyond its clouds' credentials, which preflight checks

    @classmethod
    def boot_data_problems(cls, requests: list[LaunchRequest], saved: str) -> list[str]:
        return boot_size_problems(requests, saved, limit=USER_DATA_LIMIT, what="EC2 user-data")

    @classmethod
    def for_job(cls, spec: JobSpec, run_dir: Path, *, owner: Owner, market: Any = None) -> AwsProvider:
        """In the regions the job names for aws; RLBOOST_AWS_AMI overrides the Deep Learning AMI."""
        return cls(run_dir, owner, job_regions(spec, "aws"), ami=os.environ.get(Env.AWS_AMI))

    def __init__(
        self,
        run_dir: Path,
        owner: Owner,
        regions: list[str],
        *,
        session: Any = None,
        ami: str | None = None,
        port: int = TRAINER_PORT,
        describe_every_s: float = 5.0,
    ) -> None:
        import boto3

        self.run_dir = run_dir
        self.owner = owner
        self.regions = sorted(set(regions))
        self.session = session or boto3.Session()
        self.ami = ami
        self.port = port
        self.describe_every_s = describe_every_s
        self._clients: dict[str, Any] = {}
        self._amis: dict[str, str] = {}
        self.reqs: dict[str, LaunchRequest] = {}
        self.ec2_ids: dict[str, tuple[str, str]] = {}  # iid -> (region, EC2 instance id)
        self.last: dict[str, str] = {}  # iid -> last EC2 state reported
        self.terminating: set[str] = set()
        self.done: set[str] = set()  # terminal event emitted
        self.next_describe = 0.0
        self.events: list[InstanceEvent] = []

    # ---- helpers -----------------------------------------------------------------------
    def client(self, region: str) -> Any:
        if region not in self._clients:
            self._clients[region] = self.session.client("ec2", region_name=region)
        return self._clients[region]

    def _image(self, region: str) -> str:
        if self.ami:
            return self.ami
        if region not in self._amis:
            try:
                ssm = self.session.client("ssm", region_name=region)
                self._amis[region] = ssm.get_parameter(Name=DLAMI_PARAM)["Parameter"]["Value"]
            except Exception as e:
                raise ProviderError(
                    f"cannot look up the Deep Learning AMI in {region} ({e}); set RLBOOST_AWS_AMI"
                ) from e
        return self._amis[region]

    def instance_type(self, req: LaunchRequest) -> str:
        offers = placements(req.accelerator, "aws", req.region, spot=req.kind.value == "spot")
        if not offers:
            raise CapacityError(f"no AWS instance type with {req.accelerator} in {req.region} (per the catalog)")
        return offers[0].instance_type

    def spot_price(self, instance_type: str, region: str) -> float | None:
        """Live: the lowest current spot price of this type across the region's zones."""
        hist = self.client(region).describe_spot_price_history(
            InstanceTypes=[instance_type],
            ProductDescriptions=["Linux/UNIX"],
            StartTime=datetime.now(timezone.utc) - timedelta(hours=1),
        )["SpotPriceHistory"]
        return _latest_min(hist)

    def _trainer_sg(self, region: str, ec2: Any) -> str:
        """A security group with the trainer's one port open (every route needs the job token)."""
        name = f"rlboost-{self.owner.name}-trainer"
        found = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [name]}])["SecurityGroups"]
        if found:
            return found[0]["GroupId"]
        sg = ec2.create_security_group(
            GroupName=name,
            Description="rlboost trainer port (workers dial home)",
            TagSpecifications=[
                {"ResourceType": "security-group", "Tags": [{"Key": JOB_TAG, "Value": self.owner.name}]}
            ],
        )["GroupId"]
        ec2.authorize_security_group_ingress(
            GroupId=sg,
            IpPermissions=[
                {"IpProtocol": "tcp", "FromPort": self.port, "ToPort": self.port, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}
            ],
        )
        return sg

    # ---- Provider protocol -------------------------------------------------------------
    def clock(self) -> float:
        return time.time()

    def launch(self, req: LaunchRequest) -> str:
        from botocore.exceptions import BotoCoreError, ClientError

        if not req.region:
            raise ProviderError(f"{req.instance_id}: the aws provider needs a region")
        ec2 = self.client(req.region)
        spot = req.kind.value == "spot"
        args: dict[str, Any] = {
            "ImageId": self._image(req.region),
            "InstanceType": self.instance_type(req),
            "MinCount": 1,
            "MaxCount": 1,
            "UserData": boot_script(req, self.run_dir, port=self.port),
            "InstanceInitiatedShutdownBehavior": "terminate",  # the node powers off when done
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},  # IMDSv2
            # tagged at creation, atomically: an instance is never without its owner's uid
            "TagSpecifications": [
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": "Name", "Value": req.instance_id}]
                    + [{"Key": k, "Value": v} for k, v in req.tags.items()],
                }
            ],
        }
        if spot:
            args["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        try:
            if req.role is Role.TRAINER:
                args["SecurityGroupIds"] = [self._trainer_sg(req.region, ec2)]
            out = ec2.run_instances(**args)
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in CAPACITY_CODES:
                raise CapacityError(f"{code} in {req.region}: {e}") from e
            raise ProviderError(f"run_instances failed in {req.region} ({code}): {e}") from e
        except BotoCoreError as e:
            raise ProviderError(f"run_instances failed in {req.region}: {e}") from e
        inst = out["Instances"][0]
        self.reqs[req.instance_id] = req
        self.ec2_ids[req.instance_id] = (req.region, inst["InstanceId"])
        self.next_describe = 0.0
        self._emit(req.instance_id, InstanceState.PENDING, f"{inst['InstanceId']} ({args['InstanceType']})")
        return f"{req.region}/{inst['InstanceId']}"

    def poll(self) -> list[InstanceEvent]:
        if time.monotonic() >= self.next_describe and (set(self.ec2_ids) - self.done):
            self.next_describe = time.monotonic() + self.describe_every_s
            self._describe()
        out, self.events = self.events, []
        return out

    def terminate(self, instance_id: str) -> None:
        if instance_id in self.terminating or instance_id in self.done:
            return
        where = self.ec2_ids.get(instance_id) or self._find(instance_id)
        if where is None:
            return
        region, ec2_id = where
        self.ec2_ids[instance_id] = where
        self.client(region).terminate_instances(InstanceIds=[ec2_id])
        self.terminating.add(instance_id)
        self.next_describe = 0.0

    def list_owned(self, owner: Owner) -> list[str]:
        return sorted(self._owned(owner))

    def list_tagged(self) -> list[Tagged]:
        flt = [{"Name": "tag-key", "Values": [INSTANCE_TAG]}]
        found = [inst for _, inst in self._describe_live(flt) if inst["State"]["Name"] != "shutting-down"]
        return sorted((Tagged.of(_tag(i, INSTANCE_TAG) or "", _tags(i)) for i in found), key=lambda t: t.instance_id)

    def exit_clock(self, instance_id: str) -> float | None:
        """EC2 keeps a terminated instance listed for about an hour, with the time of the user's
        terminate call in its StateTransitionReason ("User initiated (2026-11-27 10:00:00 GMT)")."""
        for region in self.regions:
            flt = [{"Name": f"tag:{INSTANCE_TAG}", "Values": [instance_id]}]
            for r in self.client(region).describe_instances(Filters=flt)["Reservations"]:
                for inst in r["Instances"]:
                    if inst["State"]["Name"] in LIVE or not self.owner.owns(instance_id, _tags(inst)):
                        continue
                    m = _GMT.search(inst.get("StateTransitionReason") or "")
                    if m:
                        at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
                        return at.timestamp()
        return None

    def adopt(self, req: LaunchRequest) -> bool:
        where = self._find(req.instance_id)
        if where is None:
            return False
        self.ec2_ids[req.instance_id], self.reqs[req.instance_id] = where, req
        return True

    def close(self) -> None:
        pass

    # ---- describing --------------------------------------------------------------------
    def _describe_live(self, filters: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        """(region, instance) of every live instance matching `filters` in the provider's regions."""
        out = []
        flt = [*filters, {"Name": "instance-state-name", "Values": LIVE}]
        for region in self.regions:
            for page in self.client(region).get_paginator("describe_instances").paginate(Filters=flt):
                for res in page["Reservations"]:
                    out.extend((region, inst) for inst in res["Instances"])
        return out

    def _owned(self, owner: Owner) -> dict[str, tuple[str, str]]:
        """The job's live instances: iid -> (region, EC2 id). Listed by the uid tag (by name for a
        job recorded before uids), then each checked against the owner whole."""
        key, value = (UID_TAG, owner.uid) if owner.uid else (JOB_TAG, owner.name)
        out = {}
        for region, inst in self._describe_live([{"Name": f"tag:{key}", "Values": [value]}]):
            iid = _tag(inst, INSTANCE_TAG)
            if iid and inst["State"]["Name"] != "shutting-down" and owner.owns(iid, _tags(inst)):
                out[iid] = (region, inst["InstanceId"])
        return out

    def _find(self, iid: str) -> tuple[str, str] | None:
        """This job's live instance named `iid` (another job's of the same name, in this store or
        another, is never found: instance ids repeat across stores)."""
        for region, inst in self._describe_live([{"Name": f"tag:{INSTANCE_TAG}", "Values": [iid]}]):
            if self.owner.owns(iid, _tags(inst)):
                return region, inst["InstanceId"]
        return None

    def _describe(self) -> None:
        by_region: dict[str, list[str]] = {}
        for iid, (region, ec2_id) in self.ec2_ids.items():
            if iid not in self.done:
                by_region.setdefault(region, []).append(ec2_id)
        back = {v: k for k, v in self.ec2_ids.items()}
        for region, ids in by_region.items():
            try:
                res = self.client(region).describe_instances(InstanceIds=ids)["Reservations"]
            except Exception as e:  # transient: try again next round
                log.warning("describe_instances in %s failed: %s", region, e)
                continue
            for r in res:
                for inst in r["Instances"]:
                    iid = back.get((region, inst["InstanceId"]))
                    if iid is not None:
                        self._update(iid, inst)

    def _update(self, iid: str, inst: dict[str, Any]) -> None:
        state = inst["State"]["Name"]
        if state == self.last.get(iid):
            return
        self.last[iid] = state
        req = self.reqs.get(iid)
        reason = (inst.get("StateReason") or {}).get("Code", "")
        if state == "running":
            ep = None
            if req is not None and req.role is Role.TRAINER:
                ip = inst.get("PublicIpAddress") or inst.get("PrivateIpAddress")
                ep = f"http://{ip}:{self.port}" if ip else None
            self._emit(iid, InstanceState.RUNNING, f"{inst['InstanceId']} running", endpoint=ep)
        elif state in ("shutting-down", "terminated", "stopping", "stopped"):
            self.done.add(iid)
            if iid in self.terminating:
                self._emit(iid, InstanceState.TERMINATED, "terminated")
            elif "InstanceInitiatedShutdown" in reason:
                self._emit(iid, InstanceState.EXITED, f"the node powered off ({reason})")
            elif (req is not None and req.kind.value == "spot") or "Spot" in reason:
                self._emit(iid, InstanceState.PREEMPTED, f"spot instance reclaimed ({reason or state})")
            else:
                self._emit(iid, InstanceState.FAILED, f"instance {state} ({reason})")
            if state in ("stopping", "stopped"):  # a stopped spot node still bills its disk: remove it
                self.client(self.ec2_ids[iid][0]).terminate_instances(InstanceIds=[inst["InstanceId"]])

    def _emit(self, iid: str, state: InstanceState, detail: str = "", endpoint: str | None = None) -> None:
        self.events.append(InstanceEvent(iid, state, self.clock(), detail, endpoint))


def _tag(inst: dict[str, Any], key: str) -> str | None:
    return next((t["Value"] for t in inst.get("Tags", []) if t["Key"] == key), None)


def _tags(inst: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}


_GMT = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) GMT\)")


class AwsLivePrices(CloudPrices):
    """Spot prices live from `describe_spot_price_history` (the catalog picks the instance type);
    on-demand prices, and spot where the live call fails, from the catalog."""

    def __init__(self, session: Any = None) -> None:
        super().__init__(use_skypilot=False)
        self.session = session
        self._ec2: dict[str, Any] = {}
        self._live = False

    LIVE = "live spot prices (describe_spot_price_history) + catalog on-demand"

    def __call__(self, accelerator: str | None, cloud: str, region: str | None, spot: bool) -> float | None:
        if not spot or cloud != "aws" or region is None:
            price = super().__call__(accelerator, cloud, region, spot)
            if self._live:
                self.sources["aws"] = self.LIVE
            return price
        offers = placements(accelerator, "aws", region, spot=True)
        if not offers:
            return None
        try:
            import boto3

            if region not in self._ec2:
                self._ec2[region] = (self.session or boto3.Session()).client("ec2", region_name=region)
            hist = self._ec2[region].describe_spot_price_history(
                InstanceTypes=[offers[0].instance_type],
                ProductDescriptions=["Linux/UNIX"],
                StartTime=datetime.now(timezone.utc) - timedelta(hours=1),
            )["SpotPriceHistory"]
        except Exception as e:  # no network or no permission: the catalog still prices it
            log.warning("live spot price for %s in %s unavailable (%s); using the catalog", accelerator, region, e)
            return super().__call__(accelerator, cloud, region, spot)
        price = _latest_min(hist)
        if price is None:
            return super().__call__(accelerator, cloud, region, spot)
        self._live = True
        self.sources["aws"] = self.LIVE
        return price


def _latest_min(hist: list[dict[str, Any]]) -> float | None:
    """The lowest of each zone's latest spot price."""
    latest: dict[str, float] = {}
    for h in sorted(hist, key=lambda h: h["Timestamp"]):
        latest[h["AvailabilityZone"]] = float(h["SpotPrice"])
    return min(latest.values()) if latest else None
