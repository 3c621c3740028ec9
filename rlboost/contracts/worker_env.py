"""The environment a rollout worker starts with (`python -m rlboost.worker`), as one typed record.

The controller writes it for each spot worker, the trainer for its own reserved engine, and the worker
reads it back: which field is which variable lives here only (the names themselves in
rlboost/contracts/env_names.py, with every other variable). The node templates (templates/*.sky.yaml)
export the same names from shell. Preemption notices (Env.NOTICE, Env.NOTICE_FILE) and TLS
(Env.TLS_FINGERPRINT) are set by the provider and the job's TLS, read by their modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict

from rlboost.contracts.env_names import Env

# field -> environment variable
NAMES: dict[str, str] = {
    "trainer_url": Env.TRAINER_URL,
    "token": Env.JOB_TOKEN,
    # or, for a spot worker, a single-use credential it trades for the token (rlboost/contracts/enrolment.py)
    "enrol": Env.ENROL,
    "worker_id": Env.WORKER_ID,
    "kind": Env.WORKER_KIND,
    "engine": Env.ENGINE,
    "accelerator": Env.ACCELERATOR,  # e.g. "A100:8"; synthetic engines model its speed
    "cloud": Env.CLOUD,  # where the node runs: the weight tracker groups pullers by region
    "region": Env.REGION,
}
REQUIRED = ("trainer_url", "worker_id")  # and the token or an enrolment credential


class WorkerEnvError(ValueError):
    """The worker's environment is missing a variable or holds a bad value."""


class WorkerEnv(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    trainer_url: str
    token: str | None = None
    worker_id: str
    kind: Literal["spot", "reserved"] = "spot"
    engine: str = "torch"
    accelerator: str | None = None
    cloud: str | None = None
    region: str | None = None
    enrol: str | None = None

    def to_env(self) -> dict[str, str]:
        """The variables to start a worker with (an unset optional field as an empty string)."""
        return {NAMES[k]: "" if v is None else str(v) for k, v in self.model_dump().items()}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WorkerEnv:
        """Read it back; WorkerEnvError names the variables missing or wrong."""
        missing = [NAMES[k] for k in REQUIRED if not env.get(NAMES[k])]
        if not (env.get(NAMES["token"]) or env.get(NAMES["enrol"])):
            missing.append(f"{NAMES['token']} (or {NAMES['enrol']})")
        if missing:
            raise WorkerEnvError(f"{', '.join(missing)} not set (the node bootstrap sets them)")
        kind = env.get(NAMES["kind"]) or "spot"
        if kind not in ("spot", "reserved"):
            raise WorkerEnvError(f"{NAMES['kind']}={kind!r}: must be spot or reserved")
        return cls(**{k: env[name] for k, name in NAMES.items() if env.get(name)})
