"""Ownership by identity: `gc`, `launch` and `down` touch only instances whose uid tag is that of a job
they own, never a name match; other stores' instances are listed, not touched, unless --all-stores.

Against moto (EC2 emulated in-process) with the real AwsProvider and the real `reconcile.gc`.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlboost.cli import reconcile
from rlboost.cli.pids import controller_alive, controller_identity, controller_tag, process_start
from rlboost.cli.state import StateStore
from rlboost.providers.aws import AwsProvider
from rlboost.providers.base import InstanceKind, InstanceState, LaunchRequest, Owner, Role
from tests.cloud_worlds import aws_world

NAME = "grpo-x"
LOCAL_SPEC = yaml.safe_dump({"name": "reused", "rollout": {"max_workers": 0}})
SPEC = {
    "name": NAME,
    "provider": "aws",
    "controller": "launcher",
    "trainer": {"cloud": "aws", "region": "us-east-1", "accelerators": "V100:1"},
    "rollout": {"candidates": [{"accelerator": "V100", "clouds": ["aws"], "regions": ["us-east-1"]}]},
}


@pytest.fixture
def world(tmp_path):
    with aws_world(tmp_path, NAME) as w:
        yield w


def _ami(world) -> str:
    return world.session.client("ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]


def _job(store: StateStore, status: str, *, alive: bool) -> int:
    """A job of NAME in `store`: `alive`, its controller is this very process (pid and start)."""
    jid = store.create_job(NAME, yaml.safe_dump(SPEC), "aws")
    store.update_job(jid, status=status, **(controller_identity() if alive else {"controller_pid": None}))
    return jid


def _launch(
    world,
    tmp: Path,
    store: StateStore,
    job_id: int,
    role: Role = Role.TRAINER,
    n: int = 1,
    controller: str | None = None,
) -> str:
    """Launch one instance of the job through the real provider, recorded first as the controller does
    (`controller`: the controller tag it carries, as a controller's launch tags it)."""
    job = store.job_by_id(job_id)
    owner = dataclasses.replace(reconcile.owner_of(store, job), controller=controller)
    iid = f"{NAME}-{job_id}-trainer" if role is Role.TRAINER else f"{NAME}-{job_id}-w{n:03d}"
    req = LaunchRequest(
        instance_id=iid,
        owner=owner,
        role=role,
        kind=InstanceKind.ON_DEMAND if role is Role.TRAINER else InstanceKind.SPOT,
        cloud="aws",
        region="us-east-1",
        accelerator="V100:1" if role is Role.TRAINER else "V100",
        hourly_price=3.0,
    )
    store.record_launch(job_id, req, "aws", 3.0)
    AwsProvider(tmp / "run", owner, ["us-east-1"], session=world.session, ami=_ami(world)).launch(req)
    return iid


def _state(world, iid: str) -> str:
    ec2 = world.session.client("ec2")
    flt = [{"Name": "tag:rlboost-instance", "Values": [iid]}]
    found = [i for r in ec2.describe_instances(Filters=flt)["Reservations"] for i in r["Instances"]]
    return found[0]["State"]["Name"] if found else "absent"


def test_gc_never_terminates_a_running_job_that_shares_its_name_with_an_ended_one(world, tmp_path, home):
    store = StateStore()
    old = _job(store, "running", alive=False)
    old_trainer = _launch(world, tmp_path, store, old)
    store.update_instance(old_trainer, InstanceState.RUNNING, 1.0)
    store.update_job(old, status="stopped")  # ended, with a record left live (teardown unconfirmed)
    new = _job(store, "running", alive=True)
    new_trainer = _launch(world, tmp_path, store, new)
    assert reconcile.controller_running(store.job_by_id(new))

    res = reconcile.gc(store, wait_s=5)

    assert _state(world, new_trainer) in ("pending", "running"), "gc terminated a running job's trainer"
    assert store.instance(new_trainer).state == "pending" and store.job_by_id(new).status == "running"
    assert _state(world, old_trainer) in ("shutting-down", "terminated")  # the ended job's leftover goes
    assert [r.terminated for r in res.jobs] == [[old_trainer]] and res.foreign == []
    # `launch` of the name again runs the same gc for the name: still never the running job's
    reconcile.gc(store, names=[NAME], wait_s=5)
    assert _state(world, new_trainer) in ("pending", "running")


def test_a_leftover_of_an_ended_job_found_by_its_uid_is_terminated(world, tmp_path, home):
    """A launch whose call failed after EC2 made the instance: the store says FAILED, the cloud runs it."""
    store = StateStore()
    jid = _job(store, "running", alive=False)
    iid = _launch(world, tmp_path, store, jid, Role.WORKER)
    store.update_instance(iid, InstanceState.FAILED, 1.0, "run_instances timed out")
    store.update_job(jid, status="failed")

    res = reconcile.gc(store, wait_s=5)

    assert _state(world, iid) in ("shutting-down", "terminated")
    assert [r.job for r in res.jobs] == [NAME] and res.foreign == []


def test_another_stores_instances_are_listed_and_left_alone_unless_all_stores(world, tmp_path, home):
    """Two machines share one AWS account; both ran a job named grpo-x (store ids 1 and 1)."""
    mine = StateStore(tmp_path / "me" / "state.db")
    colleague = StateStore(tmp_path / "colleague" / "state.db")
    theirs = _job(colleague, "running", alive=False)
    their_trainer = _launch(world, tmp_path, colleague, theirs)
    ended = _job(mine, "stopped", alive=False)
    assert ended == theirs  # the same name and the same store id: only the uid tells them apart

    res = reconcile.gc(mine, wait_s=5)

    assert _state(world, their_trainer) in ("pending", "running")
    assert res.jobs == [] and [f.instance.instance_id for f in res.foreign] == [their_trainer]
    assert res.foreign[0].instance.store == colleague.store_id != mine.store_id

    res = reconcile.gc(mine, wait_s=5, all_stores=True)

    assert _state(world, their_trainer) in ("shutting-down", "terminated")
    assert [r.terminated for r in res.foreign_ended] == [[their_trainer]]


def test_all_stores_keeps_another_stores_job_whose_controller_runs(world, tmp_path, home, capsys):
    """Two other stores on this machine: one job's controller runs (this very process), the other's
    exited. `gc --all-stores` ends only the dead one's instances and says why it kept the others."""
    from rlboost.cli.commands.gc import report_gc

    mine = StateStore(tmp_path / "me" / "state.db")
    live_store = StateStore(tmp_path / "live" / "state.db")
    dead_store = StateStore(tmp_path / "dead" / "state.db")
    live = _job(live_store, "running", alive=True)
    live_ids = [
        _launch(world, tmp_path, live_store, live, controller=controller_tag()),
        # launched by its controller before a resume: the job is judged whole, by its live controller
        _launch(world, tmp_path, live_store, live, Role.WORKER, controller=_exited_controller_tag()),
    ]
    _job(dead_store, "stopped", alive=False)  # so that its instance names differ from the live store's
    dead = _job(dead_store, "running", alive=False)
    dead_trainer = _launch(world, tmp_path, dead_store, dead, controller=_exited_controller_tag())
    _job(mine, "stopped", alive=False)  # this store used the same cloud and region

    res = reconcile.gc(mine, wait_s=5, all_stores=True)

    assert all(_state(world, i) in ("pending", "running") for i in live_ids), "ended a job whose controller runs"
    assert _state(world, dead_trainer) in ("shutting-down", "terminated")
    assert [r.terminated for r in res.foreign_ended] == [[dead_trainer]]
    assert sorted(k.foreign.instance.instance_id for k in res.foreign_kept) == sorted(live_ids)
    report_gc(res)
    out = " ".join(capsys.readouterr().out.split())  # as wrapped to the console's width
    for iid in live_ids:
        assert f"kept {iid}" in out and "is running on this machine" in out


def test_all_stores_keeps_a_job_whose_controller_is_on_another_machine_or_its_trainer_node():
    """A controller tag of another machine cannot be checked from here: kept, never taken for dead."""
    from rlboost.providers.base import NODE_CONTROLLER, Tagged

    other = Tagged("j-1-trainer", "j", "u1", "s1", "0123456789ab-0123456789ab-42-1000")
    node = Tagged("k-1-trainer", "k", "u2", "s2", NODE_CONTROLLER)
    legacy = Tagged("l-1-trainer", "l", "u3", "s3")  # an rlboost that tagged no controller: nothing to go by
    ended, kept = reconcile.split_alive([other, node, legacy])
    assert ended == [legacy]
    assert [(t.instance_id, "another machine" in why or "trainer node" in why) for t, why in kept] == [
        ("j-1-trainer", True),
        ("k-1-trainer", True),
    ]


def test_gc_all_stores_off_a_terminal_refuses_without_yes(home):
    from tests.conftest import run_cli

    out = run_cli("gc", "--all-stores", home=home)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "stdin is not a terminal" in out.stderr and "--yes" in out.stderr and "Traceback" not in out.stderr
    assert "terminated" not in out.stdout and "no orphans" not in out.stdout  # refused before any sweep


def _exited_controller_tag() -> str:
    """The controller tag of a process that has exited (a dead controller on this machine)."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    tag = controller_tag(p.pid)
    p.communicate(b"")
    assert tag is not None
    return tag


def test_a_job_recorded_before_uids_is_matched_by_name_and_store_job_id(world, tmp_path, home):
    """Records from an rlboost that tagged by name only: job 1's gc takes `grpo-x-1-*`, never `grpo-x-2-*`."""
    store = StateStore()
    ids, jobs = {}, []
    for alive in (False, True):  # run 1 ended (a record left live), run 2 runs
        j = _job(store, "running", alive=alive)
        jobs.append(j)
        owner = Owner(NAME, j, None, None)  # what that rlboost tagged: the name, no uid, no store
        req = LaunchRequest(
            f"{NAME}-{j}-trainer", owner, Role.TRAINER, InstanceKind.ON_DEMAND, "aws", "us-east-1", "V100:1", 3.0
        )
        store.record_launch(j, req, "aws", 3.0)
        AwsProvider(tmp_path / "run", owner, ["us-east-1"], session=world.session, ami=_ami(world)).launch(req)
        ids[j] = req.instance_id
        if not alive:
            store.update_job(j, status="stopped")
    old, new = jobs
    store._db.execute("UPDATE jobs SET uid = NULL")  # as migrated from schema 4

    reconcile.gc(store, wait_s=5)

    assert _state(world, ids[new]) in ("pending", "running")
    assert _state(world, ids[old]) in ("shutting-down", "terminated")


def test_a_controller_is_alive_only_if_its_pid_and_start_match(home):
    """A dead controller's pid taken by another process (here: `sleep`) is not the controller."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_start(other.pid) is not None
        mine = controller_identity()
        assert controller_alive(mine["controller_pid"], mine["controller_start"])
        # the recorded controller started at another moment: the pid now names someone else
        assert not controller_alive(other.pid, mine["controller_start"])
        # a row from before starts were recorded: the process must at least run rlboost
        assert not controller_alive(other.pid, None)
        store = StateStore()
        jid = store.create_job("reused", LOCAL_SPEC, "local")
        store.update_job(jid, status="running", controller_pid=other.pid, controller_start=mine["controller_start"])
        assert not reconcile.controller_running(store.job_by_id(jid))
        res = reconcile.gc(store, wait_s=1)  # the job is taken over: failed, nothing was launched
        assert store.job_by_id(jid).status == "failed" and res.jobs == []
    finally:
        other.kill()
        other.wait()


def test_a_started_controller_is_judged_by_its_own_exit_status():
    """A trainer node's controller that has just been started is watched through its own process
    (rlboost/cli/node_host.py), never /proc: right after a vfork'd exec its command line can read empty,
    which the /proc check takes for a dead controller. How it ended is said in words."""
    from rlboost.cli.detach import how_it_ended

    code = "import os, signal, sys, time; {}"
    running = subprocess.Popen([sys.executable, "-c", code.format("time.sleep(60)")])
    exited = subprocess.Popen([sys.executable, "-c", code.format("sys.exit(3)")])
    killed = subprocess.Popen([sys.executable, "-c", code.format("os.kill(os.getpid(), signal.SIGKILL)")])
    try:
        exited.wait(30)
        killed.wait(30)
        assert how_it_ended(running) is None
        assert how_it_ended(exited) == "exit code 3"
        assert how_it_ended(killed) == "killed by SIGKILL"
    finally:
        running.kill()
        running.wait()


def test_resume_is_not_refused_by_a_reused_pid(home, tmp_path):
    """`launch --resume` of a job whose controller's pid now belongs to another process goes ahead
    (it used to refuse: "still running"); it stops at the next check (an incomplete run dir)."""
    from tests.conftest import run_cli

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        store = StateStore()
        jid = store.create_job("reused", LOCAL_SPEC, "local")
        store.update_job(jid, status="running", controller_pid=other.pid, controller_start="0:0")
        out = run_cli("launch", "--resume", str(jid), home=home)
        assert "still running" not in out.stdout + out.stderr
        assert "cannot be resumed" in out.stderr  # got past the liveness check
    finally:
        other.kill()
        other.wait()


def test_a_lagging_listing_is_asked_again_before_an_instance_is_called_gone():
    """A cloud's listing that misses a live instance for a while (eventual consistency)."""

    class Lagging:
        def __init__(self, misses: int) -> None:
            self.misses, self.calls = misses, 0

        def list_owned(self, owner: Owner) -> list[str]:
            self.calls += 1
            return [] if self.calls <= self.misses else ["j-1-w001"]

    slept: list[float] = []
    p = Lagging(misses=2)
    got = reconcile.listed_settled(p, Owner("j", 1, "u"), {"j-1-w001"}, lag_s=30.0, sleep=slept.append)  # type: ignore[arg-type]
    assert got == {"j-1-w001"} and p.calls == 3 and slept
    # gone for real: asked until the lag has passed, then called gone
    p = Lagging(misses=10**9)
    t0 = time.monotonic()
    got = reconcile.listed_settled(p, Owner("j", 1, "u"), {"j-1-w001"}, lag_s=0.3, sleep=time.sleep)  # type: ignore[arg-type]
    assert got == set() and p.calls >= 2 and time.monotonic() - t0 >= 0.3


def test_a_launch_call_that_raises_after_ec2_made_the_instance_is_found_by_tag_and_terminated(world, tmp_path, home):
    """run_instances creates the instance, then the call fails on the way back (a read timeout): the
    instance is looked up by its tags and terminated, never left running unrecorded and unbilled."""
    import io

    from botocore.exceptions import ReadTimeoutError
    from rich.console import Console

    from rlboost.cli.controller import Controller
    from rlboost.contracts.spec import parse_spec, spec_to_yaml
    from rlboost.providers.base import ProviderError
    from rlboost.providers.prices import CloudPrices
    from rlboost.providers.pricing import spot_offers, trainer_offer

    spec = parse_spec({**SPEC, "trainer": {**SPEC["trainer"], "tls": "off"}})
    store = StateStore()
    jid = store.create_job(NAME, spec_to_yaml(spec), "aws")
    run_dir = tmp_path / "run"
    (run_dir / "spec.yaml").write_text(spec_to_yaml(spec))
    owner = reconcile.owner_of(store, store.job_by_id(jid))
    provider = AwsProvider(run_dir, owner, ["us-east-1"], session=world.session, ami=_ami(world), describe_every_s=0)
    prices = CloudPrices()
    ctl = Controller(
        spec=spec, store=store, job_id=jid, run_dir=run_dir, provider=provider, token="tok",
        trainer_offer=trainer_offer(spec, prices), spot_offers=spot_offers(spec, prices),
        console=Console(file=io.StringIO()), poll_s=0.05,
    )  # fmt: skip

    def lost_reply(**kwargs):
        raise ReadTimeoutError(endpoint_url="https://ec2.us-east-1.amazonaws.com")

    world.session.events.register("after-call.ec2.RunInstances", lost_reply)
    with pytest.raises(ProviderError, match="could not launch grpo-x-1-w001"):
        ctl._launch_worker(ctl_progress(), ctl.spot_offers[0])
    world.session.events.unregister("after-call.ec2.RunInstances", lost_reply)
    iid = f"{NAME}-{jid}-w001"
    assert _state(world, iid) in ("shutting-down", "terminated"), "the instance EC2 made was left running"
    assert any(e.type == "launch-error-instance-found" for e in store.events(jid))
    deadline = time.monotonic() + 10
    while store.instance(iid).state != "terminated" and time.monotonic() < deadline:
        ctl._apply_events()  # billed until EC2 confirms the termination
    assert store.instance(iid).state == "terminated"


def ctl_progress():
    import io

    from rich.console import Console

    from rlboost.cli.progress import JobProgress

    return JobProgress(Console(file=io.StringIO()), 1)


def test_gc_reaches_a_job_whose_stored_spec_an_older_rlboost_saved_under_looser_rules(world, tmp_path, home):
    """`seed: -1` passed validation before seeds were bounded: its job's instances are still found."""
    store = StateStore()
    jid = _job(store, "running", alive=False)
    iid = _launch(world, tmp_path, store, jid, Role.WORKER)
    store.update_job(jid, status="stopped")  # its teardown never confirmed the worker gone
    store._db.execute(
        "UPDATE jobs SET spec_yaml = ? WHERE id = ?", (yaml.safe_dump({**SPEC, "algorithm": {"seed": -1}}), jid)
    )

    res = reconcile.gc(store, wait_s=5)

    assert [r.terminated for r in res.jobs] == [[iid]] and _state(world, iid) in ("shutting-down", "terminated")
