"""A seeded TCP proxy that makes connections misbehave: between workers and the trainer.

Every accepted connection gets a random lifetime and a fate when it runs out:
  drop      close both sides at once (a reset link, a killed NAT entry)
  truncate  forward only part of the next chunk, then close (a stream cut mid-frame)
  stall     stop forwarding, keep both sockets open for `stall_s`, then drop (a half-open link:
            only deadlines and heartbeats notice it)
Until then every chunk may be delayed (up to `delay_s`, order kept). Runs on any asyncio loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field


@dataclass
class ChaosStats:
    connections: int = 0
    drops: int = 0
    truncations: int = 0
    stalls: int = 0
    bytes: int = 0
    fates: list[str] = field(default_factory=list)


class ChaosProxy:
    def __init__(
        self,
        target_host: str,
        target_port: int,
        seed: int = 0,
        *,
        life_s: tuple[float, float] = (0.5, 4.0),
        fates: tuple[str, ...] = ("drop", "truncate", "stall"),
        delay_s: float = 0.05,
        delay_p: float = 0.2,
        stall_s: float = 4.0,
    ) -> None:
        self.target = (target_host, target_port)
        self.rng = random.Random(seed)
        self.life_s, self.fates, self.delay_s, self.delay_p, self.stall_s = life_s, fates, delay_s, delay_p, stall_s
        self.stats = ChaosStats()
        self.enabled = True  # False: a plain proxy (connections opened later live forever)
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server = await asyncio.start_server(self._accept, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(cr, cw)
        finally:
            self._tasks.discard(task)

    async def _serve(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        try:
            ur, uw = await asyncio.wait_for(asyncio.open_connection(*self.target), 5)
        except (OSError, asyncio.TimeoutError):
            cw.close()
            return
        chaotic = self.enabled
        deadline = asyncio.get_running_loop().time() + self.rng.uniform(*self.life_s)
        fate = self.rng.choice(self.fates)
        state = {"fate": None}

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            rng = random.Random(self.rng.random())
            while True:
                data = await r.read(64 * 1024)
                if not data:
                    break
                now = asyncio.get_running_loop().time()
                if chaotic and (state["fate"] is not None or now >= deadline):
                    if state["fate"] is None:
                        state["fate"] = fate
                    if state["fate"] == "truncate" and len(data) > 1:
                        w.write(data[: rng.randrange(1, len(data))])
                        with contextlib.suppress(Exception):
                            await w.drain()
                    return  # drop / stall / truncate: the ending is handled below
                if chaotic and rng.random() < self.delay_p:
                    await asyncio.sleep(rng.uniform(0, self.delay_s))
                w.write(data)
                self.stats.bytes += len(data)
                await w.drain()

        async def timer() -> None:
            if not chaotic:
                await asyncio.Event().wait()
            await asyncio.sleep(max(0.0, deadline - asyncio.get_running_loop().time()))
            if state["fate"] is None:
                state["fate"] = fate

        tasks = [asyncio.ensure_future(c) for c in (pump(cr, uw), pump(ur, cw), timer())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if state["fate"] is None and tasks[2] not in done:
                state["fate"] = "closed"  # one side ended on its own
            if state["fate"] == "stall":
                for t in tasks[:2]:
                    t.cancel()  # nothing more moves, but both sockets stay open
                self.stats.stalls += 1
                await asyncio.sleep(self.stall_s)
            elif state["fate"] == "truncate":
                if not any(t.done() for t in tasks[:2]):  # cut the next chunk either way goes
                    await asyncio.wait(tasks[:2], timeout=2.0, return_when=asyncio.FIRST_COMPLETED)
                self.stats.truncations += 1
            elif state["fate"] == "drop":
                self.stats.drops += 1
            self.stats.fates.append(state["fate"] or "closed")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for w in (cw, uw):
                with contextlib.suppress(Exception):
                    w.transport.abort()
