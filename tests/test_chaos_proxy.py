"""Connection chaos: workers reach the trainer (WebSocket, weight pulls, tracker) only through a proxy
that drops, delays, truncates and stalls their connections. The run completes, every step's
responses are complete, unique and exactly right, nothing hangs (each step has a deadline), and
workers reconnect and resume."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.chaos import FAULTS, FaultRecord
from tests.chaos_proxy import ChaosProxy
from tests.live_trainer import LiveTrainer, check_responses

pytestmark = pytest.mark.faults

TOKEN = "chaos-test-token-51c2"
WORKERS = ["cw0", "cw1", "cw2"]
STEPS = 5


@pytest.mark.parametrize("seed", [7])
def test_run_completes_through_a_chaotic_network(seed):
    t = LiveTrainer(TOKEN, heartbeat_timeout_s=3.0, seq_tokens_per_s=25.0)
    proxy = ChaosProxy("127.0.0.1", t.port, seed, life_s=(0.5, 3.0), delay_s=0.05, stall_s=3.0)
    try:
        port = t.call(proxy.start)
        t.start_workers(
            WORKERS,
            url=f"http://127.0.0.1:{port}",
            ws_heartbeat_s=2.0,  # a stalled link is noticed within a second of silence
            handshake_timeout_s=5.0,
            reconnect_deadline_s=300.0,
        )
        connects = {}
        for step in range(STEPS):
            if step:
                t.publish(step)
            t0 = time.monotonic()
            fut, reqs = t.run_step_async(step, prompts=8, group=4)
            done = fut.result(120)  # a hang fails here
            check_responses(done, reqs)
            connects[step] = round(time.monotonic() - t0, 2)
            assert not any(t.runs[w].done() for w in WORKERS), "a worker gave up"
        s = proxy.stats
        print(f"step seconds {connects}; proxy {s.connections} connections, {s.drops} drops, "
              f"{s.truncations} truncations, {s.stalls} stalls; coordinator rejected {t.coord.rejected_frames}")
        assert s.drops and s.truncations and s.stalls, s
        assert s.connections > len(WORKERS) * 3, s  # they reconnected, many times
        n = s.drops + s.truncations + s.stalls
        # no per-fault clock here: the longest step (all its faults recovered within it) bounds recovery
        FAULTS.append(FaultRecord("connection chaos (drop/truncate/stall/delay proxy)", n, n, 0,
                                  max(connects.values())))

        # the network heals: every worker resumes on the latest version
        proxy.enabled = False

        async def kick() -> None:  # drop the current (chaotic) connections once more
            for c in list(t.coord.engines.values()):
                await c.ws.close()

        t.call(kick)
        t.publish(STEPS)
        t.wait_ready(WORKERS, STEPS, timeout=60)
        check_responses(t.run_step(STEPS, prompts=4, group=4), t.requests(STEPS, 4, 4))
    finally:
        t.call(proxy.close)
        t.stop()


def test_proxy_is_deterministic_per_seed():
    async def fates(seed: int) -> list[str]:
        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while data := await r.read(1024):
                w.write(data)
                await w.drain()
            w.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        proxy = ChaosProxy("127.0.0.1", server.sockets[0].getsockname()[1], seed, life_s=(0.05, 0.2), stall_s=0.1)
        port = await proxy.start()
        for _ in range(6):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            try:
                for _ in range(50):
                    w.write(b"x" * 100)
                    await w.drain()
                    if not await asyncio.wait_for(r.read(100), 2):
                        break
                    await asyncio.sleep(0.01)
            except (ConnectionError, asyncio.TimeoutError):
                pass
            w.close()
            await asyncio.sleep(0.3)
        await proxy.close()
        server.close()
        return proxy.stats.fates

    a = asyncio.run(fates(3))
    assert len(a) == 6 and set(a) <= {"drop", "truncate", "stall", "closed"}
