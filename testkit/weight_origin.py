"""A real weight publisher serving one version over HTTP on a thread of its own: the trainer's side of
a pull (or a broadcast's HTTP fallback) for tests and benchmarks that run the workers elsewhere."""

from __future__ import annotations

import asyncio
import threading

import torch
from aiohttp import web

from rlboost.weights.buffers import HostBuffer
from rlboost.weights.publisher import PublishOptions, WeightPublisher, add_routes

CHUNK = 16 * 1024


class Origin:
    """Publishes `tensors` as `version` and serves it (no job token) at `url`."""

    def __init__(self, tensors: dict[str, torch.Tensor], version: int = 5, chunk_bytes: int = CHUNK) -> None:
        self.pub = WeightPublisher(PublishOptions(chunk_bytes=chunk_bytes))
        self.manifest = self.pub.publish(version, tensors)
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.url = ""

        async def start() -> None:
            app = web.Application()
            add_routes(app, self.pub)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            await web.TCPSite(self.runner, "127.0.0.1", 0).start()
            host, port = self.runner.addresses[0][:2]
            self.url = f"http://{host}:{port}"
            ready.set()

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(start(), self.loop)
        assert ready.wait(30)

    def buffer(self) -> HostBuffer:
        got = self.pub.chunk_buffer(self.manifest.version, 0)
        assert got is not None
        return got[1]

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
