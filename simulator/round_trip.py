"""What a local job's platform costs between the engine's batches, measured with the real parts: the
trainer's Coordinator behind its aiohttp server and WeightPublisher, and a real WorkerAgent running the
job's engine over loopback (one process, one event loop; in a live job they are separate processes).

  dispatch_s  an engine that batches statically (torch): from one batch's end to the next batch
              starting on the same engine - its ends reported, the coordinator's dispatch decision,
              the requests sent and received. One step of several full batches whose requests ask for
              one token each, less the same batches run straight on the same engine class.
  pull_s      a new weight version published -> the worker's engine holds it: the manifest, the delta
              from the version it has, its checks and the load (after one supervised step, so the
              delta is a real step's).

On a GPU both are noise next to a batch; on this CPU a tiny-gpt batch takes a few milliseconds and
these are of the same order, so `rlboost simulate` of a local job needs them.
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import torch
from aiohttp import web

from contracts.engine import Engine, GenRequest
from contracts.sampling import request_id
from contracts.spec import JobSpec
from rollout import scheduling
from rollout.coordinator import Coordinator, RolloutRequest
from trainer.server import build_app
from weights.publisher import WeightPublisher
from worker.agent import WorkerAgent, WorkerConfig

ROUNDS = 6
STEPS = 3  # timed steps of ROUNDS rounds each
PULLS = 3

Weights = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Platform:
    dispatch_s: float
    pull_s: float


class _Harness:
    """A coordinator and one worker agent on this event loop."""

    def __init__(self, spec: JobSpec, eos_id: int) -> None:
        self.spec, self.token = spec, secrets.token_hex(16)
        # the job's own config; a long heartbeat timeout (the engine thread holds the GIL in bursts
        # here) and no migration (one engine)
        cfg = replace(scheduling.coordinator_config(spec, eos_id), heartbeat_timeout_s=60.0, migration=None)
        self.coord = Coordinator(cfg)
        self.publisher = WeightPublisher()

    async def __aenter__(self) -> _Harness:
        app = build_app(self.token, self.coord, self.publisher, lambda *_: {}, lambda: None)
        self.runner = web.AppRunner(app, handle_signals=False)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        self.coord.cfg.weights_url = url
        self.coord.start()
        cfg = WorkerConfig(url, self.token, "calibration", engine=self.spec.rollout.engine, accelerator="cpu")
        self.agent = asyncio.ensure_future(WorkerAgent(cfg).run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.coord.close()
        self.agent.cancel()
        await asyncio.gather(self.agent, return_exceptions=True)
        await self.runner.cleanup()

    async def publish(self, version: int, weights: Weights) -> float:
        """Seconds from the version's announcement to the worker's engine holding it."""
        await asyncio.to_thread(self.publisher.stage(version, weights).result)
        t0 = time.perf_counter()
        await self.coord.publish(version)
        while not any(c.state == "ready" and c.version == version for c in self.coord.engines.values()):
            if self.agent.done():
                self.agent.result()  # the agent failed: say why
            await asyncio.sleep(0.0005)
        return time.perf_counter() - t0

    async def step_s(self, step: int, version: int, prompts: list[list[int]]) -> float:
        reqs = [RolloutRequest(request_id(step, i, 0), p, 1, group=f"p{i}") for i, p in enumerate(prompts)]
        t0 = time.perf_counter()
        await self.coord.run_step(step, version, reqs)
        return time.perf_counter() - t0


@dataclass(frozen=True)
class PlatformProbe:
    """What measure_platform runs: the job's learner and engine, as the calibration built them."""

    weights: Weights  # version 0
    train_step: Callable[[], Weights]  # one supervised step of the job's learner; the new weights
    engine: Engine  # the job's engine class, for the compute to subtract (its weights do not matter)
    prompt: list[int]
    eos_id: int


def measure_platform(spec: JobSpec, probe: PlatformProbe) -> Platform:
    batch = spec.rollout.engine_batch
    prompts = [list(probe.prompt)] * (ROUNDS * batch)

    async def run() -> tuple[float, list[float]]:
        async with _Harness(spec, probe.eos_id) as h:
            await h.publish(0, probe.weights)
            await h.step_s(0, 0, prompts)  # warms the engine and the connection up
            # a median of STEPS: one stall (another process, a collection) in a single timed step
            # showed up as a 150 ms round trip where 4-5 ms is usual
            step = statistics.median([await h.step_s(k, 0, prompts) for k in range(1, STEPS + 1)])
            pulls = [await h.publish(v, await asyncio.to_thread(probe.train_step)) for v in range(1, PULLS + 1)]
            return step, pulls

    step, pulls = asyncio.run(run())
    reqs = [GenRequest(f"r{i}", p, 1, i) for i, p in enumerate(prompts[:batch])]
    compute = []
    for _ in range(ROUNDS + 1):
        t0 = time.perf_counter()
        probe.engine.generate(reqs, lambda *a: None, lambda rid: False)
        compute.append(time.perf_counter() - t0)
    dispatch = max(0.0, step / ROUNDS - statistics.median(compute[1:]))
    return Platform(dispatch_s=dispatch, pull_s=statistics.median(pulls))
