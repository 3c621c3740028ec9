"""The control endpoint of a controller that runs on the trainer node (`controller: trainer`).

The controller's own loop is synchronous; this endpoint runs beside it on an aiohttp event loop in
a thread, reads the node's state store through its own `StateStore` (safe: see state.py), and
answers the launching machine's `status`, `cost-report`, `logs` and `down` (control_api.py). Every
route needs the job's token. `down` is delivered as SIGTERM to this process, the same path a local
`rlboost down` takes, so the controller tears the job down in its main thread.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import threading
from pathlib import Path

from aiohttp import web

from rlboost.cli import control_api as api
from rlboost.cli.logs import NoLog, sources
from rlboost.cli.state import StateStore


class ControlServer:
    def __init__(self, job_id: int, run_dir: Path, token: str, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.job_id, self.run_dir, self.token, self.host, self.port = job_id, run_dir, token, host, port
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._error: BaseException | None = None
        self.released = threading.Event()  # the launching machine has copied the ended job

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> str:
        """Listen (on `port`, else a free one), write the address where the launching machine looks; the URL."""
        threading.Thread(target=self._serve, name="control-endpoint", daemon=True).start()
        self._ready.wait(30)
        if self._error is not None or not self.url:
            raise RuntimeError(f"control endpoint did not start: {self._error}")
        path = self.run_dir / api.CONTROL_FILE
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(api.ControlAddress(url=self.url, pid=os.getpid()).model_dump_json())
        tmp.replace(path)  # whole or absent: a reader never sees half an address
        return self.url

    def stop(self) -> None:
        loop, runner = self._loop, self._runner
        if loop is not None and runner is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._runner = web.AppRunner(self._app(), access_log=None)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self.host, self.port)
            loop.run_until_complete(site.start())
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://{self.host}:{port}"
        except BaseException as e:  # reported by start()
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        loop.run_forever()
        loop.close()

    # ---- routes ------------------------------------------------------------------------
    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=4096)
        store = StateStore()  # this thread's own connection to the node's store
        p = api.PREFIX

        async def ping(_: web.Request) -> web.Response:
            return web.json_response({"ok": True})

        async def state(_: web.Request) -> web.Response:
            doc = await asyncio.to_thread(self._state, store)
            return web.Response(text=doc, content_type="application/json")

        async def logs(request: web.Request) -> web.Response:
            try:
                srcs = sources(store, store.job_by_id(self.job_id), request.query.get("instance"))
            except NoLog as e:
                return web.json_response({"error": str(e)}, status=404)
            refs = [api.LogRef(label=label, name=str(path.relative_to(self.run_dir))) for label, path in srcs]
            return web.Response(text=api.LogList(logs=refs).model_dump_json(), content_type="application/json")

        async def log(request: web.Request) -> web.Response:
            path = (self.run_dir / request.query.get("name", "")).resolve()
            try:
                offset = max(0, int(request.query.get("offset", "0")))
            except ValueError:
                return web.json_response({"error": "offset: a whole number of bytes"}, status=400)
            if not path.is_relative_to(self.run_dir.resolve()) or not path.is_file():
                return web.json_response({"error": "no such log"}, status=404)
            data = await asyncio.to_thread(_read_from, path, offset)
            return web.Response(body=data, content_type="application/octet-stream")

        async def down(_: web.Request) -> web.Response:
            # the main thread's SIGTERM handler raises Stop: the same teardown as a local `down`
            os.kill(os.getpid(), signal.SIGTERM)
            return web.json_response({"ok": True}, status=202)

        async def release(_: web.Request) -> web.Response:
            self.released.set()
            return web.json_response({"ok": True})

        app.router.add_get(f"{p}/ping", ping)
        app.router.add_get(f"{p}/state", state)
        app.router.add_get(f"{p}/logs", logs)
        app.router.add_get(f"{p}/log", log)
        app.router.add_post(f"{p}/down", down)
        app.router.add_post(f"{p}/release", release)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler):  # type: ignore[no-untyped-def]
        got = request.headers.get("Authorization", "")
        if not secrets.compare_digest(got.encode(), f"Bearer {self.token}".encode()):
            return web.json_response({"error": "unauthorized"}, status=401)
        return await handler(request)

    def _state(self, store: StateStore) -> str:
        job = store.job_by_id(self.job_id)
        doc = api.NodeState(
            job=job,
            instances=store.instances(self.job_id),
            events=store.events(self.job_id),
            steps=store.steps(self.job_id),
        )
        return doc.model_dump_json()


def _read_from(path: Path, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(api.LOG_READ_MAX)
