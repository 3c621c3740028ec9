"""The Provider contract, passed by every provider: local (real processes), SkyPilot (fake `sky` SDK),
AWS (moto) and GCP (the real client against a local Compute Engine REST server)."""

from __future__ import annotations

import time
import uuid

import pytest

from rlboost.providers.base import CapacityError, InstanceState, Owner, Provider, Role
from tests.cloud_worlds import WORLDS, World


@pytest.fixture(params=sorted(WORLDS))
def world(request, tmp_path):
    job = f"ct{uuid.uuid4().hex[:6]}"
    with WORLDS[request.param](tmp_path, job) as w:
        yield w


def states(events, iid: str) -> list[InstanceState]:
    return [e.state for e in events if e.instance_id == iid]


def test_is_a_provider(world: World):
    p = world.provider()
    assert isinstance(p, Provider)
    assert p.name == world.name


def test_launch_returns_at_once_then_reports_running_and_is_listed(world: World):
    p = world.provider()
    req = world.request(1)
    t0 = time.monotonic()
    p.launch(req)
    assert time.monotonic() - t0 < 2.0, "launch must not wait for the instance"
    evs = world.wait(p, lambda e: InstanceState.RUNNING in states(e, req.instance_id))
    assert not any(s.terminal for s in states(evs, req.instance_id))
    assert req.instance_id in p.list_owned(world.owner)
    assert req.instance_id not in p.list_owned(Owner(world.job + "x", 1, "uid-x"))  # another job never claims it


def test_trainer_reports_its_endpoint(world: World):
    p = world.provider()
    req = world.request(0, Role.TRAINER)
    p.launch(req)
    evs = world.wait(p, lambda e: any(x.endpoint for x in e if x.instance_id == req.instance_id))
    ep = next(x.endpoint for x in evs if x.endpoint)
    assert ep.startswith("http://") and ":" in ep.removeprefix("http://")


def test_terminate_is_confirmed_idempotent_and_ignores_unknown_ids(world: World):
    p = world.provider()
    req = world.request(1)
    p.launch(req)
    world.wait(p, lambda e: InstanceState.RUNNING in states(e, req.instance_id))
    p.terminate(req.instance_id)
    p.terminate(req.instance_id)
    p.terminate(f"{world.job}-1-w999")  # never launched
    world.wait(p, lambda e: InstanceState.TERMINATED in states(e, req.instance_id))
    world.wait_unlisted(p, req.instance_id)


def test_no_capacity_is_a_capacity_error_and_leaves_nothing(world: World):
    p = world.provider()
    world.refuse()
    req = world.request(1)
    try:
        p.launch(req)
    except CapacityError:
        pass  # refused at once
    else:  # refused after the request was accepted: a FAILED event flagged as capacity
        evs = world.wait(p, lambda e: any(x.state is InstanceState.FAILED for x in e))
        failed = [x for x in evs if x.instance_id == req.instance_id and x.state is InstanceState.FAILED]
        assert failed and failed[0].capacity, failed
    world.wait_unlisted(p, req.instance_id)


def test_preemption_is_reported_and_the_instance_goes(world: World):
    p = world.provider()
    req = world.request(1)
    p.launch(req)
    world.wait(p, lambda e: InstanceState.RUNNING in states(e, req.instance_id))
    world.preempt(req.instance_id)
    world.wait(p, lambda e: InstanceState.PREEMPTED in states(e, req.instance_id))
    world.wait_unlisted(p, req.instance_id)


def test_a_restarted_controller_finds_and_removes_what_it_did_not_know(world: World):
    first = world.provider()
    reqs = [world.request(1), world.request(2), world.request(0, Role.TRAINER)]
    for r in reqs:
        first.launch(r)
    world.wait(first, lambda e: all(InstanceState.RUNNING in states(e, r.instance_id) for r in reqs))
    # the controller dies; a new one knows nothing but the job's name
    second = world.provider()
    owned = second.list_owned(world.owner)
    assert sorted(r.instance_id for r in reqs) == owned
    for iid in owned:
        second.terminate(iid)
    for iid in owned:
        world.wait_unlisted(second, iid)


def test_clock_is_monotonic(world: World):
    p = world.provider()
    a = p.clock()
    time.sleep(0.01)
    assert p.clock() >= a
