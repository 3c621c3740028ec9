"""An in-process trainer (coordinator + weight publisher + the real aiohttp app) on a background event
loop, with well-behaved WorkerAgents on synthetic engines: the job that hostile-input and connection
chaos tests must not harm. Tests drive it from the main thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import torch
from aiohttp import web

from rlboost.contracts.lengths import LengthModel
from rlboost.contracts.sampling import request_seed
from rlboost.models.vocab import VOCAB_SIZE
from rlboost.rollout.live import CoordinatorConfig, LiveCoordinator, RolloutRequest
from rlboost.trainer.enrolment import WorkerEnrolment
from rlboost.trainer.http_serving import app_runner
from rlboost.trainer.server import build_app
from rlboost.weights.publisher import WeightPublisher
from rlboost.worker.agent import WorkerAgent, WorkerConfig
from rlboost.worker.engines.synthetic import EOS, token_at

SEED = 1
MAX_NEW = 40
LENGTHS = {"median": 12, "sigma": 0.6, "prompt_sigma": 0.2}


AUDIENCE = "live-trainer"  # the trainer instance id its workers' enrolment credentials name


class LiveTrainer:
    def __init__(
        self,
        token: str,
        heartbeat_timeout_s: float = 10.0,
        seq_tokens_per_s: float = 200.0,
        secret_env: dict[str, str] | None = None,
    ) -> None:
        self.token = token
        self.secret_env = secret_env or {}  # what a worker that enrols is handed besides the token
        self.perf = {
            "cpu": {
                "tokens_per_s": seq_tokens_per_s * 4,
                "seq_tokens_per_s": seq_tokens_per_s,
                "prefill_tokens_per_s": 1e6,
                "train_tokens_per_s": 1e4,
                "ref_batch": 8,
            }
        }
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.agents: dict[str, WorkerAgent] = {}
        self.runs: dict[str, asyncio.Future] = {}
        self.shutdown_requests = 0
        self.call(self._setup)

    def call(self, fn: Callable[[], Coroutine[Any, Any, Any]], timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(fn(), self.loop).result(timeout)

    def submit(self, fn: Callable[[], Coroutine[Any, Any, Any]]):
        return asyncio.run_coroutine_threadsafe(fn(), self.loop)

    async def _setup(self) -> None:
        cfg = CoordinatorConfig(
            job_seed=SEED,
            temperature=1.0,
            chunk_tokens=4,
            heartbeat_s=0.5,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            weights_url="",
            model={"kind": "synthetic", "synthetic": {"perf": self.perf, "lengths": LENGTHS}},
            engine_dtype="float32",
            engine_batch=8,
            eos_id=EOS,
            max_new_tokens=MAX_NEW,
            vocab_size=VOCAB_SIZE,  # what synthetic engines write (as SyntheticLearner.vocab_size)
        )
        self.coord = LiveCoordinator(cfg)
        self.pub = WeightPublisher()

        def on_shutdown() -> None:
            self.shutdown_requests += 1

        self.enrolment = WorkerEnrolment(self.token, AUDIENCE, self.secret_env)
        self.app = build_app(
            self.token, self.coord, self.pub, lambda *_: {"phase": "rollout"}, on_shutdown, self.enrolment
        )
        self.runner = app_runner(self.app)  # the trainer's limits and logs (rlboost/trainer/http_serving.py)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.coord.cfg.weights_url = self.url
        self.coord.start()
        await self._publish(0)

    async def _publish(self, version: int) -> None:
        tensors = {"w": torch.full((64,), float(version)), "b": torch.arange(16, dtype=torch.float32)}
        await asyncio.to_thread(self.pub.stage, version, tensors)
        await self.coord.publish(version)

    def publish(self, version: int) -> None:
        self.call(lambda: self._publish(version))

    def start_workers(self, ids: list[str], url: str | None = None, token: str | None = None, **cfg: Any) -> None:
        """`token`: what the workers boot with (default the job's; "" with `enrol=CREDENTIAL` in cfg)."""
        token = self.token if token is None else token

        async def go() -> None:
            for wid in ids:
                a = WorkerAgent(
                    WorkerConfig(url or self.url, token, wid, engine="synthetic", accelerator="cpu", **cfg)
                )
                self.agents[wid] = a
                self.runs[wid] = asyncio.ensure_future(a.run())

        self.call(go)

    def engines(self) -> dict[str, Any]:
        async def get() -> dict[str, Any]:
            return dict(self.coord.engines)

        return self.call(get)

    def wait_ready(self, ids: list[str], version: int, timeout: float = 60) -> None:
        async def wait() -> None:
            while not all(
                (c := self.coord.engines.get(w)) is not None and c.version == version and c.state == "ready"
                for w in ids
            ):
                await asyncio.sleep(0.05)

        self.call(lambda: asyncio.wait_for(wait(), timeout), timeout + 5)

    def requests(self, step: int, prompts: int = 6, group: int = 4) -> list[RolloutRequest]:
        return [
            RolloutRequest(f"s{step}-p{i}-g{g}", [1, 4 + i, 5 + step % 7, 3], MAX_NEW, group=f"p{i}")
            for i in range(prompts)
            for g in range(group)
        ]

    def run_step_async(self, step: int, prompts: int = 6, group: int = 4):
        reqs = self.requests(step, prompts, group)
        return self.submit(lambda: self.coord.run_step(step, step, reqs)), reqs

    def run_step(self, step: int, prompts: int = 6, group: int = 4, timeout: float = 120) -> list:
        fut, reqs = self.run_step_async(step, prompts, group)
        done = fut.result(timeout)
        check_responses(done, reqs)
        return done

    def stop(self) -> None:
        async def down() -> None:
            await self.coord.close()
            for t in self.runs.values():
                t.cancel()
            await asyncio.gather(*self.runs.values(), return_exceptions=True)
            await self.runner.cleanup()

        try:
            self.call(down, 30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


def check_responses(done: list, reqs: list[RolloutRequest]) -> None:
    """Every request answered exactly once, with exactly the tokens the synthetic model generates."""
    assert sorted(r.rid for r in done) == sorted(q.rid for q in reqs), "missing or duplicated responses"
    lm = LengthModel(**LENGTHS)
    for r in done:
        seed = request_seed(SEED, r.rid)
        n = lm.length(r.prompt, seed)
        assert len(r.tokens) == min(n, MAX_NEW), (r.rid, len(r.tokens), n)
        assert r.finish == ("eos" if n <= MAX_NEW else "length")
        body = r.tokens[:-1] if r.finish == "eos" else r.tokens
        assert body == [token_at(seed, p) for p in range(len(body))], r.rid
