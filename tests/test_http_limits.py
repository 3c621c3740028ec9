"""The trainer's HTTP server against slow and careless clients (issue 56, item 7): idle and slowloris
connections are closed after the idle limit, a slow body gets 408, the access log has paths but never a
query string, and a request the parser refuses is one log line without a traceback. The server is the
trainer's app on the runner the trainer uses (rlboost/trainer/http_serving.py), with small limits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from rlboost.trainer.http_serving import HttpLimits, app_runner
from rlboost.trainer.server import build_app
from rlboost.weights.publisher import WeightPublisher
from tests.route_coordinator import idle_coordinator

TOKEN = "http-limits-token"
SECRET = "query-secret-5f3a"
SAFETY_S = 20.0  # only a bound on a broken test: every wait below ends on the server's own action


def serve(limits: HttpLimits, scenario: Callable[[int], Awaitable[None]]) -> None:
    async def main() -> None:
        app = build_app(TOKEN, idle_coordinator(), WeightPublisher(), lambda *_: {"phase": "rollout"}, limits=limits)
        runner = app_runner(app, limits)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            await asyncio.wait_for(scenario(runner.addresses[0][1]), SAFETY_S)
        finally:
            await runner.cleanup()

    asyncio.run(main())


async def read_to_close(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (the read ends on its close)."""
    got = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := await reader.read(65536):
            got += chunk
    return got


async def exchange(port: int, data: bytes) -> bytes:
    """Send `data`, read until the server closes the connection; everything it sent."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await read_to_close(reader)
    finally:
        writer.close()


async def logged(caplog, what: Callable[[logging.LogRecord], bool]) -> list[logging.LogRecord]:
    """The records matching `what`, once there is one (the access line is written after the response)."""
    while not (got := [r for r in caplog.records if what(r)]):
        await asyncio.sleep(0.01)
    return got


def request(path: str, *headers: str, auth: bool = True) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close", *headers]
    if auth:
        lines.append(f"Authorization: Bearer {TOKEN}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_the_access_log_has_the_path_and_never_the_query_string(caplog):
    caplog.set_level(logging.INFO, logger="aiohttp.access")

    async def scenario(port: int) -> None:
        ok = await exchange(port, request(f"/v1/status?since=0&token={SECRET}", f"Referer: http://x/?t={SECRET}"))
        assert ok.startswith(b"HTTP/1.1 200")
        refused = await exchange(port, request(f"/v1/weights/latest?token={SECRET}", auth=False))
        assert refused.startswith(b"HTTP/1.1 401")
        lines = await logged(caplog, lambda r: r.name == "aiohttp.access" and "/v1/weights/latest" in r.getMessage())
        assert lines and "401" in lines[0].getMessage()

    serve(HttpLimits(), scenario)
    access = [r.getMessage() for r in caplog.records if r.name == "aiohttp.access"]
    assert any('"GET /v1/status HTTP/1.1" 200' in line for line in access), access
    assert not [line for line in access if SECRET in line or "?" in line], access


def test_an_oversized_header_is_refused_in_one_line_without_a_traceback(caplog):
    caplog.set_level(logging.DEBUG)

    async def scenario(port: int) -> None:
        got = await exchange(port, request("/v1/status", "X-Big: " + "x" * 100_000))
        assert got[9:10] == b"4", got[:60]  # HTTP/1.1 4xx
        await logged(caplog, lambda r: "refused a malformed request" in r.getMessage())

    serve(HttpLimits(), scenario)
    assert not [r for r in caplog.records if r.exc_info or r.exc_text], [r.getMessage() for r in caplog.records]
    assert "Traceback" not in caplog.text
    assert "xxxxxxxx" not in caplog.text  # the request's bytes are not quoted


@pytest.mark.parametrize(
    "sent",
    [b"", b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a"],
    ids=["idle", "headers-trickling-in"],
)
def test_a_connection_without_a_whole_request_is_closed_after_the_idle_limit(sent):
    async def scenario(port: int) -> None:
        assert await exchange(port, sent) == b""  # closed by the server, nothing answered

    serve(HttpLimits(idle_s=0.2), scenario)


def test_a_slowloris_sending_its_headers_byte_by_byte_is_cut_off():
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)

        async def trickle() -> None:
            with contextlib.suppress(ConnectionError):
                for b in b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100_000:
                    writer.write(bytes([b]))
                    await writer.drain()
                    await asyncio.sleep(0.01)  # the pace of the attack, not a wait for the server

        task = asyncio.create_task(trickle())
        try:  # the server closed it, with bytes still coming (a reset, where they met the closed socket)
            assert await read_to_close(reader) == b""
        finally:
            task.cancel()
            writer.close()

    serve(HttpLimits(idle_s=0.3), scenario)


def test_a_body_sent_too_slowly_gets_408():
    head = (
        f"POST /v1/shutdown HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Length: 1000\r\n\r\n"
    )

    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head.encode() + b"{" * 10)  # and the other 990 bytes never come
        try:
            assert (await reader.readline()).startswith(b"HTTP/1.1 408")
        finally:
            writer.close()

    serve(HttpLimits(body_s=0.2), scenario)
