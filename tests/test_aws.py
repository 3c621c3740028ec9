"""The AWS provider with moto: what run_instances is asked for, live spot prices, capacity errors
(real botocore ClientErrors), spot reclamation, and finding a job's instances by tag."""

from __future__ import annotations

import base64
import csv
from datetime import datetime, timezone

import pytest

from rlboost.providers.base import CapacityError, InstanceState, Role
from tests.cloud_worlds import assert_no_secret, aws_world, client_error, launch_through_controller
from tests.sky_fake import PRICES


@pytest.fixture
def world(tmp_path):
    with aws_world(tmp_path, "demo") as w:
        yield w


def instances(world, **flt):
    ec2 = world.session.client("ec2")
    filters = [{"Name": k, "Values": [v]} for k, v in flt.items()]
    return [i for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]


def test_worker_is_a_tagged_spot_instance_with_imdsv2_and_a_bootstrap(world):
    p = world.provider()
    p.launch(world.request(1))
    (inst,) = instances(world, **{"tag:rlboost-instance": "demo-1-w001"})
    assert inst["InstanceType"] == "p3.2xlarge"  # V100:1, from the catalog
    assert inst.get("InstanceLifecycle") == "spot"
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert tags["rlboost-job"] == "demo" and tags["rlboost-role"] == "worker"
    assert tags["rlboost-job-uid"] == "uid-demo" and tags["rlboost-store"] == "store-test"
    assert inst["MetadataOptions"]["HttpTokens"] == "required"  # IMDSv2: the notice watcher uses a token
    ud = world.session.client("ec2").describe_instance_attribute(InstanceId=inst["InstanceId"], Attribute="userData")
    script = base64.b64decode(ud["UserData"]["Value"]).decode()
    assert "export RLBOOST_TRAINER_URL=http://t:1" in script and "export RLBOOST_NOTICE=ec2-imds" in script
    assert "export RLBOOST_WORKER_ID=demo-1-w001" in script and "python -m rlboost.worker" in script
    assert "AWS_SECRET" not in script and "AWS_ACCESS" not in script  # no credentials on the node
    sd = world.session.client("ec2").describe_instance_attribute(
        InstanceId=inst["InstanceId"], Attribute="instanceInitiatedShutdownBehavior"
    )
    assert sd["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"


def test_trainer_is_on_demand_with_its_port_open_and_an_endpoint(world):
    p = world.provider()
    p.launch(world.request(0, Role.TRAINER))
    (inst,) = instances(world, **{"tag:rlboost-instance": "demo-1-trainer"})
    assert inst.get("InstanceLifecycle") is None and inst["InstanceType"] == "p4d.24xlarge"
    (sg,) = world.session.client("ec2").describe_security_groups(GroupIds=[inst["SecurityGroups"][0]["GroupId"]])[
        "SecurityGroups"
    ]
    assert any(r["FromPort"] == 8787 for r in sg["IpPermissions"])
    evs = world.wait(p, lambda e: any(x.endpoint for x in e))
    assert next(x.endpoint for x in evs if x.endpoint) == f"http://{inst['PublicIpAddress']}:8787"
    ud = world.session.client("ec2").describe_instance_attribute(InstanceId=inst["InstanceId"], Attribute="userData")
    script = base64.b64decode(ud["UserData"]["Value"]).decode()
    spec_b64 = script.split("export RLBOOST_SPEC_B64=")[1].split("\n")[0]
    assert base64.b64decode(spec_b64).decode().startswith("name: demo")  # the job file rides along


def test_user_data_holds_no_token_key_or_secret(world, tmp_path):
    """What anyone allowed to describe the instance reads (and every process on the node, through the
    metadata service): the user-data as EC2 stores it, for the trainer and a spot worker of a TLS job
    launched by the real controller with a secret `--env`."""
    launch_through_controller(world, tmp_path, "A100:8")
    ec2 = world.session.client("ec2")
    scripts = {}
    for role in ("trainer", "worker"):
        (inst,) = instances(world, **{"tag:rlboost-role": role})
        ud = ec2.describe_instance_attribute(InstanceId=inst["InstanceId"], Attribute="userData")
        scripts[role] = base64.b64decode(ud["UserData"]["Value"]).decode()
        assert_no_secret(scripts[role], f"{role}'s user-data")
        assert "export PLAIN_SETTING=shown" in scripts[role]  # plain job variables still ride along
    assert "export RLBOOST_ENROL_COMMITMENT=" in scripts["trainer"]  # what it proves itself with
    assert "export RLBOOST_ENROL=demo-1-w001." in scripts["worker"]  # what it trades once for the token
    assert "RLBOOST_TLS_FINGERPRINT" not in scripts["trainer"]  # it makes its own certificate


@pytest.mark.parametrize("code", ["InsufficientInstanceCapacity", "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded"])
def test_capacity_codes_are_capacity_errors(world, code):
    world.session.events.register("before-call.ec2.RunInstances", client_error(code, "no capacity"))
    with pytest.raises(CapacityError, match=code):
        world.provider().launch(world.request(1))
    assert instances(world) == []


def test_other_errors_are_clear_provider_errors(world):
    from rlboost.providers.base import ProviderError

    world.session.events.register("before-call.ec2.RunInstances", client_error("UnauthorizedOperation", "denied"))
    with pytest.raises(ProviderError, match="UnauthorizedOperation"):
        world.provider().launch(world.request(1))


def test_spot_reclamation_is_a_preemption_and_power_off_is_an_exit(world):
    p = world.provider()
    p.launch(world.request(1))
    p.launch(world.request(2))
    world.wait(p, lambda e: sum(x.state is InstanceState.RUNNING for x in e) == 2)
    world.preempt("demo-1-w001")
    (i2,) = instances(world, **{"tag:rlboost-instance": "demo-1-w002"})
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.instances import StateReason

    inst = ec2_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].get_instance(i2["InstanceId"])
    inst.terminate()  # the worker ended and ran `shutdown -h now`
    inst.state_reason = StateReason("Client.InstanceInitiatedShutdown: Instance initiated shutdown",
                                    "Client.InstanceInitiatedShutdown")
    evs = world.wait(p, lambda e: any(x.state.terminal for x in e if x.instance_id == "demo-1-w002"))
    ends = {x.instance_id: x.state for x in evs if x.state.terminal}
    assert ends == {"demo-1-w001": InstanceState.PREEMPTED, "demo-1-w002": InstanceState.EXITED}


def test_live_spot_price_through_describe_spot_price_history(world):
    from rlboost.providers.aws import AwsLivePrices, AwsProvider

    p: AwsProvider = world.provider()
    # moto's own answer: a price per offered zone
    assert p.spot_price("p3dn.24xlarge", "us-east-1") is not None
    # the real API's answer, replayed from recorded history (p3.2xlarge, us-east-1, early 2020)
    rows = [r for r in csv.DictReader((PRICES / "aws_spot_price_history_p2_p3_2020.csv").open())
            if r["InstanceType"] == "p3.2xlarge" and r["AvailabilityZone"].startswith("us-east-1")]
    assert rows
    hist = [
        {"AvailabilityZone": r["AvailabilityZone"], "InstanceType": r["InstanceType"],
         "ProductDescription": "Linux/UNIX", "SpotPrice": r["SpotPrice"],
         "Timestamp": datetime.fromisoformat(r["Timestamp"].replace("Z", "+00:00")).astimezone(timezone.utc)}
        for r in rows
    ]
    latest: dict[str, tuple] = {}
    for h in hist:
        if h["AvailabilityZone"] not in latest or h["Timestamp"] > latest[h["AvailabilityZone"]][0]:
            latest[h["AvailabilityZone"]] = (h["Timestamp"], float(h["SpotPrice"]))
    want = min(v[1] for v in latest.values())

    def recorded(**kwargs):
        class Http:
            status_code = 200

        return Http(), {"SpotPriceHistory": hist, "ResponseMetadata": {}}

    world.session.events.register("before-call.ec2.DescribeSpotPriceHistory", recorded)  # new clients
    p.client("us-east-1").meta.events.register("before-call.ec2.DescribeSpotPriceHistory", recorded)
    assert p.spot_price("p3.2xlarge", "us-east-1") == pytest.approx(want)
    prices = AwsLivePrices(session=world.session)
    assert prices("V100", "aws", "us-east-1", True) == pytest.approx(want)
    assert prices("V100", "aws", "us-east-1", False) == pytest.approx(3.06)  # on-demand: the catalog
    assert prices.sources["aws"].startswith("live spot prices")
