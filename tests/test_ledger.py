from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlboost.cli.ledger import summarize, summarize_all
from rlboost.cli.state import StateStore, StepMetrics
from rlboost.providers.base import InstanceKind, InstanceState, LaunchRequest, Owner, Role


def _launch(
    store: StateStore,
    job: int,
    iid: str,
    *,
    kind: InstanceKind = InstanceKind.SPOT,
    acc: str | None = "A100",
    price: float = 1.0,
    od: float | None = 4.0,
    cloud: str = "local",
) -> None:
    req = LaunchRequest(
        instance_id=iid,
        owner=Owner("j", 1, "uid-j"),
        role=Role.WORKER if kind is InstanceKind.SPOT else Role.TRAINER,
        kind=kind,
        cloud=cloud,
        region=None,
        accelerator=acc,
        hourly_price=price,
    )
    store.record_launch(job, req, "local", od)


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    s = StateStore(tmp_path / "state.db")
    yield s
    s.close()


def test_hours_arithmetic(store: StateStore) -> None:
    job = store.create_job("j", "spec", "local")
    _launch(store, job, "trainer", kind=InstanceKind.ON_DEMAND, price=3.0, od=None)
    _launch(store, job, "w1", price=1.0, od=4.0)
    _launch(store, job, "w2", price=1.0, od=4.0)
    _launch(store, job, "never", price=1.0, od=4.0)
    store.update_instance("trainer", InstanceState.RUNNING, 0.0)
    store.update_instance("w1", InstanceState.RUNNING, 600.0)
    store.update_instance("w1", InstanceState.PREEMPTED, 600.0 + 5400.0)  # 1.5 h
    store.update_instance("w2", InstanceState.RUNNING, 1800.0)  # live: billed to the job clock
    store.update_instance("never", InstanceState.FAILED, 100.0)
    store.update_job(job, clock=7200.0)
    s = summarize(store, job)
    costs = {c.instance_id: c for c in s.instances}
    assert costs["trainer"].hours == pytest.approx(2.0) and costs["trainer"].dollars == pytest.approx(6.0)
    assert costs["w1"].hours == pytest.approx(1.5) and costs["w1"].dollars == pytest.approx(1.5)
    assert costs["w2"].hours == pytest.approx(1.5) and costs["w2"].live
    assert "never" not in costs and s.refused_launches == 1  # never ran: listed apart, not an instance
    assert s.dollars == pytest.approx(6.0 + 1.5 + 1.5)
    assert s.total_dollars == s.dollars
    # savings baseline: trainer at its own price, spot at on-demand 4.0
    assert s.on_demand_equivalent_dollars == pytest.approx(6.0 + 4.0 * 3.0)
    assert s.savings_dollars == pytest.approx(18.0 - 9.0)
    assert s.savings_fraction == pytest.approx(0.5)
    by_kind = {ln.kind: ln for ln in s.lines}
    assert by_kind["spot"].instances == 2 and by_kind["spot"].instance_hours == pytest.approx(3.0)
    assert [ln.kind for ln in s.lines] == ["on-demand", "spot"]
    # the job clock moves on: the live worker costs more, the ended one does not
    store.update_job(job, clock=9000.0)
    s2 = {c.instance_id: c for c in summarize(store, job).instances}
    assert s2["w2"].hours == pytest.approx(2.0) and s2["w1"].hours == pytest.approx(1.5)


def test_per_step_and_per_token(store: StateStore) -> None:
    job = store.create_job("j", "spec", "local")
    _launch(store, job, "t", kind=InstanceKind.ON_DEMAND, price=10.0, od=None, acc=None)
    store.update_instance("t", InstanceState.RUNNING, 0.0)
    store.update_instance("t", InstanceState.TERMINATED, 3600.0)
    assert summarize(store, job).dollars_per_step is None
    for i in range(4):
        store.record_step(job, StepMetrics(i + 1, i + 1, 0.1, 250_000, 16, 0, 1.0, 100.0 * i))
    s = summarize(store, job)
    assert s.steps == 4 and s.tokens == 1_000_000
    assert s.dollars_per_step == pytest.approx(2.5)
    assert s.dollars_per_million_tokens == pytest.approx(10.0)
    assert s.lines[0].accelerator == "cpu"


def test_spot_without_on_demand_price_is_noted(store: StateStore) -> None:
    job = store.create_job("j", "spec", "local")
    _launch(store, job, "w", price=2.0, od=None)
    store.update_instance("w", InstanceState.RUNNING, 0.0)
    store.update_instance("w", InstanceState.TERMINATED, 3600.0)
    s = summarize(store, job)
    assert s.on_demand_equivalent_dollars == pytest.approx(2.0) and s.savings_dollars == pytest.approx(0.0)
    assert len(s.notes) == 1 and "no on-demand price" in s.notes[0]


def test_money_and_hours_are_floats_even_with_no_instance(store: StateStore) -> None:
    """`cost-report --json` readers get one type per field: 0.0, not 0, before anything launched."""
    s = summarize(store, store.create_job("j", "spec", "local"))
    for v in (s.dollars, s.on_demand_equivalent_dollars, s.savings_dollars, s.instance_hours):
        assert type(v) is float and v == 0.0
    assert type(s.generated.spot_dollars) is float
    assert type(summarize_all(store).dollars) is float


def test_summarize_all_spans_jobs(store: StateStore) -> None:
    a = store.create_job("a", "spec", "local")
    _launch(store, a, "a-w", price=1.0)
    store.update_instance("a-w", InstanceState.RUNNING, 0.0)
    store.update_instance("a-w", InstanceState.TERMINATED, 3600.0)
    store.update_job(a, status="succeeded")
    b = store.create_job("b", "spec", "local")
    _launch(store, b, "b-w", price=2.0)
    store.update_instance("b-w", InstanceState.RUNNING, 0.0)
    store.update_instance("b-w", InstanceState.TERMINATED, 1800.0)
    total = summarize_all(store)
    assert total.dollars == pytest.approx(summarize(store, a).dollars + summarize(store, b).dollars)
    assert total.dollars == pytest.approx(2.0)
    assert len(total.lines) == 1 and total.lines[0].instances == 2


_inst = st.tuples(
    st.sampled_from(["spot", "on-demand"]),
    st.sampled_from(["A100", "H100", None]),
    st.sampled_from(["local", "aws"]),
    st.floats(0, 50, allow_nan=False),  # hourly price
    st.one_of(st.none(), st.floats(0, 100, allow_nan=False)),  # on-demand price
    st.one_of(st.none(), st.floats(0, 1e6, allow_nan=False)),  # start clock (None: never ran)
    st.one_of(st.none(), st.floats(0, 1e6, allow_nan=False)),  # duration (None: still live)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(insts=st.lists(_inst, max_size=12), job_clock=st.floats(0, 3e6, allow_nan=False))
def test_totals_equal_sum_of_lines(insts: list[tuple], job_clock: float) -> None:
    with tempfile.TemporaryDirectory() as d:
        store = StateStore(Path(d) / "s.db")
        job = store.create_job("j", "spec", "local")
        expect_dollars = expect_hours = expect_od = 0.0
        for n, (kind, acc, cloud, price, od, start, dur) in enumerate(insts):
            iid = f"i{n}"
            _launch(store, job, iid, kind=InstanceKind(kind), acc=acc, price=price, od=od, cloud=cloud)
            if start is None:
                continue
            store.update_instance(iid, InstanceState.RUNNING, start)
            if dur is not None:
                store.update_instance(iid, InstanceState.TERMINATED, start + dur)
                hours = dur / 3600
            else:
                hours = max(0.0, job_clock - start) / 3600
            expect_hours += hours
            expect_dollars += hours * price
            expect_od += hours * (od if od is not None else price)
        store.update_job(job, clock=job_clock)
        s = summarize(store, job)
        store.close()
    # totals are exactly the sums of the lines ...
    assert s.dollars == sum(ln.dollars for ln in s.lines)
    assert s.instance_hours == sum(ln.instance_hours for ln in s.lines)
    assert s.on_demand_equivalent_dollars == sum(ln.on_demand_equivalent_dollars for ln in s.lines)
    assert sum(ln.instances for ln in s.lines) == len(insts)
    # ... and agree with an independent per-instance computation
    assert math.isclose(s.dollars, expect_dollars, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(s.instance_hours, expect_hours, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(s.on_demand_equivalent_dollars, expect_od, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(s.savings_dollars, expect_od - expect_dollars, rel_tol=1e-9, abs_tol=1e-6)
    keys = [(ln.kind, ln.cloud, ln.accelerator) for ln in s.lines]
    assert len(keys) == len(set(keys))


def test_the_trainer_alone_is_measured_on_steps_with_no_spot_worker_up_and_no_warm_up(store: StateStore) -> None:
    """A worker booting on the trainer's machine slows its step though none serves yet (n_remote 0);
    one that joined mid-step generated part of it; the first step after a trainer (re)start (a resume)
    carries warm-up. None of them measures the trainer alone."""
    from rlboost.cli.ledger import alone_steps

    job = store.create_job("j", "spec", "local")
    _launch(store, job, "t1", kind=InstanceKind.ON_DEMAND, price=3.0, od=None)
    store.update_instance("t1", InstanceState.RUNNING, 0.0)
    store.update_instance("t1", InstanceState.FAILED, 700.0)
    _launch(store, job, "t2", kind=InstanceKind.ON_DEMAND, price=3.0, od=None)  # restarted (or resumed)
    store.update_instance("t2", InstanceState.RUNNING, 720.0)
    _launch(store, job, "booting", price=1.0, od=4.0)  # up 350-560, never served
    store.update_instance("booting", InstanceState.RUNNING, 350.0)
    store.update_instance("booting", InstanceState.PREEMPTED, 560.0)
    _launch(store, job, "brief", price=1.0, od=4.0)  # up 1050-1100
    store.update_instance("brief", InstanceState.RUNNING, 1050.0)
    store.update_instance("brief", InstanceState.TERMINATED, 1100.0)
    clocks = {k: 100.0 * k for k in range(1, 11)} | {11: 1200.0, 12: 1200.0, 13: 1400.0, 14: 1400.0}
    for k, clock in clocks.items():  # 11-12 and 13-14: two steps recorded at one poll
        spot_tokens = 50 if k == 10 else 0  # a worker joined step 10 after it started
        store.record_step(job, StepMetrics(k, k, 0.5, 100, 8, 0, 1.0, clock, spot_workers=0, spot_tokens=spot_tokens))
    alone = [s.step for s in alone_steps(store.steps(job), store.instances(job))]
    # 1: the job's first; 4-6: "booting" up; 8: first after t2 started; 10: spot tokens; 11-12: "brief" up
    assert alone == [2, 3, 7, 9, 13, 14]


def test_the_controllers_spend_is_the_summarys_without_reading_steps(store: StateStore) -> None:
    """spent_dollars (asked after every step) counts what summarize counts: instances that ran, to the clock."""
    from rlboost.cli.ledger import spent_dollars

    job = store.create_job("j", "spec", "local")
    _launch(store, job, "trainer", kind=InstanceKind.ON_DEMAND, price=3.0, od=None)
    _launch(store, job, "w1", price=1.25, od=4.0)
    _launch(store, job, "never", price=1.0, od=4.0)
    store.update_instance("trainer", InstanceState.RUNNING, 0.0)
    store.update_instance("w1", InstanceState.RUNNING, 600.0)
    store.update_instance("w1", InstanceState.PREEMPTED, 4200.0)
    store.update_instance("never", InstanceState.FAILED, 100.0)
    for clock in (3000.0, 7200.0):
        store.update_job(job, clock=clock)
        assert spent_dollars(store, job) == pytest.approx(summarize(store, job).dollars)
    assert spent_dollars(store, job) == pytest.approx(6.0 + 1.25)
