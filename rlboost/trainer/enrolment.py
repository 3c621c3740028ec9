"""The trainer's side of enrolment (rlboost/contracts/enrolment.py).

- `WorkerEnrolment`: POST /v1/enrol, the one route that needs no job token: a spot worker trades its
  single-use credential for the token and the job's secret variables.
- `await_delivery`: a trainer node booted with only a commitment serves its port for enrolment alone,
  answers the controller's challenge with its certificate bound in, and returns once the controller
  delivered the token and the secret variables (before the model loads: HF_TOKEN may be needed).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path

from aiohttp import web
from pydantic import ValidationError

from rlboost.contracts import enrolment as E
from rlboost.contracts import tls
from rlboost.contracts.spec import JobSpec
from rlboost.trainer.http_serving import HttpLimits, app_runner, body_deadline

log = logging.getLogger("rlboost.trainer")


def job_secret_env(spec: JobSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """The job's secret variables as this trainer holds them: `envs:` names whose value is not in the
    job file (null: given with `launch --env`) and that are set here. Plain ones travel in boot data."""
    return {k: environ[k] for k, v in spec.envs.items() if v is None and k in environ}


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


class WorkerEnrolment:
    """Checks worker credentials and remembers each one used until it expires."""

    def __init__(self, token: str, audience: str, secret_env: dict[str, str], clock=time.time) -> None:
        self.token = token
        self.audience = audience  # this trainer's instance id: a credential for another one is refused
        self.secret_env = secret_env
        self.clock = clock
        self.used: dict[str, int] = {}  # nonce -> expiry

    def grant(self, credential: str) -> E.Grant:
        """The grant for a good credential, used up by this call; EnrolmentRefused names why not."""
        now = self.clock()
        self.used = {n: exp for n, exp in self.used.items() if exp >= now}  # expired ones cannot come back
        claim = E.check_worker_credential(self.token, credential, self.audience, now)
        if claim.nonce in self.used:
            raise E.CredentialUsed("the credential was used already (single use)")
        self.used[claim.nonce] = claim.expiry
        return E.Grant(token=self.token, env=self.secret_env)

    async def handle(self, request: web.Request) -> web.Response:
        try:
            credential = E.WorkerEnrol.model_validate_json(await request.read()).credential
        except (ValidationError, ValueError):
            return _error(401, "enrolment needs a credential: {\"credential\": ...}")
        try:
            grant = self.grant(credential)
        except E.EnrolmentRefused as e:
            who = credential.rsplit(".", 3)[0][:80]
            # a used credential: someone else may hold this worker's boot data
            log.warning("enrolment of %r refused: %s", who, e)
            return _error(403 if isinstance(e, E.CredentialUsed) else 401, f"enrolment refused: {e}")
        log.info("worker %s enrolled", credential.rsplit(".", 3)[0][:80])
        return web.Response(text=grant.model_dump_json(), content_type="application/json")


def listen(host: str, port: int) -> socket.socket:
    """The trainer's listening socket, bound once: enrolment and then the trainer serve on it, so the
    endpoint the controller was told stays the same and nothing else can take the port between them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=1024)


def write_endpoint(run_dir: Path, url: str) -> None:
    tmp = run_dir / "endpoint.tmp"
    tmp.write_text(url)
    os.replace(tmp, run_dir / "endpoint")


class NoDelivery(Exception):
    """No delivery came before the wait ran out."""


async def await_delivery(
    sock: socket.socket, spec: JobSpec, bind_host: str, run_dir: Path, commitment: str, wait_s: float
) -> E.Grant:
    """Serve enrolment on `sock` (a duplicate of it: the socket itself stays open, listening, for the
    trainer) until the controller delivers; the grant. NoDelivery after `wait_s`."""
    files = tls.serving_files(spec.trainer.tls, bind_host, run_dir)
    fingerprint = files.fingerprint if files else ""
    delivered: asyncio.Future[E.Grant] = asyncio.get_running_loop().create_future()

    async def challenge(request: web.Request) -> web.Response:
        try:
            nonce = E.Challenge.model_validate_json(await request.read()).nonce
        except (ValidationError, ValueError):
            return _error(400, "a challenge is {\"nonce\": ...}")
        return web.json_response({"proof": E.challenge_proof(commitment, nonce, fingerprint)})

    async def deliver(request: web.Request) -> web.Response:
        try:
            d = E.Delivery.model_validate_json(await request.read())
        except (ValidationError, ValueError):
            return _error(400, "a delivery is {\"key\": ..., \"grant\": {\"token\": ..., \"env\": {...}}}")
        if not hmac.compare_digest(E.commitment_of(d.key).encode(), commitment.encode()):
            return _error(401, "not the key this node was booted for")
        if delivered.done():
            return _error(409, "enrolled already")
        delivered.set_result(d.grant)
        return web.json_response({"ok": True})

    app = web.Application(middlewares=[body_deadline(HttpLimits().body_s)], client_max_size=E.MAX_BODY)
    app.router.add_post(E.CHALLENGE_ROUTE, challenge)
    app.router.add_post(E.DELIVER_ROUTE, deliver)
    runner = app_runner(app)
    await runner.setup()
    ssl_ctx = tls.server_context(files.cert, files.key) if files else None
    await web.SockSite(runner, sock.dup(), ssl_context=ssl_ctx).start()
    url = f"{'https' if files else 'http'}://{tls.url_host(bind_host)}:{sock.getsockname()[1]}"
    write_endpoint(run_dir, url)  # the local provider reports the trainer's endpoint from this file
    print(f"trainer waiting for enrolment at {url}", flush=True)
    try:
        grant = await asyncio.wait_for(delivered, wait_s)
    except asyncio.TimeoutError:
        raise NoDelivery(f"no job token was delivered within {wait_s:.0f}s") from None
    finally:
        await runner.cleanup()  # the delivery's response is sent first (a graceful shutdown)
    names = ", ".join(sorted(grant.env)) or "none"
    print(f"enrolled: job token and {len(grant.env)} secret variable(s) ({names})", flush=True)
    return grant
