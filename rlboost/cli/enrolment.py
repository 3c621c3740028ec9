"""The controller's side of enrolment (rlboost/contracts/enrolment.py): nodes boot without the job token, the
TLS key or the job's secret variables.

- Each spot worker gets a single-use credential for the current trainer instance, which it trades at
  the trainer for the token and the secret variables.
- A trainer whose provider kind enrols (`trainer_enrols`) gets a commitment; once it serves, the
  controller challenges it over the TLS connection it sees, pins the certificate the node made
  itself (for its own requests and for every worker it launches), and delivers the key, the token
  and the secret variables (TrainerEnrolment.attempt).
"""

from __future__ import annotations

import hmac
import http.client
import os
import secrets
import ssl
import time
from pathlib import Path
from urllib.parse import urlsplit

from rlboost.contracts import enrolment as E
from rlboost.contracts import tls
from rlboost.contracts.env_names import Env

RETRY_S = 1.0


class TrainerEnrolmentError(Exception):
    """What answers at the trainer's address must not be given the token; the message is user-facing."""


def worker_credential(token: str, worker_id: str, trainer_id: str) -> str:
    """A spot worker's credential: enrols once, with trainer instance `trainer_id`, within the hour."""
    return E.worker_credential(token, worker_id, trainer_id)


def pin_file(run_dir: Path, trainer_id: str) -> Path:
    """Where the certificate an enrolled trainer proved is kept: a resumed controller trusts it again."""
    return run_dir / "tls" / "pins" / f"{trainer_id}.pem"


def key_file(run_dir: Path, trainer_id: str) -> Path:
    """Where a trainer launch's enrolment key is kept until the trainer serves (0600, like the token)."""
    return run_dir / "tls" / "enrol" / f"{trainer_id}.key"


class TrainerEnrolment:
    """One trainer launch's enrolment. The key stays with the controller (this process and a 0600 file
    in the run dir, for a resumed controller); the node boots with `env`."""

    def __init__(self, grant: E.Grant, pin: Path, key: str | None = None) -> None:
        self.key, self.commitment = E.trainer_key() if key is None else (key, E.commitment_of(key))
        self.grant = grant
        self.pin_path = pin
        self.pin: Path | None = None  # the node's certificate once it proved itself (None over http)
        # the delivery went out (its answer may have been lost); for a resumed enrolment the dead
        # controller may have sent it, so a node that no longer answers the challenge is asked for its
        # status with the token: over https only one whose certificate was pinned after proving itself
        self.sent = key is not None
        self.done = False  # the node has the token: from here on it answers as the trainer
        self.last_error = ""
        self.next_try = 0.0  # a node still booting is tried once a second, not at every poll

    @classmethod
    def begin(cls, grant: E.Grant, run_dir: Path, trainer_id: str) -> TrainerEnrolment:
        """A new enrolment whose key is on disk before the node it is for is launched."""
        enrolment = cls(grant, pin_file(run_dir, trainer_id))
        _write_private(key_file(run_dir, trainer_id), enrolment.key)
        return enrolment

    @classmethod
    def resumed(cls, grant: E.Grant, run_dir: Path, trainer_id: str) -> TrainerEnrolment | None:
        """The enrolment a dead controller began with trainer `trainer_id` (None: it ended with the
        trainer serving, or none began: a provider whose trainers do not enrol keeps no key)."""
        try:
            key = key_file(run_dir, trainer_id).read_text().strip()
        except FileNotFoundError:
            return None
        return cls(grant, pin_file(run_dir, trainer_id), key) if key else None

    @staticmethod
    def forget(run_dir: Path, trainer_id: str) -> None:
        """The trainer serves as itself: its key opens nothing any more (the node takes one delivery)."""
        key_file(run_dir, trainer_id).unlink(missing_ok=True)

    @property
    def env(self) -> dict[str, str]:
        return {Env.ENROL_COMMITMENT: self.commitment}

    def attempt(self, url: str, timeout: float = 10.0) -> None:
        """One try at `url`: sets `done` once the node holds the grant, and returns quietly while it is
        not up yet (booting, installing). TrainerEnrolmentError when what answers fails the challenge."""
        if time.monotonic() < self.next_try:
            return
        u = urlsplit(url)
        https = u.scheme == "https"
        host, port = u.hostname or "", u.port or (443 if https else 80)
        conn = (
            http.client.HTTPSConnection(host, port, timeout=timeout, context=tls.pinned_socket_context())
            if https
            else http.client.HTTPConnection(host, port, timeout=timeout)
        )
        try:
            conn.connect()
            der = conn.sock.getpeercert(binary_form=True) if https else b""  # type: ignore[union-attr]
            fingerprint = tls.der_fingerprint(der or b"") if https else ""
            nonce = secrets.token_hex(32)
            status, body = _post(conn, E.CHALLENGE_ROUTE, E.Challenge(nonce=nonce).model_dump_json())
            if status != 200:
                # after a delivery whose answer was lost, the trainer itself answers here (401):
                # the status check that follows, pinned and with the token, says whether it took it
                self.done = self.sent
                self.last_error = f"enrolment answered {status}"
                self.next_try = time.monotonic() + RETRY_S
                return
            proof = E.Proof.model_validate_json(body).proof
            if not hmac.compare_digest(proof.encode(), E.challenge_proof(self.commitment, nonce, fingerprint).encode()):
                seen = f" (its certificate's sha256 is {fingerprint[:16]}...)" if https else ""
                raise TrainerEnrolmentError(
                    f"the server at {url}{seen} did not prove it is the trainer node this job launched, so the "
                    "job token was not sent to it: another server answers at that address, or something in "
                    "between presents a certificate of its own"
                )
            if https:
                self.pin = self._keep_pin(der or b"")
            delivery = E.Delivery(key=self.key, grant=self.grant).model_dump_json()
            self.sent = True
            status, body = _post(conn, E.DELIVER_ROUTE, delivery)
            if status in (200, 409):  # 409: a retried delivery the node had already taken
                self.done = True
                return
            raise TrainerEnrolmentError(f"the trainer node at {url} refused its enrolment ({status}: {body[:200]})")
        except (OSError, http.client.HTTPException, ssl.SSLError, ValueError) as e:
            self.last_error = f"{type(e).__name__}: {e}"
            self.next_try = time.monotonic() + RETRY_S
        finally:
            conn.close()

    def _keep_pin(self, der: bytes) -> Path:
        _write_private(self.pin_path, ssl.DER_cert_to_PEM_cert(der))
        return self.pin_path


def _write_private(path: Path, text: str) -> None:
    """`path` holds `text`, 0600 in a 0700 directory, whole or not at all (a kill mid-write)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())  # on disk before the node it is for is launched
    os.replace(tmp, path)


def _post(conn: http.client.HTTPConnection, path: str, body: str) -> tuple[int, str]:
    conn.request("POST", path, body=body.encode(), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, r.read(E.MAX_BODY).decode(errors="replace")
