from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from rlboost.cli.reports import cost_json, render_cost, render_status, sparkline, status_json
from rlboost.cli.state import StateStore, StepMetrics, UnknownJobError
from rlboost.providers.base import InstanceKind, InstanceState, LaunchRequest, Owner, Role

TOKEN = "job-token-0d9e8f7a6b5c4d3e"
SPEC = "name: demo\nalgorithm:\n  steps: 30\n"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StateStore:
    monkeypatch.setenv("RLBOOST_HOME", str(tmp_path / "home"))
    s = StateStore()
    yield s
    s.close()


def _launch(store: StateStore, job: int, iid: str, kind: InstanceKind, price: float, od: float | None) -> None:
    req = LaunchRequest(
        instance_id=iid,
        owner=Owner("demo", 1, "uid-demo"),
        role=Role.TRAINER if kind is InstanceKind.ON_DEMAND else Role.WORKER,
        kind=kind,
        cloud="local",
        region="here",
        accelerator="cpu",
        hourly_price=price,
        env={"RLBOOST_JOB_TOKEN": TOKEN},
        command=["worker", TOKEN],
    )
    store.record_launch(job, req, "local", od)


def _populate(store: StateStore) -> int:
    job = store.create_job("demo", SPEC, "local")
    store.update_job(job, status="running", started_at=1000.0, trainer_url="http://127.0.0.1:8123")
    _launch(store, job, "demo-trainer", InstanceKind.ON_DEMAND, 0.74, None)
    for w in ("demo-w001", "demo-w002", "demo-w003"):
        _launch(store, job, w, InstanceKind.SPOT, 0.30, 0.74)
    store.update_instance("demo-trainer", InstanceState.RUNNING, 0.0)
    store.update_instance("demo-w001", InstanceState.RUNNING, 60.0)
    store.update_instance("demo-w002", InstanceState.RUNNING, 60.0)
    store.update_instance("demo-w002", InstanceState.PREEMPTED, 1800.0)
    store.update_instance("demo-w003", InstanceState.RUNNING, 1900.0)
    for i in range(1, 6):
        store.record_step(job, StepMetrics(i, i, 0.1 * i, 1000, 32, i % 2, 2.0, 600.0 * i))
    snap = {
        "step": 5,
        "steps": 30,
        "version": 5,
        "reward": 0.5,
        "phase": "rollout",
        "tokens_total": 5000,
        "responses_total": 160,
        "migrated": 3,
        "token": TOKEN,  # a careless controller; reports must copy fields, not the snapshot
        "workers": [
            {
                "worker_id": "demo-w001",
                "kind": "spot",
                "state": "busy",
                "version": 5,
                "tokens_per_s": 321.5,
                "tokens": 4000,
                "active": 12,
            },
            {
                "worker_id": "trainer-local",
                "kind": "reserved",
                "state": "idle",
                "version": 5,
                "tokens_per_s": 99.0,
                "tokens": 1000,
                "active": 0,
            },
        ],
    }
    store.update_job(job, step=5, version=5, reward=0.5, clock=3600.0, snapshot=snap, tokens_total=5000)
    return job


def test_status_json_joins_snapshot_and_instances(store: StateStore) -> None:
    _populate(store)
    data = status_json(store, "demo", now=1100.0)
    [js] = data["jobs"]
    assert (js["name"], js["status"], js["step"], js["steps"], js["version"]) == ("demo", "running", 5, 30, 5)
    assert js["reward"] == 0.5 and js["elapsed_s"] == 100.0
    assert js["workers_live"] == 2  # w001, w003 (the trainer is not a worker; w002 was preempted)
    assert js["preemptions"] == 1 and js["migrated"] == 3
    w = {x["instance_id"]: x for x in js["workers"]}
    assert w["demo-w001"]["tokens_per_s"] == 321.5 and w["demo-w001"]["version"] == 5
    assert w["demo-w001"]["kind"] == "spot" and w["demo-w001"]["state"] == "running"
    assert w["demo-w003"]["tokens_per_s"] is None  # no snapshot entry
    assert w["demo-w002"]["end_reason"] == "preempted"
    assert w["trainer-local"]["recorded"] is False and w["trainer-local"]["kind"] == "reserved"
    assert [s["step"] for s in js["recent_steps"]] == [1, 2, 3, 4, 5]
    assert js["reward_history"] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])


def test_steps_fall_back_to_spec_and_all_jobs_listed(store: StateStore) -> None:
    job = store.create_job("fresh", "name: fresh\nalgorithm:\n  steps: 12\n", "local")
    store.update_job(job, status="succeeded", started_at=10.0, ended_at=70.0)
    _populate(store)
    data = status_json(store, None, now=5000.0)
    assert [j["name"] for j in data["jobs"]] == ["demo", "fresh"]  # newest first
    fresh = data["jobs"][1]
    assert fresh["steps"] == 12 and fresh["step"] is None and fresh["elapsed_s"] == 60.0
    assert fresh["workers"] == [] and fresh["preemptions"] == 0


def test_no_version_published_yet_reads_none_not_minus_one(store: StateStore) -> None:
    """The trainer counts -1 before its first version: `status` shows '-' and `--json` null."""
    job = store.create_job("early", "name: early\nalgorithm:\n  steps: 12\n", "local")
    store.update_job(job, status="stopped", started_at=10.0, ended_at=18.0, step=0, version=-1)
    snap = {"version": -1, "workers": [{"id": "w1", "kind": "spot", "version": -1, "state": "pulling"}]}
    store.update_job(job, snapshot=snap)
    [js] = status_json(store, "early", now=20.0)["jobs"]
    assert js["version"] is None and all(w["version"] is None for w in js["workers"])
    console = Console(record=True, width=120)
    render_status(store, None, console)
    [row] = [ln.split() for ln in console.export_text().splitlines() if ln.split()[1:2] == ["early"]]
    assert "-1" not in row and row[:5] == [str(job), "early", "stopped", "0/12", "-"], row


def test_an_ended_jobs_trainer_engine_reads_ended_not_its_last_snapshot(store: StateStore) -> None:
    _populate(store)
    running = {w["instance_id"]: w for w in status_json(store, "demo", now=1100.0)["jobs"][0]["workers"]}
    assert running["trainer-local"]["state"] != "ended" and running["trainer-local"]["tokens_per_s"] is not None
    store.update_job(store.get_job("demo").id, status="succeeded", ended_at=1200.0)
    ended = {w["instance_id"]: w for w in status_json(store, "demo", now=1300.0)["jobs"][0]["workers"]}
    assert ended["trainer-local"]["state"] == "ended" and ended["trainer-local"]["tokens_per_s"] is None
    assert ended["trainer-local"]["tokens"] == running["trainer-local"]["tokens"]


def test_json_never_contains_the_token(store: StateStore) -> None:
    _populate(store)
    for blob in (
        status_json(store, None),
        status_json(store, "demo"),
        cost_json(store, None),
        cost_json(store, "demo"),
    ):
        text = json.dumps(blob, default=str)
        assert "demo-w001" in text or "dollars" in text  # the output is real
        assert TOKEN not in text


def test_render_status(store: StateStore) -> None:
    console = Console(record=True, width=200)
    render_status(store, None, console)
    assert "No jobs yet" in console.export_text()
    _populate(store)
    console = Console(record=True, width=200)
    render_status(store, "demo", console, now=1100.0)
    out = console.export_text()
    for needle in (
        "demo",
        "running",
        "5/30",
        "0.500",
        "0:01:40",
        "demo-w001",
        "321.5",
        "demo-w003",
        "local/here/cpu",
        "preempted",
        "recent steps",
        "reward (last 5 steps)",
    ):
        assert needle in out, needle
    assert TOKEN not in out


def test_steps_table_leaves_tail_columns_empty_without_an_offload(store: StateStore) -> None:
    job = store.create_job("offl", "name: offl\nalgorithm:\n  steps: 2\n", "local")
    # the live trainer records 0.0 for both when its engine never handed over
    no_offload = StepMetrics(1, 1, 0.2, 900, 32, 0, 2.0, 60.0, offload_s=None, tail_train_s=0.0, trainer_idle_s=0.0)
    store.record_step(job, no_offload)
    offload = StepMetrics(2, 2, 0.3, 900, 32, 5, 2.0, 120.0, offload_s=0.7, tail_train_s=1.2, trainer_idle_s=0.4)
    store.record_step(job, offload)
    console = Console(record=True, width=200)
    render_status(store, "offl", console, now=200.0)
    lines = map(str.split, console.export_text().splitlines())
    rows = {cells[0]: cells for cells in lines if cells[:1] in (["1"], ["2"])}
    assert rows["1"][-3:] == ["-", "-", "-"]
    assert rows["2"][-3:] == ["0.7", "1.2", "0.4"]


def test_steps_table_and_json_show_the_optimizer_figures_where_the_learner_has_them(store: StateStore) -> None:
    job = store.create_job("optim", "name: optim\nalgorithm:\n  steps: 2\n", "local")
    store.record_step(job, StepMetrics(1, 1, 0.2, 900, 32, 0, 2.0, 60.0, loss=0.0123, pg_loss=0.0123,
                                       grad_norm=0.8125, lr=1.5e-3, updates=1))
    store.record_step(job, StepMetrics(2, 2, 0.3, 900, 32, 0, 2.0, 120.0, loss=-0.004, pg_loss=-0.005,
                                       grad_norm=0.5, lr=3e-3, updates=4))
    console = Console(record=True, width=200)
    render_status(store, "optim", console, now=200.0)
    text = console.export_text()
    assert "grad norm" in text
    rows = {cells[0]: cells for cells in map(str.split, text.splitlines()) if cells[:1] in (["1"], ["2"])}
    assert rows["1"][-3:] == ["0.0123", "0.812", "0.0015"] and rows["2"][-3:] == ["-0.0040", "0.500", "0.003"]
    recent = status_json(store, "optim")["jobs"][0]["recent_steps"]
    assert [(s["pg_loss"], s["grad_norm"], s["lr"], s["updates"]) for s in recent] == [
        (0.0123, 0.8125, 1.5e-3, 1), (-0.005, 0.5, 3e-3, 4)
    ]
    # a learner without them (model.kind synthetic): no such columns
    other = store.create_job("synth", "name: synth\nalgorithm:\n  steps: 1\n", "local")
    store.record_step(other, StepMetrics(1, 1, 0.2, 900, 32, 0, 2.0, 60.0))
    plain = Console(record=True, width=200)
    render_status(store, "synth", plain, now=200.0)
    assert "grad norm" not in plain.export_text()


def test_workers_table_headers_fold_between_words_at_80_columns(store: StateStore) -> None:
    _populate(store)
    console = Console(record=True, width=80)
    render_status(store, "demo", console, now=2000.0)
    text = console.export_text()
    words = set(text.split())
    assert {"provider", "region", "accel"} <= words, text  # no "acc" / "el" halves
    assert "demo-w001" in text


def test_unknown_job(store: StateStore) -> None:
    with pytest.raises(UnknownJobError, match="rlboost status"):
        status_json(store, "ghost")
    with pytest.raises(UnknownJobError):
        cost_json(store, "ghost")


def test_cost_json_and_render(store: StateStore) -> None:
    console = Console(record=True, width=200)
    render_cost(store, None, console)
    assert "No jobs yet" in console.export_text()
    job = _populate(store)
    data = cost_json(store, "demo")
    assert data["scope"] == "job" and data["job_id"] == job
    # trainer 1 h at 0.74; w001 3540 s, w002 1740 s, w003 1700 s at 0.30
    spot_h = (3540 + 1740 + 1700) / 3600
    assert data["dollars"] == pytest.approx(0.74 + spot_h * 0.30)
    assert data["on_demand_equivalent_dollars"] == pytest.approx(0.74 + spot_h * 0.74)
    assert data["dollars"] == pytest.approx(sum(ln["dollars"] for ln in data["lines"]))
    assert data["steps"] == 5 and data["dollars_per_step"] == pytest.approx(data["dollars"] / 5)
    other = store.create_job("other", SPEC, "local")
    _launch(store, other, "other-w1", InstanceKind.SPOT, 1.0, 2.0)
    all_ = cost_json(store, None)
    assert all_["scope"] == "all" and [j["job"] for j in all_["jobs"]] == ["other", "demo"]
    console = Console(record=True, width=200)
    render_cost(store, None, console)
    out = console.export_text()
    for needle in (
        "on-demand",
        "spot",
        "total",
        "the same instance-hours all on-demand would cost",
        "$ per step",
        "per job",
        "other",
    ):
        assert needle in out, needle


def test_sparkline() -> None:
    assert sparkline([]) == ""
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert len(set(sparkline([2.0, 2.0]))) == 1


def test_cost_report_splits_tokens_counts_refusals_and_measures_the_counterfactual(store: StateStore) -> None:
    job = store.create_job("split", SPEC, "local")
    store.update_job(job, status="succeeded", started_at=1000.0, ended_at=1040.0)  # 40 s of wall time
    _launch(store, job, "split-trainer", InstanceKind.ON_DEMAND, 10.0, None)
    for w, price in (("split-w1", 1.0), ("split-w2", 1.5), ("split-w3", 1.0)):
        _launch(store, job, w, InstanceKind.SPOT, price, 3.0)
    store.update_instance("split-trainer", InstanceState.RUNNING, 0.0)
    store.update_instance("split-trainer", InstanceState.TERMINATED, 3600.0)  # $10
    store.update_instance("split-w1", InstanceState.RUNNING, 0.0)
    store.update_instance("split-w1", InstanceState.PREEMPTED, 1800.0)  # $0.50
    store.update_instance("split-w2", InstanceState.RUNNING, 2400.0)
    store.update_instance("split-w2", InstanceState.TERMINATED, 3600.0)  # $0.50
    store.update_instance("split-w3", InstanceState.FAILED, 10.0)  # refused: never ran
    # step 1 (warm-up) and step 3 ran without a spot worker up (billing clock 1800-2300, between w1 and
    # w2); 3 trained 1000 tokens in 4 s: 250 tokens/s
    rows = [(1, 0, 9.0, 0, 600.0), (2, 1, 2.0, 600, 1800.0), (3, 0, 4.0, 0, 2300.0), (4, 1, 2.0, 700, 3600.0)]
    for step, n, secs, spot, clock in rows:
        m = StepMetrics(step, step, 0.5, 1000, 8, 2 * n, secs, clock, spot_workers=n, gen_tokens=1000, spot_tokens=spot)
        store.record_step(job, m)
    data = cost_json(store, "split")
    assert data["refused_launches"] == 1 and sum(ln["instances"] for ln in data["lines"]) == 3
    assert data["preemptions"] == 1 and data["migrations"] == 4
    g = data["generated"]
    assert (g["spot"], g["reserved"]) == (1300, 2700)
    assert g["spot_dollars_per_million"] == pytest.approx(1.0 / 1300 * 1e6)
    assert g["reserved_dollars_per_million"] == pytest.approx(10.0 / 2700 * 1e6)
    cf = data["counterfactual"]
    # alone: 4000 tokens / 250 tokens/s = 16 s of steps instead of 17 s, over 40 s of wall time
    assert cf["alone_steps"] == 1 and cf["alone_tokens_per_s"] == pytest.approx(250.0)
    assert cf["dollars"] == pytest.approx(10.0 * (1 + (16 - 17) / 40))
    assert cf["saved_dollars"] == pytest.approx(cf["dollars"] - 11.0)
    assert (data["billing_clock"], data["billed_s"], data["wall_s"]) == ("trace", 3600.0, 40.0)
    console = Console(record=True, width=200)
    render_cost(store, "split", console)
    out = console.export_text()
    for needle in (
        "$11.00",  # two decimals
        "billed on the replayed spot trace's clock: 1:00:00 of trace in 0:00:40 of wall time",
        "launches that never ran (refused, or cancelled first; not billed): 1",
        "spot workers",
        "$769.23",  # $ per 1M spot tokens
        "on-demand counterfactual: $9.75",
        "preemptions: 1; responses migrated mid-generation: 4",
    ):
        assert needle in out, needle


def test_no_counterfactual_without_a_measured_trainer_alone_step(store: StateStore) -> None:
    job = store.create_job("busy", SPEC, "local")
    store.update_job(job, status="succeeded", started_at=0.0, ended_at=10.0)
    _launch(store, job, "busy-trainer", InstanceKind.ON_DEMAND, 10.0, None)
    store.update_instance("busy-trainer", InstanceState.RUNNING, 0.0)
    for step in (1, 2):  # the first step alone is warm-up, not a measurement
        store.record_step(job, StepMetrics(step, step, 0.5, 100, 8, 0, 1.0, 0.0, spot_workers=step - 1))
    data = cost_json(store, "busy")
    assert data["counterfactual"] is None and any("no on-demand counterfactual" in n for n in data["notes"])


def test_the_trainers_busy_share_in_status_and_cost_report(store: StateStore) -> None:
    job = store.create_job("busy", SPEC, "local")
    store.update_job(job, status="running", started_at=0.0)
    _launch(store, job, "busy-trainer", InstanceKind.ON_DEMAND, 10.0, None)
    store.update_instance("busy-trainer", InstanceState.RUNNING, 0.0)
    # a step an older rlboost recorded (no train_s) is left out of the share: (1 + 3) / (2 + 6)
    for step, secs, train in ((1, 4.0, None), (2, 2.0, 1.0), (3, 6.0, 3.0)):
        store.record_step(job, StepMetrics(step, step, 0.5, 100, 8, 0, secs, 10.0 * step, train_s=train))
    [js] = status_json(store, "busy")["jobs"]
    assert js["trainer_busy_share"] == 0.5
    assert [s["trainer_busy_share"] for s in js["recent_steps"]] == [None, 0.5, 0.5]
    console = Console(record=True, width=200)
    render_status(store, "busy", console, now=100.0)
    assert "busy trainer busy: 50% of its steps' seconds training" in console.export_text()
    assert cost_json(store, "busy")["trainer_busy_share"] == 0.5
    console = Console(record=True, width=200)
    render_cost(store, "busy", console)
    assert "trainer busy: 50% of its steps' seconds training" in console.export_text()
    store.create_job("idle", SPEC, "local")  # no step yet: no share
    assert status_json(store, "idle")["jobs"][0]["trainer_busy_share"] is None
    all_ = cost_json(store, None)
    assert [(j["job"], j["trainer_busy_share"]) for j in all_["jobs"]] == [("idle", None), ("busy", 0.5)]
    assert all_["trainer_busy_share"] == 0.5
    console = Console(record=True, width=200)
    render_cost(store, None, console)
    rows = {c[0]: c for c in map(str.split, console.export_text().splitlines()) if c[:1] in (["busy"], ["idle"])}
    assert rows["busy"][-1] == "50%" and rows["idle"][-1] == "-"
