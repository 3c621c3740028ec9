"""The trainer's TLS: a pinned self-signed certificate; a wrong fingerprint is refused."""

from __future__ import annotations

import asyncio
import stat

import aiohttp
import httpx
import pytest
from aiohttp import web

from rlboost.contracts.tls import client_context, is_loopback, make_self_signed, pinned, server_context


def test_loopback_detection():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("trainer.example")


def test_key_is_private_and_files_are_reused(tmp_path):
    a = make_self_signed(tmp_path, ["127.0.0.1"])
    assert stat.S_IMODE(a.key.stat().st_mode) == 0o600
    b = make_self_signed(tmp_path, ["127.0.0.1"])
    assert a == b and len(a.fingerprint) == 64


def test_pinned_client_connects_and_wrong_pin_is_refused(tmp_path):
    files = make_self_signed(tmp_path, ["127.0.0.1"])
    other = make_self_signed(tmp_path / "other", ["127.0.0.1"])

    async def scenario() -> None:
        app = web.Application()
        async def ping(_: web.Request) -> web.Response:
            return web.json_response({"ok": True})

        app.router.add_get("/ping", ping)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context(files.cert, files.key))
        await site.start()
        url = f"https://127.0.0.1:{runner.addresses[0][1]}/ping"
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(url, ssl=pinned(files.fingerprint)) as r:
                    assert (await r.json()) == {"ok": True}
                with pytest.raises(aiohttp.ServerFingerprintMismatch):
                    await s.get(url, ssl=pinned(other.fingerprint))
                with pytest.raises(aiohttp.ClientConnectorCertificateError):
                    await s.get(url)  # default verification: a self-signed cert is not trusted
            r2 = await asyncio.to_thread(httpx.get, url, verify=client_context(files.cert))
            assert r2.json() == {"ok": True}
            with pytest.raises(httpx.ConnectError):
                await asyncio.to_thread(httpx.get, url, verify=client_context(other.cert))
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
