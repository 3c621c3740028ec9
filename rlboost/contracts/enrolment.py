"""Enrolment: how a node gets the job token and the job's secret variables without either ever being
in its boot data (AWS user-data, GCP startup-script metadata, a process's launch environment).

- **Spot workers** boot with a worker credential, `<worker id>.<expiry>.<nonce>.<mac>`: the mac is
  HMAC-SHA256 under the job token over the worker id, expiry, nonce and the trainer instance it is
  for, so the trainer checks it without any registration. The worker trades it once, before its
  expiry, at POST /v1/enrol (over the pinned TLS it uses for everything) for the token and the
  secret variables; the trainer refuses a second use.
- **The trainer node** boots with a commitment, sha256 of a one-time key only the controller holds.
  Once the node serves, the controller asks it to prove, over the very TLS connection it sees, that
  it holds the commitment: HMAC(commitment, nonce | the certificate's fingerprint), which a
  man-in-the-middle with another certificate cannot answer. The controller then pins that
  certificate and delivers the key, the token and the secret variables in one request; the node
  takes them only with the key whose hash it was booted with, once. Reading the boot data gives no
  way to deliver a token of one's own.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

# in the environment (rlboost/contracts/env_names.py): a spot worker's credential is Env.ENROL, a trainer
# node's commitment Env.ENROL_COMMITMENT (sha256 of the controller's key, hex), and the trainer's instance id,
# the audience of its workers' credentials, Env.INSTANCE_ID

WORKER_ROUTE = "/v1/enrol"
CHALLENGE_ROUTE = "/v1/enrol/trainer/challenge"
DELIVER_ROUTE = "/v1/enrol/trainer/deliver"

# a worker credential's life: long enough for a cloud node to boot and install rlboost (and vLLM)
WORKER_CREDENTIAL_TTL_S = 3600.0
# how long a trainer node waits for its delivery before it gives up (and its node powers off)
TRAINER_WAIT_S = 3600.0
MAX_BODY = 1 << 20


class EnrolmentRefused(Exception):
    """A credential that is malformed, forged, for another trainer, expired or used already."""


class CredentialUsed(EnrolmentRefused):
    """A good credential presented a second time (HTTP 403; the others are 401)."""


class WorkerEnrol(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    credential: str = Field(max_length=512)


class Grant(BaseModel):
    """What a node is handed: the job token and the job's secret variables (`launch --env`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    token: str = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)


class Challenge(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    nonce: str = Field(min_length=32, max_length=128)


class Proof(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    proof: str = Field(max_length=128)


class Delivery(BaseModel):
    """The controller's one request to a trainer node: the key the node's commitment hashes, and the grant."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str = Field(max_length=128)
    grant: Grant


def _mac(key: str, *parts: str) -> str:
    return hmac.new(key.encode(), "|".join(parts).encode(), hashlib.sha256).hexdigest()


# ---- spot workers -----------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerClaim:
    worker_id: str
    expiry: int
    nonce: str


def worker_credential(
    token: str, worker_id: str, audience: str, *, ttl_s: float = WORKER_CREDENTIAL_TTL_S, now: float | None = None
) -> str:
    """A credential for `worker_id` to enrol once with trainer instance `audience` within `ttl_s`."""
    expiry = int((time.time() if now is None else now) + ttl_s)
    nonce = secrets.token_hex(16)
    return f"{worker_id}.{expiry}.{nonce}.{_mac(token, 'worker', worker_id, str(expiry), nonce, audience)}"


def check_worker_credential(token: str, credential: str, audience: str, now: float | None = None) -> WorkerClaim:
    """The claim a credential makes, once its mac, audience and expiry check out; EnrolmentRefused
    otherwise. Whether it was used already is the caller's record (rlboost/trainer/enrolment.py)."""
    parts = credential.rsplit(".", 3)
    if len(parts) != 4 or not parts[1].isdigit():
        raise EnrolmentRefused("not an enrolment credential")
    worker_id, expiry, nonce, mac = parts
    if not hmac.compare_digest(mac.encode(), _mac(token, "worker", worker_id, expiry, nonce, audience).encode()):
        raise EnrolmentRefused("a credential this trainer did not issue (another job, or another trainer instance)")
    if int(expiry) < (time.time() if now is None else now):
        raise EnrolmentRefused("the credential expired")
    return WorkerClaim(worker_id, int(expiry), nonce)


# ---- the trainer node -------------------------------------------------------------------------


def trainer_key() -> tuple[str, str]:
    """(key, commitment): the controller keeps the key; the node boots with the commitment."""
    key = secrets.token_hex(32)
    return key, commitment_of(key)


def commitment_of(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def challenge_proof(commitment: str, nonce: str, fingerprint: str) -> str:
    """The node's answer: bound to the certificate the controller sees ('' over plain http)."""
    return _mac(commitment, "trainer", nonce, fingerprint)
