"""A live rollout in one process: the trainer's coordinator behind its real HTTP app, version 0
published, and WorkerAgents with synthetic engines connected over sockets (tests of a whole step)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch
from aiohttp import web

from rlboost.rollout.live import CoordinatorConfig, LiveCoordinator
from rlboost.trainer.server import build_app
from rlboost.weights.publisher import WeightPublisher
from rlboost.worker.agent import WorkerAgent, WorkerConfig


@asynccontextmanager
async def live_rollout(cfg: CoordinatorConfig, workers: int = 2) -> AsyncIterator[tuple[LiveCoordinator, list]]:
    """(coordinator, the workers' run tasks `w0`, `w1`, ...); on exit the coordinator closes, the
    workers end and the server stops."""
    coord = LiveCoordinator(cfg)
    pub = WeightPublisher()
    runner = web.AppRunner(build_app("tok", coord, pub, lambda *_: {}), handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    coord.cfg.weights_url = url
    coord.start()
    stage = getattr(pub, "stage", None) or pub.publish
    await asyncio.to_thread(stage, 0, {"w": torch.zeros(4)})
    await coord.publish(0)
    agents = [
        WorkerAgent(WorkerConfig(url, "tok", f"w{i}", engine="synthetic", accelerator="cpu")) for i in range(workers)
    ]
    runs = [asyncio.create_task(a.run()) for a in agents]
    try:
        yield coord, runs
    finally:
        await coord.close()
        await asyncio.wait_for(asyncio.gather(*runs, return_exceptions=True), timeout=20)
        await runner.cleanup()
