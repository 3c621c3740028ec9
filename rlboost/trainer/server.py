"""The trainer's one open port: coordinator WebSocket, weights, status. Every route needs the job token
but POST /v1/enrol, where a spot worker trades its single-use credential for it (rlboost/trainer/enrolment.py)."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from rlboost.contracts.enrolment import WORKER_ROUTE
from rlboost.rollout.live import LiveCoordinator
from rlboost.trainer.enrolment import WorkerEnrolment
from rlboost.trainer.http_serving import HttpLimits, body_deadline
from rlboost.trainer.prometheus import CONTENT_TYPE, exposition
from rlboost.weights.publisher import WeightPublisher, add_routes
from rlboost.weights.serving import whole_number

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
log = logging.getLogger("rlboost.trainer.server")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def auth_middleware(token: str, open_handler: Handler | None = None):
    """Every request needs the token, but those the router sends to `open_handler` (enrolment, which
    checks a credential of its own)."""
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if open_handler is not None and request.match_info.handler is open_handler:
            return await handler(request)
        # surrogateescape: a header with bytes that are not UTF-8 is a wrong token (401), not a 500
        got = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        # constant-time compare: the token is the only thing guarding the port
        if not hmac.compare_digest(got, expected):
            return _error(401, "missing or wrong job token (Authorization: Bearer <token>)")
        return await handler(request)

    return check


_ALL = 1 << 62  # "I have every record": an empty history


def _count(query: Mapping[str, str], key: str) -> int:
    """A query's record count: absent is 0; anything but a whole number >= 0 is refused."""
    raw = query.get(key, "0")
    value = whole_number(raw)
    if value is None:
        raise ValueError(f"{key}: a count of records the caller has (a whole number, 0 or more), not {raw[:40]!r}")
    return value


def build_app(
    token: str,
    coordinator: LiveCoordinator,
    publisher: WeightPublisher,
    status: Callable[[int, int], dict],  # (records the caller has, evaluations it has) -> the document
    on_shutdown_request: Callable[[], None] | None = None,
    enrolment: WorkerEnrolment | None = None,
    limits: HttpLimits = HttpLimits(),
) -> web.Application:
    """The app; serve it with http_serving.app_runner (the same `limits`) for its time limits and logs."""
    enrol = enrolment.handle if enrolment is not None else None
    # bodies are read (within limits.body_s) only once the token checked out: a stranger's is never read
    middlewares = [auth_middleware(token, enrol), body_deadline(limits.body_s)]
    app = web.Application(middlewares=middlewares, client_max_size=1 << 20)
    app.router.add_get("/v1/worker", coordinator.handle_ws)
    if enrol is not None:
        app.router.add_post(WORKER_ROUTE, enrol)

    asked = [-1, -1]  # the counts the last poll carried

    async def get_status(request: web.Request) -> web.Response:
        try:
            since = [_count(request.query, k) for k in ("since", "evals_since")]
        except ValueError as e:
            return _error(400, str(e))
        # the access log has no query strings: how far a controller's polls are, once each change
        if "since" in request.query and since != asked:
            log.info("status polled since step record %d, evaluation %d", *since)
            asked[:] = since
        return web.Response(text=json.dumps(status(*since)), content_type="application/json")

    async def post_shutdown(_: web.Request) -> web.Response:
        if on_shutdown_request:
            on_shutdown_request()
        return web.json_response({"ok": True})

    async def get_metrics(_: web.Request) -> web.Response:
        # the exposition reads counters only: no step record or evaluation
        return web.Response(body=exposition(status(_ALL, _ALL)).encode(), headers={"Content-Type": CONTENT_TYPE})

    app.router.add_get("/v1/status", get_status)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_post("/v1/shutdown", post_shutdown)
    add_routes(app, publisher)
    return app
