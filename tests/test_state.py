from __future__ import annotations

import os
import sqlite3
import stat
import threading
from pathlib import Path

import pytest

from rlboost.cli import state
from rlboost.cli.state import (
    JobExistsError,
    StateError,
    StateStore,
    StepMetrics,
    UnknownInstanceError,
    UnknownJobError,
    rlboost_home,
)
from rlboost.providers.base import InstanceKind, InstanceState, LaunchRequest, Owner, Role

SECRET = "tok-7f3a9c1e5b2d4e6f8a0b"


def _req(iid: str, kind: InstanceKind = InstanceKind.SPOT, price: float = 1.0) -> LaunchRequest:
    return LaunchRequest(
        instance_id=iid,
        owner=Owner("demo", 1, "uid-demo"),
        role=Role.WORKER if kind is InstanceKind.SPOT else Role.TRAINER,
        kind=kind,
        cloud="local",
        region=None,
        accelerator="cpu",
        hourly_price=price,
        env={"RLBOOST_JOB_TOKEN": SECRET},
        command=["python", "-m", "rlboost.worker", f"--token={SECRET}"],
    )


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "rlhome"
    monkeypatch.setenv("RLBOOST_HOME", str(h))
    return h


@pytest.fixture
def store(home: Path) -> StateStore:
    s = StateStore()
    yield s
    s.close()


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_home_and_file_permissions(home: Path, store: StateStore) -> None:
    assert rlboost_home() == home
    assert store.path == home / "state.db"
    assert _mode(home) == 0o700
    assert _mode(store.path) == 0o600
    job = store.create_job("demo", "name: demo\n", "local")
    store.record_launch(job, _req("demo-w1"), "local", 2.0)
    wal = Path(str(store.path) + "-wal")
    assert wal.exists()
    assert _mode(wal) == 0o600


def test_a_new_home_is_private_whatever_the_umask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLBOOST_HOME", str(tmp_path / "new" / "home"))
    old = os.umask(0)
    try:
        assert _mode(rlboost_home()) == 0o700
    finally:
        os.umask(old)


def test_an_existing_home_keeps_its_mode_and_its_files_are_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # a directory others use too (like /tmp): rlboost must not lock them out
    monkeypatch.setenv("RLBOOST_HOME", str(shared))
    s = StateStore()
    s.close()
    assert _mode(rlboost_home()) == 0o1777
    assert _mode(shared / "state.db") == 0o600


def test_name_reuse_rules(store: StateStore) -> None:
    first = store.create_job("demo", "a", "local")
    assert store.get_job("demo").status == "pending"
    with pytest.raises(JobExistsError, match="demo"):
        store.create_job("demo", "b", "local")
    store.update_job(first, status="running")
    with pytest.raises(JobExistsError):
        store.create_job("demo", "b", "local")
    store.create_job("other", "c", "local")  # other names are unaffected
    store.update_job(first, status="failed", error="boom")
    second = store.create_job("demo", "b", "local")
    assert second != first
    assert store.get_job("demo").id == second  # newest wins
    assert store.job_by_id(first).status == "failed"
    assert [j.name for j in store.list_jobs()] == ["demo", "other", "demo"]
    # the old job cannot come back to life beside the new active one
    with pytest.raises(JobExistsError):
        store.update_job(first, status="running")


def test_create_job_is_atomic_across_connections(store: StateStore) -> None:
    stores = [StateStore(store.path) for _ in range(8)]
    results: list[object] = []
    barrier = threading.Barrier(len(stores))

    def go(s: StateStore) -> None:
        barrier.wait()
        try:
            results.append(s.create_job("race", "x", "local"))
        except JobExistsError as e:
            results.append(e)

    threads = [threading.Thread(target=go, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(r, int) for r in results) == 1
    assert sum(isinstance(r, JobExistsError) for r in results) == 7
    for s in stores:
        s.close()


def test_unknown_job_message(store: StateStore) -> None:
    with pytest.raises(UnknownJobError) as e:
        store.get_job("nope")
    assert "nope" in str(e.value) and "rlboost status" in str(e.value)
    with pytest.raises(UnknownJobError):
        store.job_by_id(42)
    with pytest.raises(UnknownJobError):
        store.update_job(42, status="running")


def test_update_job_fields(store: StateStore) -> None:
    job = store.create_job("demo", "spec", "local")
    snap = {"step": 3, "workers": [{"worker_id": "w1", "tokens_per_s": 12.5}]}
    store.update_job(
        job,
        status="running",
        controller_pid=123,
        trainer_url="http://127.0.0.1:9",
        started_at=10.0,
        step=3,
        version=2,
        reward=0.25,
        clock=360.0,
        snapshot=snap,
        tokens_total=999,
    )
    row = store.job_by_id(job)
    assert (row.status, row.controller_pid, row.step, row.version, row.reward) == ("running", 123, 3, 2, 0.25)
    assert row.snapshot == snap and row.clock == 360.0 and row.tokens_total == 999
    assert row.active
    with pytest.raises(ValueError, match="unknown field"):
        store.update_job(job, colour="red")
    with pytest.raises(ValueError, match="status"):
        store.update_job(job, status="exploded")


def test_instance_lifecycle_and_terminal_immutability(store: StateStore) -> None:
    job = store.create_job("demo", "spec", "local")
    store.record_launch(job, _req("demo-w1", price=0.5), "local", 2.0)
    inst = store.instances(job)[0]
    assert (inst.state, inst.started_clock, inst.hourly_price, inst.on_demand_price) == (
        "pending",
        None,
        0.5,
        2.0,
    )
    assert inst.id == "demo-w1" and inst.kind == "spot" and inst.role == "worker"

    store.update_instance("demo-w1", InstanceState.RUNNING, 100.0)
    store.update_instance("demo-w1", "notice", 150.0, "cloud notice")
    store.update_instance("demo-w1", InstanceState.RUNNING, 160.0)  # still running: start unchanged
    store.update_instance("demo-w1", InstanceState.PREEMPTED, 200.0, "reclaimed")
    # terminal is final: these are ignored
    store.update_instance("demo-w1", InstanceState.RUNNING, 300.0)
    store.update_instance("demo-w1", InstanceState.TERMINATED, 400.0, "teardown")
    inst = store.instance("demo-w1")
    assert inst.state == "preempted" and inst.terminal
    assert (inst.started_clock, inst.ended_clock, inst.end_reason) == (100.0, 200.0, "preempted")
    assert inst.detail == "reclaimed"
    types = [e.type for e in store.events(job) if e.instance_id == "demo-w1"]
    assert types == ["launch", "running", "notice", "running", "preempted"]
    assert store.live_instances(job) == []


def test_notice_before_running_starts_billing(store: StateStore) -> None:
    job = store.create_job("demo", "spec", "local")
    store.record_launch(job, _req("a"), "local", None)
    store.record_launch(job, _req("b"), "local", None)
    store.update_instance("a", InstanceState.NOTICE, 50.0)
    store.update_instance("b", InstanceState.FAILED, 60.0, "no capacity")
    a, b = store.instance("a"), store.instance("b")
    assert a.started_clock == 50.0 and not a.terminal
    assert b.started_clock is None and b.ended_clock == 60.0 and b.end_reason == "failed"
    assert [i.instance_id for i in store.live_instances(job)] == ["a"]


def test_instance_errors_and_handle(store: StateStore) -> None:
    job = store.create_job("demo", "spec", "local")
    store.record_launch(job, _req("w1"), "local", None)
    with pytest.raises(ValueError, match="w1"):
        store.record_launch(job, _req("w1"), "local", None)
    with pytest.raises(UnknownInstanceError):
        store.update_instance("ghost", InstanceState.RUNNING, 1.0)
    with pytest.raises(ValueError):
        store.update_instance("w1", "sleeping", 1.0)
    store.set_instance_handle("w1", "pid:4242")
    assert store.instance("w1").handle == "pid:4242"
    with pytest.raises(UnknownInstanceError):
        store.set_instance_handle("ghost", "x")


def test_events_and_steps(store: StateStore) -> None:
    job = store.create_job("demo", "spec", "local")
    store.add_event(job, "capacity-unavailable", "none left", instance_id="w9", clock=12.0)
    ev = store.events(job)[-1]
    assert (ev.type, ev.detail, ev.instance_id, ev.clock) == ("capacity-unavailable", "none left", "w9", 12.0)
    store.record_step(job, StepMetrics(2, 2, 0.5, 100, 8, 1, 3.0, 20.0))
    store.record_step(job, StepMetrics(1, 1, 0.25, 90, 8, 0, 2.5, 10.0))
    store.record_step(job, StepMetrics(2, 2, 0.75, 110, 8, 2, 3.5, 21.0))  # re-recorded after a restart: replaces
    steps = store.steps(job)
    assert [(s.step, s.reward, s.tokens, s.migrated) for s in steps] == [(1, 0.25, 90, 0), (2, 0.75, 110, 2)]
    store.record_step(
        job, StepMetrics(3, 3, 0.5, 120, 8, 0, 4.0, 30.0, offload_s=1.5, tail_train_s=2.0, trainer_idle_s=0.25)
    )
    s3 = store.steps(job)[-1]
    assert (s3.offload_s, s3.tail_train_s, s3.trainer_idle_s) == (1.5, 2.0, 0.25)
    assert steps[0].offload_s is None  # no offload recorded


class _Stop(Exception):
    """What the controller's SIGTERM handler raises, wherever the main thread is."""


class _SignalAfter:
    """The store's connection, with a signal's exception raised right after one statement ran (where
    the controller's `down` can land: between BEGIN and the statement after it, or after COMMIT)."""

    def __init__(self, db: sqlite3.Connection, statement: str, times: int = 1) -> None:
        self.db, self.statement, self.times = db, statement, times

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        cur = self.db.execute(sql, *args)
        if sql.startswith(self.statement) and self.times > 0:
            self.times -= 1
            raise _Stop()
        return cur

    def __getattr__(self, name: str) -> object:
        return getattr(self.db, name)


@pytest.mark.parametrize("statement", ["BEGIN", "INSERT INTO events", "COMMIT"])
def test_a_signal_between_statements_leaves_the_store_writable(store: StateStore, statement: str) -> None:
    job = store.create_job("demo", "spec", "local")
    db = store._db
    store._db = _SignalAfter(db, statement)  # type: ignore[assignment]
    with pytest.raises(_Stop):
        store.add_event(job, "first", "interrupted")
    assert not db.in_transaction  # nothing left open: the next write is not refused
    store.add_event(job, "second", "after the signal")
    kept = [e.type for e in store.events(job)]
    assert kept[-1] == "second"
    assert ("first" in kept) == (statement == "COMMIT")  # before COMMIT rolled back; after it, it stands


def test_a_transaction_left_open_is_rolled_back_before_the_next(store: StateStore) -> None:
    job = store.create_job("demo", "spec", "local")
    store._db.execute("BEGIN IMMEDIATE")  # as if a second signal had cut a rollback short
    store._db.execute("INSERT INTO events (job_id, type, detail, wall) VALUES (?, 'half', '', 0)", (job,))
    store.add_event(job, "whole", "")
    assert [e.type for e in store.events(job)][-1] == "whole" and "half" not in [e.type for e in store.events(job)]


def test_v1_store_migrates_to_the_latest_keeping_its_steps(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    db = sqlite3.connect(path)
    db.executescript(state._SCHEMA_V1)
    db.execute("PRAGMA user_version = 1")
    db.execute(
        "INSERT INTO jobs (name, spec_yaml, provider, status, created_at) VALUES ('old', 's', 'local', 'done', 1.0)"
    )
    db.execute("INSERT INTO steps VALUES (1, 0, 0, 0.5, 10, 4, 0, 1.0, 2.0, 3.0)")
    db.commit()
    db.close()
    s = StateStore(path)
    assert (s.job_by_id(1).controller_url, s.job_by_id(1).remote) == (None, False)  # v4: its controller ran here
    assert state._written_by(s._db) == state.rlboost_version()  # v5: the version that migrated it
    (row,) = s.steps(1)
    assert (row.reward, row.offload_s, row.tail_train_s, row.trainer_idle_s) == (0.5, None, None, None)
    assert (row.spot_workers, row.gen_tokens, row.spot_tokens) == (None, None, None)
    assert (row.loss, row.pg_loss, row.grad_norm, row.lr, row.updates) == (None,) * 5  # v7
    assert s.job_by_id(1).launch_options is None  # v9: launched before its options were kept
    s.record_step(1, StepMetrics(1, 1, 0.6, 10, 4, 0, 1.0, 3.0, offload_s=0.5, tail_train_s=0.4, trainer_idle_s=0.1,
                                 spot_workers=2, gen_tokens=12, spot_tokens=7, loss=0.2, pg_loss=0.1, grad_norm=0.9,
                                 lr=1e-3, updates=2))
    new = s.steps(1)[-1]
    assert (new.tail_train_s, new.spot_workers, new.gen_tokens, new.spot_tokens) == (0.4, 2, 12, 7)
    assert (new.loss, new.pg_loss, new.grad_norm, new.lr, new.updates) == (0.2, 0.1, 0.9, 1e-3, 2)
    s.close()


def test_launch_options_are_kept_with_the_job(tmp_path: Path) -> None:
    """v9: what `launch --resume` reapplies; a trainer node's controller records them in its own store,
    whose copy the launching machine takes."""
    from rlboost.cli.launch_options import LaunchOptions, saved_options

    s = StateStore(tmp_path / "state.db")
    job = s.create_job("opts", "name: opts\n", "local")
    assert saved_options(s.job_by_id(job)) is None
    s.update_job(job, launch_options=LaunchOptions(record_rollouts=True).model_dump_json())
    assert saved_options(s.job_by_id(job)) == LaunchOptions(record_rollouts=True)
    node = state.JobRow(**{**vars(s.job_by_id(job)), "status": "running"})
    assert s.copy_from_node(job, node, [], [], [])
    assert saved_options(s.job_by_id(job)) == LaunchOptions(record_rollouts=True)
    s.close()


def test_persistence_and_no_secrets_on_disk(home: Path) -> None:
    s = StateStore()
    job = s.create_job("demo", "name: demo\n", "local")
    s.record_launch(job, _req("w1"), "local", 1.0)
    s.update_instance("w1", InstanceState.RUNNING, 5.0)
    s.close()
    s2 = StateStore()
    assert s2.instance("w1").started_clock == 5.0
    s2.close()
    # after a clean close the WAL is checkpointed into the main file; scan every file anyway
    blob = b"".join(p.read_bytes() for p in home.iterdir() if p.is_file())
    assert b"w1" in blob  # the scan does see the data
    assert SECRET.encode() not in blob


def test_schema_version(home: Path) -> None:
    s = StateStore()
    path = s.path
    s.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == state.SCHEMA_VERSION == 9
    # v5: which rlboost last migrated it (a newer store's error names it), and the store's own id
    assert db.execute("SELECT value FROM meta WHERE key = 'written_by'").fetchone()[0] == state.rlboost_version()
    assert len(db.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()[0]) == 32
    db.execute("UPDATE meta SET value = '7.1.0' WHERE key = 'written_by'")
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    newer = r"written by rlboost 7\.1\.0 \(store schema 99; this rlboost .* reads up to 9\): upgrade rlboost"
    with pytest.raises(StateError, match=newer):
        StateStore(path)


def test_explicit_path_creates_private_parent(tmp_path: Path) -> None:
    p = tmp_path / "deep" / "dir" / "s.db"
    s = StateStore(p)
    assert _mode(p) == 0o600 and _mode(p.parent) == 0o700
    s.close()
