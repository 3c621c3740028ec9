"""The dispatch round trip of an engine that batches statically (torch): from one batch's end to the
next batch starting on the same engine - its ends reported, the coordinator's dispatch decision, the
requests sent and received. On a GPU it is noise next to a batch; on this CPU a tiny-gpt batch takes a
few milliseconds and the round trip is of the same order, so `rlboost simulate` of a local job needs it.

Measured here with the real parts: the trainer's Coordinator behind its aiohttp server and a real
WorkerAgent running the job's engine over loopback WebSockets, all on one event loop (in a live job
they are separate processes). One step of several full batches whose requests each ask for one token,
so a batch is a prefill; the same batches run straight on the same engine class give the compute to
subtract.
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from collections.abc import Mapping

import torch
from aiohttp import web

from rlboost_cli.spec import JobSpec
from trainer import scheduling
from trainer.coordinator import Coordinator, CoordinatorConfig, RolloutRequest
from trainer.server import build_app
from trainer.weights import WeightPublisher
from worker.agent import WorkerAgent, WorkerConfig
from worker.engines.base import GenRequest
from worker.engines.torch_engine import TorchEngine

ROUNDS = 6


async def _step_s(spec: JobSpec, weights: Mapping[str, torch.Tensor], prompts: list[list[int]], eos_id: int) -> float:
    """Seconds one step of len(prompts) one-token requests takes on one engine (after a warm-up step)."""
    token = secrets.token_hex(16)
    coord = Coordinator(
        CoordinatorConfig(
            job_seed=spec.algorithm.seed,
            temperature=spec.algorithm.temperature,
            chunk_tokens=spec.rollout.stream_chunk_tokens,
            heartbeat_s=1.0,
            heartbeat_timeout_s=60.0,
            weights_url="",
            model=scheduling.welcome_model(spec),
            engine_dtype=spec.rollout.engine_dtype,
            engine_batch=spec.rollout.engine_batch,
            eos_id=eos_id,
            **{**scheduling.coordinator_options(spec), "migration": None},
        )
    )
    publisher = WeightPublisher()
    runner = web.AppRunner(build_app(token, coord, publisher, lambda: {}, lambda: None), handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    coord.cfg.weights_url = url
    coord.start()
    agent = WorkerAgent(WorkerConfig(url, token, "calibration", engine=spec.rollout.engine, accelerator="cpu"))
    run = asyncio.ensure_future(agent.run())
    try:
        await asyncio.to_thread(publisher.stage(0, weights).result)
        await coord.publish(0)
        while not any(c.state == "ready" and c.version == 0 for c in coord.engines.values()):
            if run.done():
                run.result()  # the agent failed: say why
            await asyncio.sleep(0.01)
        times = []
        for step in range(2):  # the first warms the engine and the connection up
            reqs = [RolloutRequest(f"s{step}-p{i}-g0", p, 1, group=f"p{i}") for i, p in enumerate(prompts)]
            t0 = time.perf_counter()
            await coord.run_step(step, 0, reqs)
            times.append(time.perf_counter() - t0)
        return times[-1]
    finally:
        await coord.close()
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await runner.cleanup()


def measure_dispatch_s(spec: JobSpec, weights: Mapping[str, torch.Tensor], prompt: list[int], eos_id: int) -> float:
    """Seconds from a batch's end to the next one's start on the same engine (see the module docstring)."""
    batch = spec.rollout.engine_batch
    prompts = [list(prompt)] * (ROUNDS * batch)
    step = asyncio.run(_step_s(spec, weights, prompts, eos_id))
    engine = TorchEngine(spec.model, dtype="float32", max_batch=batch, eos_id=-1)
    engine.load_weights(1, dict(weights))
    reqs = [GenRequest(f"r{i}", p, 1, i) for i, p in enumerate(prompts[:batch])]
    compute = []
    for _ in range(ROUNDS + 1):
        t0 = time.perf_counter()
        engine.generate(reqs, lambda *a: None, lambda rid: False)
        compute.append(time.perf_counter() - t0)
    return max(0.0, step / ROUNDS - statistics.median(compute[1:]))
