"""Durable job state: one SQLite file (WAL) under `rlboost_home()`.

Everything that costs money is written here *before* it takes effect (a launch is recorded as
'pending' before the provider is asked), so a crashed controller can restart, reconcile against the
provider and never lose track of a paid instance. The cost ledger is derived from these rows only.

Secrets never enter this file: `record_launch` stores no `env` and no `command` (they carry the job
token), so nothing read back from here (status JSON, cost report) can leak it.

One connection is shared across threads (`check_same_thread=False`), serialised by a lock; writes
use `BEGIN IMMEDIATE` so check-then-insert sequences (name reuse) are atomic across processes too.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlboost.cli.step_metrics import StepMetrics, StepRow, step_columns, step_fields
from rlboost.cli.store_files import highest_run_id, open_db, writable
from rlboost.contracts.env_names import Env
from rlboost.providers.base import InstanceState, LaunchRequest

SCHEMA_VERSION = 9

JOB_STATUSES = ("pending", "running", "succeeded", "failed", "stopped")
ACTIVE_STATUSES = ("pending", "running")
_TERMINAL_STATES = tuple(s.value for s in InstanceState if s.terminal)

_SCHEMA_V1 = """
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    spec_yaml TEXT NOT NULL,
    provider TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    controller_pid INTEGER,
    trainer_url TEXT,
    error TEXT,
    step INTEGER,
    version INTEGER,
    reward REAL,
    clock REAL,
    snapshot TEXT,
    tokens_total INTEGER
);
-- The name-reuse rule, enforced by the database itself: one active job per name.
CREATE UNIQUE INDEX jobs_active_name ON jobs(name) WHERE status IN ('pending', 'running');
CREATE INDEX jobs_name ON jobs(name, id);

CREATE TABLE instances (
    instance_id TEXT PRIMARY KEY,
    job_id INTEGER NOT NULL REFERENCES jobs(id),
    provider TEXT NOT NULL,
    role TEXT NOT NULL,
    kind TEXT NOT NULL,
    cloud TEXT NOT NULL,
    region TEXT,
    accelerator TEXT,
    hourly_price REAL NOT NULL,
    on_demand_price REAL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    started_clock REAL,
    ended_clock REAL,
    end_reason TEXT,
    last_clock REAL,
    detail TEXT NOT NULL DEFAULT '',
    handle TEXT
);
CREATE INDEX instances_job ON instances(job_id);

CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id INTEGER NOT NULL REFERENCES jobs(id),
    instance_id TEXT,
    type TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '',
    clock REAL,
    wall REAL NOT NULL
);
CREATE INDEX events_job ON events(job_id, id);

CREATE TABLE steps (
    job_id INTEGER NOT NULL REFERENCES jobs(id),
    step INTEGER NOT NULL,
    version INTEGER NOT NULL,
    reward REAL NOT NULL,
    tokens INTEGER NOT NULL,
    responses INTEGER NOT NULL,
    migrated INTEGER NOT NULL,
    seconds REAL NOT NULL,
    clock REAL NOT NULL,
    wall REAL NOT NULL,
    PRIMARY KEY (job_id, step)
);
"""

# v2: how each step overlapped generation and training (NULL for steps recorded before): seconds
# into the step when the reserved engine offloaded (NULL: it did not), seconds the trainer trained
# during the tail (offload -> last response), seconds it sat idle waiting for rollouts after offloading.
_SCHEMA_V2 = """
ALTER TABLE steps ADD COLUMN offload_s REAL;
ALTER TABLE steps ADD COLUMN tail_train_s REAL;
ALTER TABLE steps ADD COLUMN idle_s REAL
"""

# v3: who generated each step (NULL before): spot workers in the step, tokens generated during the step
# (trained or not) and the part of them that spot workers generated. cost-report splits spend by it.
_SCHEMA_V3 = """
ALTER TABLE steps ADD COLUMN n_remote INTEGER;
ALTER TABLE steps ADD COLUMN gen_tokens INTEGER;
ALTER TABLE steps ADD COLUMN spot_tokens INTEGER
"""

# v4: a job whose controller runs on its trainer node (`controller: trainer`): where the launching
# machine reaches that controller, and when this store last copied the node's records (NULL: never;
# the controller runs here).
_SCHEMA_V4 = """
ALTER TABLE jobs ADD COLUMN controller_url TEXT;
ALTER TABLE jobs ADD COLUMN synced_at REAL
"""

# v5: ownership by identity. Every job gets a uid, unique across stores and machines, which its
# instances carry in their cloud tags (NULL: recorded before; its instances are known by name and id).
# The controller's process start ("boot id:start ticks") beside its pid, so a reused pid is not taken
# for it. `meta` holds facts about the store itself: its own id (tagged on every instance it launches,
# for `gc` to tell other stores' instances apart) and `written_by`, the rlboost version that last
# migrated it, so that an older rlboost can say which version to upgrade to.
_SCHEMA_V5 = """
ALTER TABLE jobs ADD COLUMN uid TEXT;
ALTER TABLE jobs ADD COLUMN controller_start TEXT;
CREATE UNIQUE INDEX jobs_uid ON jobs(uid) WHERE uid IS NOT NULL;
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta (key, value) VALUES ('store_id', lower(hex(randomblob(16))))
"""

# v6: speculative decoding per step (NULL when rollout.speculative.method is none, and before): drafted
# tokens verified, of which accepted, and the mean tokens a response gained per pass that verified a draft.
_SCHEMA_V6 = """
ALTER TABLE steps ADD COLUMN spec_drafted INTEGER;
ALTER TABLE steps ADD COLUMN spec_accepted INTEGER;
ALTER TABLE steps ADD COLUMN spec_tokens_per_pass REAL
"""

# v7: the optimizer's side of each step (NULL before, and for model.kind synthetic): the loss, its
# policy-gradient term, the gradient's norm before clipping, the learning rate, the optimizer updates.
_SCHEMA_V7 = """
ALTER TABLE steps ADD COLUMN loss REAL;
ALTER TABLE steps ADD COLUMN pg_loss REAL;
ALTER TABLE steps ADD COLUMN grad_norm REAL;
ALTER TABLE steps ADD COLUMN lr REAL;
ALTER TABLE steps ADD COLUMN updates INTEGER
"""

# v8: the trainer's seconds training each step (NULL before), for its busy share (train_s / seconds).
_SCHEMA_V8 = "ALTER TABLE steps ADD COLUMN train_s REAL"

# Future schema changes: add {N: "ALTER TABLE ..."} here and bump SCHEMA_VERSION.
_MIGRATIONS: dict[int, str] = {
    1: _SCHEMA_V1, 2: _SCHEMA_V2, 3: _SCHEMA_V3, 4: _SCHEMA_V4, 5: _SCHEMA_V5, 6: _SCHEMA_V6, 7: _SCHEMA_V7,
    8: _SCHEMA_V8, 9: "ALTER TABLE jobs ADD COLUMN launch_options TEXT",  # v9: JobRow.launch_options
}

_INSERT_EVENT = "INSERT INTO events (job_id, instance_id, type, detail, clock, wall) VALUES (?, ?, ?, ?, ?, ?)"


class StateError(Exception):
    """The state file cannot be used (newer schema, unreadable); message is user-facing."""


class JobExistsError(Exception):
    pass


class UnknownJobError(Exception):
    pass


class UnknownInstanceError(KeyError):
    pass


def rlboost_home() -> Path:
    """`$RLBOOST_HOME` or `~/.rlboost`, created private (0700) when it does not exist: it holds job
    state and tokens. An existing directory keeps its mode (a shared 1777 one must stay shared); what
    rlboost writes in it is private by itself (state 0600, run directories 0700)."""
    env = os.environ.get(Env.HOME)
    home = Path(env).expanduser() if env else Path.home() / ".rlboost"
    try:
        home.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        return home
    os.chmod(home, 0o700)  # whatever the umask
    return home


def rlboost_version() -> str:
    """This rlboost's version, as installed ("unknown" when run from a source tree never installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rlboost")
    except PackageNotFoundError:
        return "unknown"


def job_run_dir(job: JobRow) -> Path:
    """Where a job's files live on this machine: spec, token, logs, checkpoints (local provider)."""
    return rlboost_home() / "jobs" / f"{job.name}-{job.id}"


@dataclass(frozen=True)
class JobRow:
    id: int
    name: str
    spec_yaml: str
    provider: str
    status: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    controller_pid: int | None
    trainer_url: str | None
    error: str | None
    step: int | None
    version: int | None
    reward: float | None
    clock: float | None
    snapshot: dict[str, Any] | None
    tokens_total: int | None
    controller_url: str | None = None  # set: the controller runs on the trainer node, reached there
    synced_at: float | None = None  # when this store last copied the node controller's records
    uid: str | None = None  # unique across stores: what its instances are tagged with (None: before v5)
    controller_start: str | None = None  # the controller process's start (rlboost/cli/pids.py)
    launch_options: str | None = None  # launch flags for `--resume` (rlboost/cli/launch_options.py; None: before v9)

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def remote(self) -> bool:
        """Its controller runs on the trainer node; this store holds a copy of the node's records."""
        return self.controller_url is not None


@dataclass(frozen=True)
class InstanceRow:
    instance_id: str
    job_id: int
    provider: str
    role: str
    kind: str
    cloud: str
    region: str | None
    accelerator: str | None
    hourly_price: float
    on_demand_price: float | None
    state: str
    created_at: float
    started_clock: float | None
    ended_clock: float | None
    end_reason: str | None
    last_clock: float | None
    detail: str
    handle: str | None

    @property
    def id(self) -> str:
        """Alias of instance_id."""
        return self.instance_id

    @property
    def terminal(self) -> bool:
        return self.state in _TERMINAL_STATES


@dataclass(frozen=True)
class EventRow:
    id: int
    job_id: int
    instance_id: str | None
    type: str
    detail: str
    clock: float | None
    wall: float


_JOB_FIELDS = {
    "status",
    "controller_pid",
    "trainer_url",
    "started_at",
    "ended_at",
    "error",
    "step",
    "version",
    "reward",
    "clock",
    "snapshot",
    "tokens_total",
    "controller_url",
    "synced_at",
    "controller_start",
    "launch_options",
}
# what a copy of a node controller's job row takes from it (identity and the link to it stay local)
_COPIED_JOB_FIELDS = _JOB_FIELDS - {"controller_pid", "controller_start", "controller_url", "synced_at"}


class StateStore:
    def __init__(self, path: Path | None = None, *, now: Callable[[], float] = time.time) -> None:
        if path is None:
            path = rlboost_home() / "state.db"
        else:
            path = Path(path)
            if not path.parent.exists():
                path.parent.mkdir(mode=0o700, parents=True)
        self.path = path
        self._now = now
        self._lock = threading.RLock()
        # where nothing may be written, read-only commands still read (writing ones fail at their first write)
        self.read_only = not writable(path)
        try:
            self._db = open_db(path, read_only=self.read_only)
            self._check_schema() if self.read_only else self._migrate()
        except sqlite3.DatabaseError as e:
            raise StateError(f"{path}: cannot open the state database ({e})") from None

    # ---- plumbing ----------------------------------------------------------------------

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction. A signal handler may raise (the controller's `down`: Stop) between any two
        statements, even right after BEGIN: every exit rolls back what is still open, and a
        transaction an interruption left open anyway (one during the rollback) is rolled back first,
        so one badly timed signal never leaves the store refusing every later write."""
        with self._lock:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            try:
                self._db.execute("BEGIN IMMEDIATE")
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _newer(self, db: sqlite3.Connection, have: int) -> StateError:
        by = _written_by(db)
        return StateError(
            f"{self.path} was written by {f'rlboost {by}' if by else 'a newer rlboost'} (store schema "
            f"{have}; this rlboost {rlboost_version()} reads up to {SCHEMA_VERSION}): upgrade rlboost "
            f"(pip install -U rlboost), or point RLBOOST_HOME at another directory"
        )

    def _check_schema(self) -> None:
        """A read-only store is read as it is: of this schema, or refused (it cannot be migrated)."""
        have = self._db.execute("PRAGMA user_version").fetchone()[0]
        if have > SCHEMA_VERSION:
            raise self._newer(self._db, have)
        if have < SCHEMA_VERSION:
            raise StateError(
                f"{self.path} is of an older rlboost (store schema {have}, this one {SCHEMA_VERSION}) and cannot "
                "be upgraded where it may not be written: run any rlboost command once with RLBOOST_HOME writable"
            )

    def _migrate(self) -> None:
        with self._tx() as db:
            have = db.execute("PRAGMA user_version").fetchone()[0]
            if have > SCHEMA_VERSION:
                raise self._newer(db, have)
            for v in range(have + 1, SCHEMA_VERSION + 1):
                for stmt in filter(str.strip, _MIGRATIONS[v].split(";")):
                    db.execute(stmt)
                # PRAGMA cannot take parameters; v is an int from our own table.
                db.execute(f"PRAGMA user_version = {int(v)}")
            if have < SCHEMA_VERSION:
                db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('written_by', ?)", (rlboost_version(),))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @property
    def store_id(self) -> str:
        """This store's own id (made once, with the store): every instance it launches is tagged with it."""
        return str(self._query("SELECT value FROM meta WHERE key = 'store_id'")[0]["value"])

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- jobs --------------------------------------------------------------------------

    def create_job(
        self, name: str, spec_yaml: str, provider: str, *, job_id: int | None = None, uid: str | None = None
    ) -> int:
        """A new 'pending' job with a new uid; JobExistsError while another job of that name is
        pending/running. `job_id`, `uid`: what the launching machine gave it (a trainer node's store
        keeps the same, so instance ids, which embed the id, and their uid tags agree in both stores)."""
        with self._tx() as db:
            row = db.execute(
                "SELECT id, status FROM jobs WHERE name = ? AND status IN ('pending', 'running')",
                (name,),
            ).fetchone()
            if row is not None:
                raise JobExistsError(
                    f"job {name!r} is already {row['status']} (id {row['id']}); a name can be reused once "
                    "its job has ended (run `rlboost status` to list jobs), or pick another name"
                )
            cur = db.execute(
                "INSERT INTO jobs (id, name, spec_yaml, provider, status, created_at, uid) "
                "VALUES (?, ?, ?, ?, 'pending', ?, ?)",
                (job_id or self._next_job_id(db), name, spec_yaml, provider, self._now(), uid or uuid.uuid4().hex),
            )
            job_id = int(cur.lastrowid or 0)
            db.execute(
                "INSERT INTO events (job_id, type, detail, wall) VALUES (?, 'created', '', ?)",
                (job_id, self._now()),
            )
            return job_id

    def _next_job_id(self, db: sqlite3.Connection) -> int:
        """Past every id this store handed out and every run directory beside it (`jobs/NAME-ID`): a
        store deleted or emptied beside old runs never hands out an id whose directory is there."""
        seq = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone()
        top = db.execute("SELECT COALESCE(MAX(id), 0) FROM jobs").fetchone()[0]
        return max(seq[0] if seq else 0, top, highest_run_id(self.path.parent / "jobs")) + 1

    def get_job(self, name: str) -> JobRow:
        """The newest job with this name."""
        rows = self._query("SELECT * FROM jobs WHERE name = ? ORDER BY id DESC LIMIT 1", (name,))
        if not rows:
            raise UnknownJobError(f"no job named {name!r} (run `rlboost status` to list jobs)")
        return _job(rows[0])

    def job_by_id(self, job_id: int) -> JobRow:
        rows = self._query("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            raise UnknownJobError(f"no job with id {job_id} (run `rlboost status` to list jobs)")
        return _job(rows[0])

    def list_jobs(self) -> list[JobRow]:
        return [_job(r) for r in self._query("SELECT * FROM jobs ORDER BY id")]

    def update_job(self, job_id: int, **fields: Any) -> None:
        bad = set(fields) - _JOB_FIELDS
        if bad:
            raise ValueError(f"update_job: unknown field(s) {sorted(bad)} (allowed: {sorted(_JOB_FIELDS)})")
        if "status" in fields and fields["status"] not in JOB_STATUSES:
            raise ValueError(f"update_job: status {fields['status']!r} not in {JOB_STATUSES}")
        if not fields:
            return
        if "snapshot" in fields and fields["snapshot"] is not None:
            fields["snapshot"] = json.dumps(fields["snapshot"], separators=(",", ":"))
        cols = sorted(fields)
        sets = ", ".join(f"{c} = ?" for c in cols)  # names come from _JOB_FIELDS only
        with self._tx() as db:
            try:
                cur = db.execute(f"UPDATE jobs SET {sets} WHERE id = ?", (*(fields[c] for c in cols), job_id))
            except sqlite3.IntegrityError:
                raise JobExistsError(f"job id {job_id}: another job with its name is already active") from None
            if cur.rowcount == 0:
                raise UnknownJobError(f"no job with id {job_id} (run `rlboost status` to list jobs)")

    def delete_job(self, job_id: int) -> None:
        """Forget an ended job: its steps, events, instance records and row (`rlboost rm`, `gc
        --older-than`). Refused while it is active or any of its instances may still bill."""
        with self._tx() as db:
            row = db.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise UnknownJobError(f"no job with id {job_id} (run `rlboost status` to list jobs)")
            ended = ",".join("?" * len(_TERMINAL_STATES))
            live = db.execute(
                f"SELECT COUNT(*) FROM instances WHERE job_id = ? AND state NOT IN ({ended})",
                (job_id, *_TERMINAL_STATES),
            ).fetchone()[0]
            if row["status"] in ACTIVE_STATUSES or live:
                raise ValueError(f"job id {job_id} is {row['status']} with {live} live instance(s)")
            for table in ("steps", "events", "instances"):  # children first (foreign keys)
                db.execute(f"DELETE FROM {table} WHERE job_id = ?", (job_id,))
            db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))

    # ---- instances ---------------------------------------------------------------------

    def record_launch(self, job_id: int, req: LaunchRequest, provider: str, on_demand_price: float | None) -> None:
        """Record an instance as 'pending' before the provider is asked for it.

        Instance ids are global keys: the controller must make them unique across jobs (e.g. by
        including the job id), because a job name can be reused.
        """
        now = self._now()
        with self._tx() as db:
            try:
                db.execute(
                    "INSERT INTO instances (instance_id, job_id, provider, role, kind, cloud, region, "
                    "accelerator, hourly_price, on_demand_price, state, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?)",
                    (
                        req.instance_id,
                        job_id,
                        provider,
                        _val(req.role),
                        _val(req.kind),
                        req.cloud,
                        req.region,
                        req.accelerator,
                        float(req.hourly_price),
                        on_demand_price,
                        now,
                    ),
                )
            except sqlite3.IntegrityError as e:
                raise ValueError(
                    f"instance {req.instance_id!r} cannot be recorded for job {job_id} ({e}); "
                    "instance ids must be unique and the job must exist"
                ) from None
            db.execute(
                "INSERT INTO events (job_id, instance_id, type, detail, wall) VALUES (?, ?, 'launch', ?, ?)",
                (job_id, req.instance_id, f"{_val(req.role)} {_val(req.kind)} {req.cloud}", now),
            )

    def update_instance(self, instance_id: str, state: InstanceState | str, clock: float, detail: str = "") -> None:
        """Apply a state change. Terminal states are final: later updates are ignored."""
        st = InstanceState(state)
        with self._tx() as db:
            row = db.execute(
                "SELECT job_id, state, started_clock FROM instances WHERE instance_id = ?", (instance_id,)
            ).fetchone()
            if row is None:
                raise UnknownInstanceError(f"instance {instance_id!r} was never recorded (record_launch)")
            if row["state"] in _TERMINAL_STATES:
                return
            started = row["started_clock"]
            # A notice implies it was running, even if we never saw the 'running' event.
            if started is None and st in (InstanceState.RUNNING, InstanceState.NOTICE):
                started = clock
            ended, reason = (clock, st.value) if st.terminal else (None, None)
            db.execute(
                "UPDATE instances SET state = ?, started_clock = ?, ended_clock = ?, end_reason = ?, "
                "last_clock = MAX(COALESCE(last_clock, ?), ?), detail = ? WHERE instance_id = ?",
                (st.value, started, ended, reason, clock, clock, detail, instance_id),
            )
            db.execute(
                _INSERT_EVENT,
                (row["job_id"], instance_id, st.value, detail, clock, self._now()),
            )

    def touch_live(self, job_id: int, clock: float) -> None:
        """The controller saw the job's live instances still there at `clock`: their `last_clock`,
        which bounds when one went while no controller watched (a restarted controller bills it
        until then when the provider cannot say exactly)."""
        ended = ",".join("?" * len(_TERMINAL_STATES))
        with self._tx() as db:
            db.execute(
                f"UPDATE instances SET last_clock = MAX(COALESCE(last_clock, ?), ?) "
                f"WHERE job_id = ? AND state NOT IN ({ended})",
                (clock, clock, job_id, *_TERMINAL_STATES),
            )

    def set_instance_handle(self, instance_id: str, handle: str) -> None:
        """Provider-specific handle (local pid, cloud instance id, cluster name) for reconciliation."""
        with self._tx() as db:
            cur = db.execute("UPDATE instances SET handle = ? WHERE instance_id = ?", (handle, instance_id))
            if cur.rowcount == 0:
                raise UnknownInstanceError(f"instance {instance_id!r} was never recorded (record_launch)")

    def instance(self, instance_id: str) -> InstanceRow:
        rows = self._query("SELECT * FROM instances WHERE instance_id = ?", (instance_id,))
        if not rows:
            raise UnknownInstanceError(f"instance {instance_id!r} was never recorded")
        return InstanceRow(**dict(rows[0]))

    def instances(self, job_id: int) -> list[InstanceRow]:
        rows = self._query("SELECT * FROM instances WHERE job_id = ? ORDER BY created_at, rowid", (job_id,))
        return [InstanceRow(**dict(r)) for r in rows]

    def all_instances(self) -> list[InstanceRow]:
        rows = self._query("SELECT * FROM instances ORDER BY job_id, created_at, rowid")
        return [InstanceRow(**dict(r)) for r in rows]

    def live_instances(self, job_id: int) -> list[InstanceRow]:
        return [i for i in self.instances(job_id) if not i.terminal]

    # ---- events and steps --------------------------------------------------------------

    def add_event(
        self,
        job_id: int,
        type: str,
        detail: str = "",
        instance_id: str | None = None,
        clock: float | None = None,
    ) -> None:
        with self._tx() as db:
            db.execute(
                _INSERT_EVENT,
                (job_id, instance_id, type, detail, clock, self._now()),
            )

    def events(self, job_id: int) -> list[EventRow]:
        rows = self._query("SELECT * FROM events WHERE job_id = ? ORDER BY id", (job_id,))
        return [EventRow(**dict(r)) for r in rows]

    def record_step(self, job_id: int, m: StepMetrics) -> None:
        """One finished training step. Re-recording a step (after a restart) replaces it."""
        row = {**step_columns(m), "job_id": job_id, "wall": self._now()}
        with self._tx() as db:
            db.execute(f"INSERT OR REPLACE INTO steps ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                       tuple(row.values()))

    def steps(self, job_id: int) -> list[StepRow]:
        rows = self._query("SELECT * FROM steps WHERE job_id = ? ORDER BY step", (job_id,))
        return [StepRow(**step_fields(dict(r))) for r in rows]

    # ---- copies of a trainer node's records ----------------------------------------------

    def copy_from_node(
        self,
        job_id: int,
        job: JobRow,
        instances: list[InstanceRow],
        events: list[EventRow],
        steps: list[StepRow],
        *,
        as_of: float | None = None,
    ) -> bool:
        """Replace this store's records of `job_id` with what its controller on the trainer node
        holds (one transaction: a reader sees the old copy or the new one, never half of each).

        `as_of`: when the copy was asked for (default now). Several commands copy at once (`logs -f`
        polling while `down` stops the job), so a copy can arrive after a newer one: it is dropped
        (False) when a copy asked for later was applied already, or when the job ended here after it
        was asked for (`down`, or a node taken over), which a stale "running" must never undo."""
        as_of = self._now() if as_of is None else as_of
        values = {c: getattr(job, c) for c in sorted(_COPIED_JOB_FIELDS)}
        if values["snapshot"] is not None:
            values["snapshot"] = json.dumps(values["snapshot"], separators=(",", ":"))
        values["synced_at"] = as_of
        sets = ", ".join(f"{c} = ?" for c in values)  # names come from _JOB_FIELDS only
        with self._tx() as db:
            row = db.execute("SELECT status, ended_at, synced_at FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise UnknownJobError(f"no job with id {job_id} (run `rlboost status` to list jobs)")
            status, ended_at, synced_at = row
            if synced_at is not None and synced_at > as_of:
                return False
            ended_here_since = status not in ACTIVE_STATUSES and ended_at is not None and ended_at > as_of
            if ended_here_since and job.active:
                return False
            db.execute(f"UPDATE jobs SET {sets} WHERE id = ?", (*values.values(), job_id))
            for table in ("steps", "events", "instances"):
                db.execute(f"DELETE FROM {table} WHERE job_id = ?", (job_id,))
            for rows, table, skip in ((instances, "instances", ()), (events, "events", ("id",)), (steps, "steps", ())):
                for r in rows:
                    d = {k: v for k, v in (step_columns(r) if table == "steps" else asdict(r)).items() if k not in skip}
                    d["job_id"] = job_id
                    cols = ", ".join(d)
                    db.execute(f"INSERT INTO {table} ({cols}) VALUES ({', '.join('?' * len(d))})", tuple(d.values()))
        return True


def _written_by(db: sqlite3.Connection) -> str | None:
    """The rlboost version that last migrated this store (None: before schema 5, or unreadable)."""
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'written_by'").fetchone()
    except sqlite3.Error:  # no meta table, or one a later schema changed
        return None
    return str(row[0]) if row is not None else None


def _val(x: Any) -> str:
    return str(getattr(x, "value", x))


def _job(row: sqlite3.Row) -> JobRow:
    d = dict(row)
    d["snapshot"] = json.loads(d["snapshot"]) if d["snapshot"] else None
    return JobRow(**d)
