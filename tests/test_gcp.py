"""The GCP provider: the real google-cloud-compute client over REST against a local server that
answers like Compute Engine. Checks what is asked for (SPOT + DELETE, startup script, labels,
firewall), zone exhaustion arriving in the operation, preemption, and listing by label."""

from __future__ import annotations

import pytest

from rlboost.providers.base import InstanceState, Owner, Role
from tests.cloud_worlds import assert_no_secret, gcp_world, launch_through_controller


@pytest.fixture
def world(tmp_path):
    with gcp_world(tmp_path, "demo") as w:
        yield w


def inserts(world) -> list[dict]:
    return [b for m, path, b in world.fake.bodies if m == "POST" and path.endswith("/instances")]


def test_worker_is_a_labelled_spot_vm_that_deletes_itself_on_preemption(world):
    p = world.provider()
    p.launch(world.request(1))
    (body,) = inserts(world)
    assert body["name"] == "demo-1-w001"
    assert body["scheduling"]["provisioningModel"] == "SPOT"
    assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert body["machineType"].endswith("/machineTypes/a2-highgpu-1g")  # A100:1, from the catalog
    assert body["labels"] == {
        "rlboost-job": "demo",
        "rlboost-job-uid": "uid-demo",
        "rlboost-store": "store-test",
        "rlboost-instance": "demo-1-w001",
        "rlboost-role": "worker",
    }
    (item,) = body["metadata"]["items"]
    assert item["key"] == "startup-script"
    assert "export RLBOOST_NOTICE=gce-metadata" in item["value"]
    assert "export RLBOOST_TRAINER_URL=http://t:1" in item["value"]
    assert "GOOGLE_APPLICATION_CREDENTIALS" not in item["value"]
    assert "serviceAccounts" not in body  # no cloud identity on worker nodes


def test_trainer_is_on_demand_behind_one_firewall_rule(world):
    p = world.provider()
    p.launch(world.request(0, Role.TRAINER))
    (body,) = inserts(world)
    assert "provisioningModel" not in body["scheduling"]
    assert body["tags"]["items"] == ["rlboost-trainer"]
    (rule,) = world.fake.firewalls.values()
    assert rule["targetTags"] == ["rlboost-trainer"] and rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["8787"]}]
    evs = world.wait(p, lambda e: any(x.endpoint for x in e))
    assert next(x.endpoint for x in evs if x.endpoint).startswith("http://34.")
    p.launch(world.request(0, Role.TRAINER).__class__(**{**world.request(0, Role.TRAINER).__dict__,
                                                          "instance_id": "demo-2-trainer"}))
    assert len(world.fake.firewalls) == 1  # reused, not duplicated


def test_startup_scripts_hold_no_token_key_or_secret(world, tmp_path):
    """The startup-script metadata (readable by anyone allowed to get the instance, and by every
    process on the VM), for the trainer and a spot worker of a TLS job launched by the real
    controller with a secret `--env`."""
    launch_through_controller(world, tmp_path, "A100:8")
    scripts = {}
    for body in inserts(world):
        (item,) = body["metadata"]["items"]
        scripts[body["labels"]["rlboost-role"]] = item["value"]
        assert_no_secret(item["value"], f"{body['name']}'s startup-script")
        assert "export PLAIN_SETTING=shown" in item["value"]
    assert set(scripts) == {"trainer", "worker"}
    assert "export RLBOOST_ENROL_COMMITMENT=" in scripts["trainer"]
    assert "export RLBOOST_ENROL=demo-1-w001." in scripts["worker"]


def test_an_exhausted_zone_fails_with_capacity_then_the_next_zone_is_tried(world):
    p = world.provider()
    world.fake.exhausted.add("us-central1-a")
    p.launch(world.request(1))
    evs = world.wait(p, lambda e: any(x.state is InstanceState.FAILED for x in e))
    failed = next(x for x in evs if x.state is InstanceState.FAILED)
    assert failed.capacity and "ZONE_RESOURCE_POOL_EXHAUSTED" in failed.detail
    p.launch(world.request(2))
    assert inserts(world)[-1]["machineType"].startswith("zones/us-central1-b/")
    world.wait(p, lambda e: any(x.state is InstanceState.RUNNING for x in e))


def test_preempted_vm_is_reported_and_a_restarted_controller_lists_by_label(world):
    p = world.provider()
    for n in (1, 2):
        p.launch(world.request(n))
    world.wait(p, lambda e: sum(x.state is InstanceState.RUNNING for x in e) == 2)
    world.fake.preempt("demo-1-w001")
    evs = world.wait(p, lambda e: any(x.state is InstanceState.PREEMPTED for x in e))
    assert [x.instance_id for x in evs if x.state is InstanceState.PREEMPTED] == ["demo-1-w001"]
    fresh = world.provider()
    assert fresh.list_owned(world.owner) == ["demo-1-w002"]
    assert fresh.list_owned(Owner("dem", 1, "uid-dem")) == []
    fresh.terminate("demo-1-w002")
    assert world.fake.live() == []
