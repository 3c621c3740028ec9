"""How the trainer's port serves HTTP (the job's app and, before it, enrolment): time limits for slow
clients, an access log that never holds a query string, and refused requests logged in one line.

aiohttp's knobs, as 3.14 has them:
- `keepalive_timeout` (RequestHandler): armed when a connection opens and again after each response, it
  closes the connection if no complete request arrived by then. That bounds an idle keep-alive connection
  and a client trickling its request line or headers byte by byte (a slowloris) alike: bytes arriving
  do not re-arm it. It does not touch a request being handled (a WebSocket, a download).
- a request's body is read by the handler, with no limit of aiohttp's but the size; `body_deadline`
  reads it first, within `HttpLimits.body_s`, else 408.
- not covered: a client that stops reading a response (a download) holds its handler until TCP gives up
  on it (tcp_keepalive is on); a WebSocket is the coordinator's to bound (hello within 10 s, heartbeats).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError

# refused requests and handler errors (aiohttp's own server logger logs a traceback for each malformed one)
HTTP_LOG = logging.getLogger("rlboost.http")


@dataclass(frozen=True)
class HttpLimits:
    idle_s: float = 30.0  # no complete request on a connection for this long: closed (idle, or headers trickling)
    body_s: float = 30.0  # a request body (at most the app's client_max_size) not read within this: 408


class PathAccessLogger(AbstractAccessLogger):
    """One line a request, with the path only: a query string (where a token may be put) or a Referer
    never reaches the log."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        v = request.version
        self.logger.info(
            '%s "%s %s HTTP/%d.%d" %d %d %.3fs',
            request.remote,
            request.method,
            request.rel_url.raw_path,
            v.major,
            v.minor,
            response.status,
            response.body_length,
            time,
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


class OneLineRefusals(logging.Filter):
    """A request aiohttp's parser refused (oversized header, bad request line...): one line naming the
    client, the status and the error's kind, and no traceback. The error's own text is left out: it
    quotes the request's bytes, which may hold a token."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg = "refused a malformed request from %s (%d %s)"
            record.args = (remote, exc.code, type(exc).__name__)
            record.exc_info, record.exc_text = None, None
        return True


HTTP_LOG.addFilter(OneLineRefusals())


def body_deadline(seconds: float):
    """Middleware: a request with a body has it read within `seconds` (a client sending it slowly gets
    408 and, after aiohttp's lingering read, the connection closed); handlers then read it from memory."""

    @web.middleware
    async def read_in_time(request: web.Request, handler) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD") and request.body_exists:
            try:
                await asyncio.wait_for(request.read(), seconds)
            except asyncio.TimeoutError:
                HTTP_LOG.info("request body from %s not read within %.0fs: refused", request.remote, seconds)
                raise web.HTTPRequestTimeout(text=f"request body not sent within {seconds:.0f}s") from None
        return await handler(request)

    return read_in_time


def app_runner(app: web.Application, limits: HttpLimits = HttpLimits()) -> web.AppRunner:
    """The runner every server on the trainer's port uses."""
    return web.AppRunner(
        app,
        handle_signals=False,
        keepalive_timeout=limits.idle_s,
        access_log_class=PathAccessLogger,
        logger=HTTP_LOG,
    )
