"""The wire contract between a controller on the trainer node and the CLI on the launching machine.

All routes sit under `/v1/control/` on the node controller's endpoint and need the job's token
(`Authorization: Bearer ...`). The CLI keeps a copy of what `state` returns in its own state store,
so `status`, `cost-report` and `logs` still answer (from that copy) when the node is gone.

    GET  /v1/control/ping                       -> {"ok": true}
    GET  /v1/control/state                      -> NodeState: the job's records on the node
    GET  /v1/control/logs?instance=ID           -> LogList: the logs `rlboost logs` shows
    GET  /v1/control/log?name=REL&offset=N      -> bytes of one log from `offset` (at most 1 MiB)
    POST /v1/control/down                       -> 202: the controller stops the job as `down` would
    POST /v1/control/release                    -> the ended job's records and logs are copied: exit
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from rlboost.cli.state import EventRow, InstanceRow, JobRow, StepRow

PREFIX = "/v1/control"
LOG_READ_MAX = 1 << 20
CONTROL_FILE = "control.json"  # in the node's run dir: where its controller listens (0600)


class Contract(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeState(Contract):
    job: JobRow
    instances: list[InstanceRow]
    events: list[EventRow]
    steps: list[StepRow]


class LogRef(Contract):
    label: str  # "controller", a trainer's or an instance's id
    name: str  # path relative to the node's run dir, as `/log?name=` takes it


class LogList(Contract):
    logs: list[LogRef]


class ControlAddress(Contract):
    """What the node controller writes to its CONTROL_FILE once it listens."""

    url: str
    pid: int
