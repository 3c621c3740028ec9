"""What `rlboost status` and `rlboost cost-report` print (rich tables) or emit (`--json`).

Everything is read from the state store: job rows, instance rows, the steps table, and the live
snapshot the controller stores on the job (read once, field by field, into a Snapshot). Each report
is built as typed records first (JobStatus with its WorkerLine rows and the store's StepRows; CostReport
over the ledger's CostSummary): the tables are drawn from them and `--json` is them as dicts. Only chosen
fields are copied out (never a raw row or the whole snapshot), so nothing secret can slip into the output.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlboost.cli.jobs_ref import resolve_job
from rlboost.cli.ledger import CostSummary, GeneratedTokens, summarize, summarize_all
from rlboost.cli.metrics_log import METRICS_FILE
from rlboost.cli.node_client import controller_reachable, node_logs_dir, node_run_dir
from rlboost.cli.state import InstanceRow, JobRow, StateStore, job_run_dir
from rlboost.cli.step_metrics import StepRow, busy_share, stale_line, steps_busy_share
from rlboost.cli.tables import add_columns, narrow_table
from rlboost.contracts.provider_kinds import provider_kind

_SPARK = "▁▂▃▄▅▆▇█"
_LIVE_STATES = ("running", "notice")
_RECENT_STEPS = 10
_ENDED_SHOWN = 5  # ended instances listed per job in the table (JSON lists all)


# ---- small formatters --------------------------------------------------------------------


def sparkline(values: list[float]) -> str:
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = hi - lo
    if span <= 0:
        return _SPARK[len(_SPARK) // 2] * len(values)
    return "".join(_SPARK[min(len(_SPARK) - 1, int((v - lo) / span * len(_SPARK)))] for v in values)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def fmt_money(x: float | None) -> str:
    if x is None:
        return "-"
    if 0 < abs(x) < 0.005:
        return "<$0.01" if x > 0 else "-<$0.01"  # not "$0.00" for something that did cost
    return f"-${-x:,.2f}" if x < 0 else f"${x:,.2f}"


def _fmt(x: Any, spec: str = "") -> str:
    return "-" if x is None else format(x, spec)


def _version(v: Any) -> int | None:
    """A weights version as shown: None before the first is published (the trainer's -1 then)."""
    return v if isinstance(v, int) and v >= 0 else None


# ---- status ------------------------------------------------------------------------------


def _spec_steps(job: JobRow) -> int | None:
    try:
        spec = yaml.safe_load(job.spec_yaml) or {}
        steps = spec.get("algorithm", {}).get("steps")
    except (yaml.YAMLError, AttributeError):
        return None
    return steps if isinstance(steps, int) else None


@dataclass(frozen=True)
class EngineSnapshot:
    """One engine as the trainer's last status described it (rlboost/contracts/status.py's WorkerStatus);
    a field a partial or older snapshot lacks is None."""

    kind: str | None = None
    state: str | None = None
    version: int | None = None
    tokens_per_s: float | None = None
    tokens: int | None = None
    active: int | None = None

    @classmethod
    def of(cls, d: dict[str, Any]) -> EngineSnapshot:
        return cls(**{f.name: d.get(f.name) for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class Snapshot:
    """What the reports read of the trainer's last status, as the controller stored it on the job
    (read field by field: a snapshot may be partial, or hold more than is shown)."""

    phase: str | None = None
    step: int | None = None
    steps: int | None = None
    version: int | None = None
    reward: float | None = None
    migrated: int = 0
    tokens_total: int | None = None
    eval: dict[str, Any] | None = None  # the last validation: version, step, pass@1, mean_reward, ...
    reward_errors: dict[str, int] = dataclasses.field(default_factory=dict)
    engines: dict[str, EngineSnapshot] = dataclasses.field(default_factory=dict)  # by worker id

    @classmethod
    def of(cls, snap: dict[str, Any] | None) -> Snapshot:
        d = snap or {}
        engines = {
            str(w["worker_id"]): EngineSnapshot.of(w)
            for w in d.get("workers", [])
            if isinstance(w, dict) and w.get("worker_id") is not None
        }
        return cls(
            phase=d.get("phase"),
            step=d.get("step"),
            steps=d.get("steps"),
            version=d.get("version"),
            reward=d.get("reward"),
            migrated=d.get("migrated", 0),
            tokens_total=d.get("tokens_total"),
            eval=d.get("eval"),
            reward_errors=d.get("reward_errors") or {},
            engines=engines,
        )


@dataclass(frozen=True)
class WorkerLine:
    """An instance of the job, or an engine only the coordinator knew (the trainer's own)."""

    instance_id: str
    recorded: bool  # False: an engine known only to the coordinator
    role: str | None
    kind: str | None
    provider: str | None
    cloud: str | None
    region: str | None
    accelerator: str | None
    hourly_price: float | None
    state: str | None
    end_reason: str | None
    version: int | None
    tokens_per_s: float | None
    tokens: int | None
    active: int | None

    @classmethod
    def of(cls, wid: str, inst: InstanceRow | None, engine: EngineSnapshot | None) -> WorkerLine:
        e = engine or EngineSnapshot()
        return cls(
            instance_id=wid,
            recorded=inst is not None,
            role=inst.role if inst else None,
            kind=inst.kind if inst else e.kind,
            provider=inst.provider if inst else None,
            cloud=inst.cloud if inst else None,
            region=inst.region if inst else None,
            accelerator=inst.accelerator if inst else None,
            hourly_price=inst.hourly_price if inst else None,
            state=inst.state if inst else e.state,
            end_reason=inst.end_reason if inst else None,
            version=_version(e.version),
            tokens_per_s=e.tokens_per_s,
            tokens=e.tokens,
            active=e.active,
        )


@dataclass(frozen=True)
class JobStatus:
    """One job in `rlboost status` (its `--json`: these fields, in this order)."""

    id: int
    name: str
    status: str
    status_text: str
    controller: str  # launcher | trainer-node
    controller_url: str | None
    synced_at: float | None
    controller_pid: int | None
    controller_alive: bool | None
    provider: str
    phase: str | None
    step: int | None
    steps: int | None
    reward: float | None
    version: int | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    elapsed_s: float | None
    clock: float | None
    workers_live: int
    preemptions: int
    migrated: int
    eval: dict[str, Any] | None  # the last validation on held-out problems (task.eval_every)
    reward_errors: dict[str, int]  # a custom reward's failures by kind (each scored 0)
    tokens_total: int | None
    # the trainer's training seconds over its steps' wall seconds, so far (None: no step carries them)
    trainer_busy_share: float | None
    trainer_url: str | None
    metrics_file: str
    error: str | None
    workers: list[WorkerLine]
    recent_steps: list[StepRow]
    reward_history: list[float]

    def as_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "recent_steps": [_step_json(s) for s in self.recent_steps]}


def _step_json(s: StepRow) -> dict[str, Any]:
    """A recent step in `status --json`, by the keys it had before steps were typed (`seconds` is its
    step_s, `idle_s` its trainer_idle_s)."""
    return {
        "step": s.step,
        "version": s.version,
        "staleness": s.staleness,
        "reward": s.reward,
        "tokens": s.tokens,
        "responses": s.responses,
        "migrated": s.migrated,
        "seconds": s.step_s,
        "offload_s": s.offload_s,
        "tail_train_s": s.tail_train_s,
        "idle_s": s.trainer_idle_s,
        "train_s": s.train_s,
        "trainer_busy_share": busy_share(s.train_s, s.step_s),
        "spec_drafted": s.spec_drafted,
        "spec_accepted": s.spec_accepted,
        "spec_tokens_per_pass": s.spec_tokens_per_pass,
        "loss": s.loss,
        "pg_loss": s.pg_loss,
        "grad_norm": s.grad_norm,
        "lr": s.lr,
        "updates": s.updates,
    }


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def _job_status(store: StateStore, job: JobRow, now: float) -> JobStatus:
    snap = Snapshot.of(job.snapshot)
    insts = store.instances(job.id)
    workers = [WorkerLine.of(i.instance_id, i, snap.engines.get(i.instance_id)) for i in insts]
    known = {i.instance_id for i in insts}
    # engines only the coordinator knew (the trainer's own): their last snapshot is stale once the job
    # has ended, and they ended with its trainer
    gone = {} if job.active else {"state": "ended", "tokens_per_s": None, "active": None}
    workers += [
        WorkerLine.of(wid, None, dataclasses.replace(e, **gone)) for wid, e in snap.engines.items() if wid not in known
    ]
    steps = store.steps(job.id)
    start = job.started_at if job.started_at is not None else job.created_at
    end = job.ended_at if job.ended_at is not None else (now if job.active else None)
    alive = controller_state(store, job)
    status_text = job.status
    if alive is False and job.remote:
        age = fmt_duration(now - job.synced_at) if job.synced_at is not None else "never"
        status_text = (
            f"{job.status} as of {age} ago (its controller on the trainer node does not answer: "
            f"`rlboost launch --resume {job.id}` takes it over, `rlboost gc` cleans it up)"
        )
    elif alive is False:
        status_text = f"{job.status} (controller dead: run `rlboost launch --resume {job.id}` or `rlboost gc`)"
    return JobStatus(
        id=job.id,
        name=job.name,
        status=job.status,
        status_text=status_text,
        controller="trainer-node" if job.remote else "launcher",
        controller_url=job.controller_url,
        synced_at=job.synced_at,
        controller_pid=job.controller_pid,
        controller_alive=alive,
        provider=job.provider,
        phase=snap.phase,
        step=job.step if job.step is not None else snap.step,
        steps=snap.steps or _spec_steps(job),
        reward=job.reward if job.reward is not None else snap.reward,
        version=_version(job.version if job.version is not None else snap.version),
        created_at=job.created_at,
        started_at=job.started_at,
        ended_at=job.ended_at,
        elapsed_s=(end - start) if end is not None else None,
        clock=job.clock,
        workers_live=sum(1 for i in insts if i.role == "worker" and i.state in _LIVE_STATES),
        preemptions=sum(1 for i in insts if "preempted" in (i.state, i.end_reason)),
        # the recorded steps, as cost-report and metrics.jsonl count them: the trainer's own counters
        # restart with it (down + --resume); before the first step, the live counters
        migrated=sum(r.migrated for r in steps) if steps else snap.migrated,
        eval=snap.eval,
        reward_errors=snap.reward_errors,
        tokens_total=sum(r.tokens for r in steps) if steps else _first(job.tokens_total, snap.tokens_total),
        trainer_busy_share=steps_busy_share(steps),
        trainer_url=job.trainer_url,
        metrics_file=str(metrics_file(job)),
        error=job.error,
        workers=workers,
        recent_steps=steps[-_RECENT_STEPS:],
        reward_history=[s.reward for s in steps],
    )


def metrics_file(job: JobRow) -> Path:
    """The job's metrics.jsonl: in its run dir; for a job controlled from its trainer node, the copy
    taken when it ended, else the node's own file (the stand-in node's path on this machine)."""
    if not job.remote:
        return job_run_dir(job) / METRICS_FILE
    copied = node_logs_dir(job) / METRICS_FILE
    return copied if copied.exists() else node_run_dir(job) / METRICS_FILE


def controller_state(store: StateStore, job: JobRow) -> bool | None:
    """Is an active job's controller process alive? None for an ended job (it has none) and for one
    whose launch is still recording its controller."""
    from rlboost.cli.pids import controller_alive
    from rlboost.cli.reconcile import _just_created

    if not job.active:
        return None
    if job.remote:
        return controller_reachable(job)
    if controller_alive(job.controller_pid, job.controller_start):
        return True
    # a controller records its job's end before it exits: one that just finished is not dead
    again = store.job_by_id(job.id)
    if not again.active or again.controller_pid != job.controller_pid:
        return None if not again.active else controller_alive(again.controller_pid, again.controller_start)
    return None if _just_created(job) else False


def job_statuses(store: StateStore, job: str | None, *, now: float | None = None) -> list[JobStatus]:
    """One job (an id, or the newest run of a name) or all jobs, newest first."""
    t = time.time() if now is None else now
    jobs = [resolve_job(store, job)] if job else store.list_jobs()[::-1]
    return [_job_status(store, j, t) for j in jobs]


def status_json(store: StateStore, job: str | None, *, now: float | None = None) -> dict[str, Any]:
    """{"jobs": [...]}: `rlboost status --json`."""
    return {"jobs": [js.as_json() for js in job_statuses(store, job, now=now)]}


def _workers_table(js: JobStatus) -> Table:
    table = narrow_table(f"{js.name} — workers")
    add_columns(
        table, "instance", "kind", "provider / region / accel", "state", "ver", "tok/s", numbers=("ver", "tok/s")
    )
    done = ("preempted", "exited", "terminated", "failed")
    live = [w for w in js.workers if w.state not in done]
    # launches refused for capacity never ran: count them, don't list them
    refused = sum(1 for w in js.workers if w.state == "failed")
    ended = [w for w in js.workers if w.state in done and w.state != "failed"]
    for w in live + ended[-_ENDED_SHOWN:]:
        where = "/".join(str(x) for x in (w.provider, w.region, w.accelerator) if x) or "-"
        kind = (w.kind or "-") + (" trainer" if w.role == "trainer" else "")
        state = w.state or "-"
        style = {"running": "green", "notice": "yellow", "preempted": "red", "pending": "cyan"}.get(state, "")
        table.add_row(
            Text(w.instance_id),
            Text(kind),
            Text(where),
            Text(state, style=style),
            _fmt(w.version, "d") if isinstance(w.version, int) else "-",
            _fmt(w.tokens_per_s, ".1f") if isinstance(w.tokens_per_s, (int, float)) else "-",
        )
    hidden = len(ended) - _ENDED_SHOWN
    notes = []
    if hidden > 0:
        notes.append(f"{hidden} older ended instance(s) not shown")
    if refused:
        notes.append(f"{refused} launch(es) refused for lack of capacity")
    if notes:
        table.caption = "; ".join(notes) + " (see --json)"
    return table


def _steps_table(js: JobStatus) -> Table:
    table = narrow_table(f"{js.name} — recent steps")
    # offload: seconds into the step when the trainer's engine handed its work to the spot workers;
    # tail train / idle: after that, seconds the trainer trained finished groups / waited for rollouts
    cols = ("step", "weights", "reward", "tokens", "responses", "migrated", "seconds", "offload", "tail train", "idle")
    # speculative decoding, where it was on: drafted tokens, accepted, tokens per verifying forward pass
    spec = any(s.spec_drafted is not None for s in js.recent_steps)
    if spec:
        cols = (*cols, "drafted", "accepted", "tok/pass")
    # the optimizer's figures, where the learner has them (not model.kind synthetic): the whole loss,
    # the gradient's norm before clipping, the learning rate of the step's last update
    optim = any(s.grad_norm is not None for s in js.recent_steps)
    if optim:
        cols = (*cols, "loss", "grad norm", "lr")
    # algorithm.max_staleness: versions between the weights that generated a step and those it trained
    stale = any(s.staleness for s in js.recent_steps)
    if stale:
        cols = (cols[0], "stale", *cols[1:])
    add_columns(table, *cols, numbers=cols)
    for s in js.recent_steps:
        # with no offload there was no tail to train in or wait through (the trainer records 0 for both)
        tail = ["-", "-"] if s.offload_s is None else [_fmt(s.tail_train_s, ".1f"), _fmt(s.trainer_idle_s, ".1f")]
        if spec:
            tail += [_fmt(s.spec_drafted), _fmt(s.spec_accepted), _fmt(s.spec_tokens_per_pass, ".2f")]
        if optim:
            tail += [_fmt(s.loss, ".4f"), _fmt(s.grad_norm, ".3f"), _fmt(s.lr, ".3g")]
        table.add_row(
            str(s.step),
            *([str(s.staleness)] if stale else []),
            str(s.version),
            f"{s.reward:.3f}",
            str(s.tokens),
            str(s.responses),
            str(s.migrated),
            f"{s.step_s:.1f}",
            _fmt(s.offload_s, ".1f"),
            *tail,
        )
    return table


def render_status(store: StateStore, job: str | None, console: Console, *, now: float | None = None) -> None:
    jobs = job_statuses(store, job, now=now)
    if not jobs:
        console.print("No jobs yet. Start one with `rlboost launch job.yaml`.")
        return
    # short headers so that the table fits an 80-column terminal; a long name folds, never cut (tables.py)
    table = narrow_table("rlboost jobs")
    nums = ("step", "reward", "ver", "elapsed", "wkrs", "pre", "migr")
    add_columns(table, "id", "job", "status", *nums, numbers=("id", *nums))
    for js in jobs:
        steps = f"{_fmt(js.step)}/{_fmt(js.steps)}"
        style = {"running": "green", "failed": "red", "pending": "cyan", "stopped": "yellow"}.get(js.status, "")
        shown = js.status
        if js.controller_alive is False:
            dead = "node unreachable" if js.controller == "trainer-node" else "controller dead"
            shown, style = f"{js.status}\n({dead})", "bold red"
        table.add_row(
            str(js.id),
            Text(js.name),
            Text(shown, style=style),
            steps,
            _fmt(js.reward, ".3f"),
            _fmt(js.version),
            fmt_duration(js.elapsed_s),
            str(js.workers_live),
            str(js.preemptions),
            str(js.migrated),
        )
    console.print(table)
    for js in jobs:
        if js.controller_alive is False:
            console.print(Text(f"{js.name} (id {js.id}): {js.status_text}", style="red"))
    # Details for the named job, or for every job still pending/running.
    for js in jobs:
        if job is None and js.status not in ("pending", "running"):
            continue
        if js.error:
            console.print(Text(f"{js.name}: {js.error}", style="red"))
        if js.workers:
            console.print(_workers_table(js))
        if js.reward_history:
            hist = js.reward_history[-40:]
            console.print(f"{js.name} reward (last {len(hist)} steps): {sparkline(hist)}  {hist[-1]:.3f}", markup=False)
        if js.trainer_busy_share is not None:
            console.print(f"{js.name} trainer busy: {js.trainer_busy_share:.0%} {_BUSY}", markup=False)
        if stale := [s.staleness for s in js.recent_steps if s.staleness]:
            line = stale_line(len(stale), len(js.recent_steps), max(stale), " of the recent")
            console.print(f"{js.name} {line}", markup=False)
        if js.eval:
            ev = js.eval
            console.print(
                f"{js.name} eval after step {ev['step']}: pass@1 {ev['pass@1']:.3f}  mean reward "
                f"{ev['mean_reward']:.3f}  ({ev['problems']} held-out problems)",
                markup=False,
            )
        if js.reward_errors:
            kinds = ", ".join(f"{k} x{n}" for k, n in sorted(js.reward_errors.items()))
            console.print(Text(f"{js.name} custom reward failed (scored 0): {kinds}", style="yellow"))
        if job is not None and js.recent_steps:
            console.print(_steps_table(js))


_BUSY = "of its steps' seconds training (100%: it never waits for rollouts)"


# ---- cost --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Clocks:
    """The two clocks of a job: the one it is billed on, and the wall clock it ran on."""

    billing_clock: str  # the local provider bills on the spot trace's replayed clock; a cloud on the wall clock
    billed_s: float | None
    wall_s: float | None

    @classmethod
    def of(cls, store: StateStore, row: JobRow) -> Clocks:
        wall = None
        if row.started_at is not None:
            wall = (row.ended_at or time.time()) - row.started_at
        billed = max((i.ended_clock or i.last_clock or 0.0 for i in store.instances(row.id)), default=None)
        billed = max(billed or 0.0, row.clock or 0.0) or None
        return cls(provider_kind(row.provider).billing_clock, billed, wall)


@dataclass(frozen=True)
class JobCost:
    """One job's line in the report of every job."""

    job: str
    job_id: int
    status: str
    dollars: float
    on_demand_equivalent_dollars: float
    instance_hours: float
    steps: int
    dollars_per_step: float | None
    trainer_busy_share: float | None

    @classmethod
    def of(cls, row: JobRow, s: CostSummary) -> JobCost:
        spend = (s.dollars, s.on_demand_equivalent_dollars, s.instance_hours, s.steps, s.dollars_per_step)
        return cls(row.name, row.id, row.status, *spend, s.trainer_busy_share)


@dataclass(frozen=True)
class CostReport:
    """`rlboost cost-report`: one job's ledger (`job` set) or every job's, with a line per job."""

    summary: CostSummary
    job: JobRow | None = None
    clocks: Clocks | None = None
    jobs: list[JobCost] = dataclasses.field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        if self.job is not None and self.clocks is not None:
            row = self.job
            out = {"scope": "job", "job": row.name, "job_id": row.id, "status": row.status}
            return {**out, **dataclasses.asdict(self.clocks), **_summary_json(self.summary)}
        return {"scope": "all", **_summary_json(self.summary), "jobs": [dataclasses.asdict(j) for j in self.jobs]}


def _summary_json(s: CostSummary) -> dict[str, Any]:
    d = dataclasses.asdict(s)
    d["lines"] = [dataclasses.asdict(line) for line in s.lines]
    d["instances"] = [dataclasses.asdict(i) for i in s.instances]
    d["notes"] = list(s.notes)
    g = s.generated
    d["generated"].update(
        spot_dollars_per_million=g.spot_dollars_per_million, reserved_dollars_per_million=g.reserved_dollars_per_million
    )
    return d


def cost_report(store: StateStore, job: str | None) -> CostReport:
    """The ledger for one job (newest of that name) or all jobs, with a per-job breakdown."""
    if job:
        row = resolve_job(store, job)
        return CostReport(summarize(store, row.id), row, Clocks.of(store, row))
    # newest first, as `rlboost status` lists them
    per_job = [JobCost.of(row, summarize(store, row.id)) for row in store.list_jobs()[::-1]]
    return CostReport(summarize_all(store), jobs=per_job)


def cost_json(store: StateStore, job: str | None) -> dict[str, Any]:
    """`rlboost cost-report --json`."""
    return cost_report(store, job).as_json()


def render_cost(store: StateStore, job: str | None, console: Console) -> None:
    report = cost_report(store, job)
    s, row = report.summary, report.job
    if row is None and not report.jobs:
        console.print("No jobs yet, so no spend. Start one with `rlboost launch job.yaml`.")
        return
    title = f"cost — {row.name} (id {row.id}, {row.status})" if row is not None else "cost — all jobs"
    table = narrow_table(title, show_footer=True)
    nums = ("inst", "inst-hours", "cost", "same hours on-demand")
    add_columns(table, "kind", "cloud", "accel", *nums, numbers=nums)
    footers = [
        "total",
        "",
        "",
        str(sum(ln.instances for ln in s.lines)),
        f"{s.instance_hours:.2f}",
        fmt_money(s.dollars),
        fmt_money(s.on_demand_equivalent_dollars),
    ]
    for col, footer in zip(table.columns, footers, strict=True):
        col.footer = footer
    for ln in s.lines:
        table.add_row(
            Text(str(ln.kind)),  # spec text, not markup
            Text(str(ln.cloud)),
            Text(str(ln.accelerator)),
            str(ln.instances),
            f"{ln.instance_hours:.2f}",
            fmt_money(ln.dollars),
            fmt_money(ln.on_demand_equivalent_dollars),
        )
    console.print(table)
    say = _plain(console)
    if report.clocks is not None:
        say(_clock_line(report.clocks))
    if s.refused_launches:
        say(f"launches that never ran (refused, or cancelled first; not billed): {s.refused_launches}")
    _render_tokens(s.generated, console)
    cf = s.counterfactual
    if cf is not None:
        frac = f" ({cf.saved_fraction:.0%})" if cf.saved_fraction is not None else ""
        tps = cf.alone_tokens_per_s
        rate = f"at its measured {tps:,.0f} tokens/s" if tps else "as measured"
        say(
            f"on-demand counterfactual: {fmt_money(cf.dollars)} for the same trained tokens on the trainer alone "
            f"({rate} on {cf.alone_steps} step(s) with no spot worker up); spot saved "
            f"{fmt_money(cf.saved_dollars)}{frac}"
        )
    pct = f" ({s.savings_fraction:.0%})" if s.savings_fraction is not None else ""
    say(
        f"the same instance-hours all on-demand would cost {fmt_money(s.on_demand_equivalent_dollars)}: "
        f"{fmt_money(s.savings_dollars)} less{pct}"
    )
    say(
        f"$ per step: {fmt_money(s.dollars_per_step)} over {s.steps} step(s); "
        f"$ per 1M trained tokens: {fmt_money(s.dollars_per_million_tokens)} over {s.tokens:,}"
    )
    say(f"preemptions: {s.preemptions}; responses migrated mid-generation: {s.migrations}")
    if s.trainer_busy_share is not None:
        say(f"trainer busy: {s.trainer_busy_share:.0%} {_BUSY}")
    if s.stale_steps:
        say(stale_line(s.stale_steps, s.steps, s.max_staleness))
    for note in s.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    if row is None and len(report.jobs) > 1:
        jt = narrow_table("per job")
        nums = ("id", "instance-h", "cost", "steps", "$ / step", "busy")
        add_columns(jt, "job", "id", "status", *nums[1:], numbers=nums)
        for j in report.jobs:
            jt.add_row(
                Text(j.job),
                str(j.job_id),
                j.status,
                f"{j.instance_hours:.2f}",
                fmt_money(j.dollars),
                str(j.steps),
                fmt_money(j.dollars_per_step),
                _fmt(j.trainer_busy_share, ".0%"),
            )
        jt.caption = f"busy: the trainer's share {_BUSY}"
        console.print(jt)


def _plain(console: Console):
    return lambda line: console.print(line, markup=False, highlight=False)  # wrapped at the console width


def _clock_line(c: Clocks) -> str:
    if c.billing_clock == "trace":
        return (
            f"billed on the replayed spot trace's clock: {fmt_duration(c.billed_s)} of trace "
            f"in {fmt_duration(c.wall_s)} of wall time (local.time_scale)"
        )
    return f"billed on the wall clock: {fmt_duration(c.billed_s)}"


def _render_tokens(g: GeneratedTokens, console: Console) -> None:
    total = g.spot + g.reserved
    if not total:
        return
    t = narrow_table("tokens generated")
    nums = ("tokens", "share", "cost", "$ per 1M")
    add_columns(t, "where", *nums, numbers=nums)
    sides = (
        ("spot workers", g.spot, g.spot_dollars, g.spot_dollars_per_million),
        ("reserved (trainer)", g.reserved, g.reserved_dollars, g.reserved_dollars_per_million),
    )
    for label, tokens, dollars, per_million in sides:
        t.add_row(label, f"{tokens:,}", f"{tokens / total:.0%}", fmt_money(dollars), fmt_money(per_million))
    t.caption = "reserved: the trainer's whole bill, which also pays for training"
    console.print(t)
