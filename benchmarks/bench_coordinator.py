"""The coordinator at scale: 1,000 synthetic workers over loopback WebSockets.

    .venv/bin/python benchmarks/bench_coordinator.py --engines 1000 --procs 2 --steps 3

Three processes (or more): the coordinator (the real rollout.coordinator.Coordinator behind an aiohttp
server, as in the trainer) and `--procs` fleet processes that each hold engines/procs WebSocket
connections and speak the real protocol: hello -> welcome -> ready; generate -> binary token frames
every flush_s (columns, rlboost/contracts/token_frames.py) at a configured per-sequence rate -> finished;
draining on cue. The fleet is vectorised with numpy so that it, not Python per token, sets the pace.

Reported (JSON on stdout, and a summary): aggregate token ingest at the coordinator (tokens/s), the
coordinator process's CPU (seconds per million tokens, cores used), dispatch latency (step start ->
every request sent; slot freed -> next request sent, p50/p99), and the migration of
`--migrate` partial responses at once (engines drain mid-step; time until every partial response
is dispatched again, and until all of them have streamed tokens from their new engines).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlboost.contracts import protocol as P
from rlboost.contracts import token_frames
from rlboost.rollout.policies.migration import MigrationConfig

EOS = 2


# ---- the fleet ---------------------------------------------------------------------------
class FleetEngine:
    """One fake engine: live sequences as arrays; emits every live sequence's new tokens per flush."""

    def __init__(self, wid: str, capacity: int, seq_rate: float) -> None:
        self.wid, self.capacity, self.seq_rate = wid, capacity, seq_rate
        self.ws = None
        self.version = 0
        self.handles = np.zeros(0, np.int64)
        self.pos = np.zeros(0, np.int64)
        self.end = np.zeros(0, np.int64)
        self.rids: list[str] = []
        self.carry = 0.0
        self.draining = False
        self.aborted: set[str] = set()

    def add(self, specs: list[P.GenSpec]) -> None:
        ends = []
        for g in specs:
            # deterministic length from the seed: long-tailed, mean ~ --mean-len
            u = ((g.seed * 0x9E3779B97F4A7C15) >> 11 & ((1 << 53) - 1)) / float(1 << 53)
            full = max(1, int(FLEET_MEAN * -np.log(max(u, 1e-9))))
            ends.append(min(len(g.prefix) + g.max_new_tokens, max(full, len(g.prefix) + 1)))
        self.handles = np.concatenate([self.handles, [g.handle for g in specs]])
        self.pos = np.concatenate([self.pos, [len(g.prefix) for g in specs]])
        self.end = np.concatenate([self.end, ends])
        self.rids.extend(g.rid for g in specs)

    def drop(self, rids: set[str]) -> list[int]:
        keep = [i for i, r in enumerate(self.rids) if r not in rids]
        gone = [i for i, r in enumerate(self.rids) if r in rids]
        self.handles, self.pos, self.end = self.handles[keep], self.pos[keep], self.end[keep]
        lens = [0] * len(gone)
        self.rids = [self.rids[i] for i in keep]
        return lens

    def tick(self, dt: float) -> tuple[bytes | None, str | None]:
        """New tokens of every live sequence as one binary frame, and a `finished` for those done."""
        if self.draining or not self.rids:
            return None, None
        steps = dt * self.seq_rate + self.carry
        k = int(steps)
        self.carry = steps - k
        if k == 0:
            return None, None
        m = np.minimum(k, self.end - self.pos)
        n = int(m.sum())
        ids = np.full(n, 7, np.uint32)
        done = self.pos + m >= self.end
        last = np.cumsum(m) - 1
        ids[last[done & (m > 0)]] = EOS
        frame = token_frames.encode(self.version, self.handles, self.pos, m, ids, np.full(n, -1.0))
        self.pos = self.pos + m
        fin = None
        if done.any():
            idx = np.nonzero(done)[0]
            fin = P.Finished(
                rids=[self.rids[i] for i in idx],
                reasons=["eos"] * len(idx),
                lengths=self.pos[idx].tolist(),
            ).model_dump_json()
            keep = np.nonzero(~done)[0]
            self.handles, self.pos, self.end = self.handles[keep], self.pos[keep], self.end[keep]
            self.rids = [self.rids[i] for i in keep]
        return frame, fin


FLEET_MEAN = 256.0


async def fleet_main(url: str, first: int, n: int, capacity: int, seq_rate: float, flush_s: float, drain: dict) -> None:
    import aiohttp

    engines = [FleetEngine(f"e{first + i:05d}", capacity, seq_rate) for i in range(n)]
    stop = asyncio.Event()
    generated_seen = asyncio.Event()

    gate = asyncio.Semaphore(32)  # no thundering herd of 1,000 handshakes at once

    async def run_engine(e: FleetEngine, session) -> None:
        for attempt in range(20):
            try:
                async with gate:
                    ws = await session.ws_connect(url, max_msg_size=P.MAX_FRAME_BYTES, heartbeat=None)
                    await ws.send_str(
                        P.Hello(worker_id=e.wid, kind="spot", engine="synthetic", capacity=capacity).model_dump_json()
                    )
                    first = await ws.receive()
                break
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.5 + attempt)
        else:
            raise RuntimeError(f"{e.wid} could not connect")
        async with ws:
            e.ws = ws
            welcome = P.coord_msg.validate_json(first.data)
            assert isinstance(welcome, P.Welcome) and welcome.binary_tokens
            if welcome.version >= 0:
                e.version = welcome.version
                await ws.send_str(P.Ready(version=welcome.version, capacity=capacity).model_dump_json())
            async for frame in ws:
                if frame.type != aiohttp.WSMsgType.TEXT:
                    break
                msg = P.coord_msg.validate_json(frame.data)
                if isinstance(msg, P.Generate):
                    e.add(msg.requests)
                    generated_seen.set()
                elif isinstance(msg, P.NewVersion):
                    e.version = msg.version
                    await ws.send_str(P.Ready(version=msg.version, capacity=capacity).model_dump_json())
                elif isinstance(msg, P.Abort):
                    gone = set(msg.rids)
                    e.drop(gone)
                    await ws.send_str(
                        P.Finished(
                            rids=list(gone), reasons=["aborted"] * len(gone), lengths=[0] * len(gone)
                        ).model_dump_json()
                    )
                elif isinstance(msg, P.Shutdown):
                    stop.set()
                    return

    async def ticker() -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(flush_s)
            now = time.monotonic()
            dt, last = now - last, now
            for e in engines:
                if e.ws is None or e.ws.closed:
                    continue
                frame, fin = e.tick(dt)
                try:
                    if frame is not None:
                        await e.ws.send_bytes(frame)
                    if fin is not None:
                        await e.ws.send_str(fin)
                except (ConnectionError, RuntimeError):
                    pass

    async def heartbeats() -> None:
        while not stop.is_set():
            await asyncio.sleep(1.0)
            hb = P.Heartbeat().model_dump_json()
            for e in engines:
                if e.ws is not None and not e.ws.closed and not e.draining:
                    with contextlib.suppress(ConnectionError, RuntimeError):
                        await e.ws.send_str(hb)

    async def drainer() -> None:
        """On cue (a file the coordinator writes), the first `count` engines drain at once."""
        cue = Path(drain["cue"]) if drain.get("cue") else None
        if cue is None or not drain.get("count"):
            return
        while not cue.exists() and not stop.is_set():
            await asyncio.sleep(0.005)
        count = int(cue.read_text() or 0)  # how many engines the coordinator picked
        for e in engines[:count]:
            e.draining = True
            with contextlib.suppress(ConnectionError, RuntimeError):
                await e.ws.send_str(P.Draining(reason="bench").model_dump_json())

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [asyncio.create_task(run_engine(e, session)) for e in engines]
        aux = [asyncio.create_task(ticker()), asyncio.create_task(heartbeats()), asyncio.create_task(drainer())]
        await asyncio.gather(*tasks, return_exceptions=True)
        stop.set()
        for t in aux:
            t.cancel()


def fleet_proc(*args) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(fleet_main(*args))


# ---- the coordinator side ------------------------------------------------------------------
def cpu_s() -> float:
    t = os.times()
    return t.user + t.system



def bench_config(args, **over):
    """The coordinator's config in both modes: a synthetic fleet, `args`' batch size and budget."""
    from rlboost.rollout.live import CoordinatorConfig

    return CoordinatorConfig(
        job_seed=0,
        temperature=1.0,
        chunk_tokens=4,
        heartbeat_s=1.0,
        heartbeat_timeout_s=60.0,
        weights_url="",
        engine_dtype="float32",
        engine_batch=args.capacity,
        eos_id=EOS,
        max_new_tokens=args.max_new,
        **over,
    )

async def coordinator_main(args, port_q, result_q) -> None:
    from aiohttp import web

    from rlboost.rollout.live import LiveCoordinator, RolloutRequest

    cfg = bench_config(
        args,
        model={"kind": "synthetic"},
        flush_s=args.flush_s,
        migration=None if args.no_migration else MigrationConfig(),
    )
    coord = LiveCoordinator(cfg)
    freed: dict[str, float] = {}
    refill: list[float] = []
    orig_on_message = coord.on_message
    orig_post = coord.pool.post

    def on_message(conn, msg):  # timestamps for the slot-refill latency (only while work waits)
        if not coord.book.queue:
            freed.clear()  # nothing left to refill with: those slots are not waiting on the coordinator
        elif isinstance(msg, P.Finished):
            freed.setdefault(conn.id, time.monotonic())
        orig_on_message(conn, msg)

    def post(conn, text):  # the dispatch decision: slot freed -> `generate` queued for that engine
        if text.startswith('{"type":"generate"'):
            t = freed.pop(conn.id, None)
            if t is not None:
                refill.append(time.monotonic() - t)
        orig_post(conn, text)

    coord.on_message = on_message  # type: ignore[method-assign]
    coord.pool.post = post  # type: ignore[method-assign]
    app = web.Application()
    app.router.add_get("/v1/worker", coord.handle_ws)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    port = runner.addresses[0][1]
    coord.start()
    await coord.publish(0)
    port_q.put(port)
    t_wait = time.monotonic()
    last_note = t_wait
    while sum(1 for c in coord.engines.values() if c.state == "ready") < args.engines:
        await asyncio.sleep(0.05)
        if time.monotonic() - last_note > 10:
            last_note = time.monotonic()
            ready = sum(1 for c in coord.engines.values() if c.state == "ready")
            print(f"connecting: {len(coord.engines)} connected, {ready} ready", file=sys.stderr, flush=True)
        if time.monotonic() - t_wait > 300:
            break
    connect_s = time.monotonic() - t_wait
    steps = []
    rng = np.random.default_rng(0)
    for step in range(args.steps):
        n = args.engines * args.per_engine
        reqs = [
            RolloutRequest(f"s{step}-r{i}", rng.integers(4, 40, 16).tolist(), args.max_new, group=f"g{i // 8}")
            for i in range(n)
        ]
        refill.clear()
        migrate_info: dict = {}
        t0, c0, k0, f0 = time.monotonic(), cpu_s(), coord.tokens_total, coord.frames_total
        task = asyncio.create_task(coord.run_step(step, step, reqs))
        t_all_sent = None
        samples = []  # (t, tokens, cpu) while requests still wait: every engine is full ("bulk")
        next_sample = t0
        while not task.done():
            await asyncio.sleep(0.002)
            now = time.monotonic()
            if now - last_note > 10:
                last_note = now
                print(
                    f"step {step}: {now - t0:.0f}s, {coord.tokens_total - k0} tokens, queue {len(coord.book.queue)}, "
                    f"open {coord.book.outstanding(step)}, cpu {cpu_s() - c0:.1f}s, redispatched "
                    f"{coord.book.redispatches}, rejected {coord.rejected_frames}, gone {len(coord.gone)}, "
                    f"tail-migrated {coord.tail_migrations}, dirty {len(coord.pool.dirty)} "
                    f"full {coord.pool.full_dispatch} "
                    f"free {sum(c.capacity - len(coord.book.assigned(c.id)) for c in coord.engines.values())} "
                    f"states {sorted({(c.state, c.version, c.capacity) for c in coord.engines.values()})}",
                    file=sys.stderr,
                    flush=True,
                )
            if coord.book.queue and now >= next_sample:
                samples.append((now, coord.tokens_total, cpu_s()))
                next_sample = now + 0.25
            if t_all_sent is None and not coord.book.queue:
                t_all_sent = time.monotonic() - t0
            if (
                step == args.steps - 1
                and args.migrate
                and not migrate_info
                and time.monotonic() - t0 > args.migrate_after
            ):
                migrate_info = await measure_migration(coord, args)
        await task
        wall, cpu, tok = time.monotonic() - t0, cpu_s() - c0, coord.tokens_total - k0
        await coord.publish(step + 1)
        coord.end_step()
        bulk = {}
        if len(samples) >= 3:
            (ta, ka, ca), (tb, kb, cb) = samples[1], samples[-1]  # skip the first (dispatch burst)
            bulk = {
                "bulk_s": round(tb - ta, 2),
                "bulk_tokens_per_s": round((kb - ka) / (tb - ta)),
                "bulk_cores": round((cb - ca) / (tb - ta), 3),
                "bulk_cpu_s_per_million_tokens": round((cb - ca) / (kb - ka) * 1e6, 3) if kb > ka else None,
            }
        steps.append(
            {
                "step": step,
                "requests": n,
                "wall_s": round(wall, 3),
                "tokens": tok,
                "frames": coord.frames_total - f0,
                "tokens_per_s": round(tok / wall),
                "coordinator_cpu_s": round(cpu, 3),
                "cores": round(cpu / wall, 3),
                "cpu_s_per_million_tokens": round(cpu / tok * 1e6, 3) if tok else None,
                "dispatch_all_s": round(t_all_sent, 4) if t_all_sent is not None else None,
                "refill_p50_ms": round(1000 * statistics.median(refill), 2) if refill else None,
                "refill_p99_ms": round(1000 * float(np.percentile(refill, 99)), 2) if refill else None,
                **bulk,
                **migrate_info,
            }
        )
        print(json.dumps(steps[-1]), file=sys.stderr, flush=True)
    await coord.close("benchmark done")
    await runner.cleanup()
    result_q.put({"connect_s": round(connect_s, 2), "steps": steps})


async def measure_migration(coord, args) -> dict:
    """Cue the fleet to drain engines holding >= args.migrate partial responses; time the recovery."""
    need = args.migrate
    pool = sorted(coord.engines.values(), key=lambda c: c.id)[: min(args.engines // args.procs, args.engines // 2)]

    def partial(c) -> int:
        return sum(1 for rid in coord.book.assigned(c.id) if coord.book.responses[rid].generated > 0)

    deadline = time.monotonic() + 60
    while sum(partial(c) for c in pool) < need and time.monotonic() < deadline:
        await asyncio.sleep(0.1)  # let responses get going first
    held = n_eng = 0
    moving: list[str] = []
    for c in pool:
        mine = [rid for rid in coord.book.assigned(c.id) if coord.book.responses[rid].generated > 0]
        held += len(mine)
        moving.extend(mine)
        n_eng += 1
        if held >= need:
            break
    drained = {c.id for c in pool[:n_eng]}
    migrations0 = coord.book.migrations
    t0 = time.monotonic()
    Path(args.cue + ".tmp").write_text(str(n_eng))
    os.replace(args.cue + ".tmp", args.cue)

    def placed(rid: str) -> bool:  # running on an engine that is not draining, or already complete
        r = coord.book.responses.get(rid)
        return r is None or r.done or (r.engine is not None and r.engine not in drained)

    # the drain arrives as `draining` messages; wait until every partial response runs elsewhere
    pending = list(moving)
    while pending and time.monotonic() - t0 < 120:
        await asyncio.sleep(0.005)
        pending = [rid for rid in pending if not placed(rid)]
    t_dispatched = time.monotonic() - t0
    return {
        "migrate_engines": n_eng,
        "migrate_partial_responses": held,
        "migrate_redispatched_s": round(t_dispatched, 4),
        "migrate_not_placed": len(pending),
        "migrated": coord.book.migrations - migrations0,
    }


def inproc(args) -> dict:
    """The coordinator's own work without sockets (CPU time, no fleet competing for the cores): a
    full dispatch round of a step, token ingest, and the migration of `--migrate` partial responses
    (engines drain at once -> everything they held is dispatched again with its prefix)."""
    from rlboost.rollout.book import Response
    from rlboost.rollout.live import LiveCoordinator
    from rlboost.rollout.live_pool import EngineConn

    async def run() -> dict:
        cfg = bench_config(args, model={})
        coord = LiveCoordinator(cfg)
        for i in range(args.engines):
            c = EngineConn(f"e{i:05d}", "spot", "synthetic", args.capacity, None, state="ready", version=0)
            coord.engines[c.id] = c
        coord.pool.step = coord.pool.step_version = 0
        coord.begin_step(0, coord.clock(), {})
        n = args.engines * args.capacity
        rng = np.random.default_rng(0)
        prompts = [rng.integers(4, 40, 16).tolist() for _ in range(256)]
        coord.book.add(
            Response(rid=f"r{i}", step=0, version=0, prompt=prompts[i % 256], max_new_tokens=args.max_new, seed=i)
            for i in range(n)
        )
        out: dict = {"engines": args.engines, "requests": n}
        c0 = time.process_time()
        coord.dispatch(coord.clock())
        out["dispatch_full_round_s"] = round(time.process_time() - c0, 3)
        frames = []
        for c in coord.engines.values():
            hs = np.fromiter((coord.book.responses[r].handle for r in coord.book.assigned(c.id)), np.int64)
            frames.append((c, hs))
        tokens = 0
        c0 = time.process_time()
        per = 8
        for rounds in range(8):  # 8 frames per engine, `per` tokens per response per frame
            for c, hs in frames:
                k = hs.size
                data = token_frames.encode(
                    0, hs, np.full(k, rounds * per), np.full(k, per), np.full(k * per, 7), np.full(k * per, -1.0)
                )
                coord.on_tokens(c, token_frames.decode(data))
                tokens += k * per
        ingest = time.process_time() - c0
        out["ingest_tokens"] = tokens
        out["ingest_cpu_s_per_million_tokens"] = round(ingest / tokens * 1e6, 3)
        out["ingest_tokens_per_s_one_core"] = round(tokens / ingest)
        # migration: drain engines until `migrate` partial responses are released
        need, drained, held = args.migrate, [], 0
        for c, hs in frames:
            drained.append(c)
            held += hs.size
            if held >= need:
                break
        # make room: free slots elsewhere (half of each remaining engine's responses finish)
        for c, _ in frames[len(drained) :]:
            for rid in sorted(coord.book.assigned(c.id))[: args.capacity // 2]:
                r = coord.book.responses[rid]
                coord.book.accept(c.id, rid, r.generated, [EOS], [-1.0], 0)
                coord.book.finish(c.id, rid, "eos", r.generated)
        m0 = coord.book.migrations
        c0 = time.process_time()
        for c in drained:
            coord.on_message(c, P.Draining(reason="bench"))
        released = time.process_time() - c0
        rounds = 0
        while coord.book.queue and rounds < 100:
            coord.pool.full_dispatch = True
            coord.dispatch(coord.clock())
            rounds += 1
        total = time.process_time() - c0
        out |= {
            "migrate_partial_responses": held,
            "migrate_engines": len(drained),
            "migrate_release_cpu_s": round(released, 3),
            "migrate_total_cpu_s": round(total, 3),
            "migrate_dispatch_rounds": rounds,
            "migrated": coord.book.migrations - m0,
            "migrate_generate_bytes": sum(
                sum(len(t) for t in c.outq._queue)
                for c, _ in frames[len(drained) :]  # type: ignore[attr-defined]
            ),
        }
        return out

    return asyncio.run(run())


def coordinator_proc(args, port_q, result_q) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile(time.process_time)
        prof.runcall(asyncio.run, coordinator_main(args, port_q, result_q))
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
        return
    asyncio.run(coordinator_main(args, port_q, result_q))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", type=int, default=1000)
    ap.add_argument("--procs", type=int, default=2, help="fleet processes")
    ap.add_argument("--capacity", type=int, default=64, help="sequences per engine")
    ap.add_argument("--per-engine", type=int, default=160, help="requests per engine per step (> capacity: a queue)")
    ap.add_argument("--seq-rate", type=float, default=16.0, help="tokens/s of one sequence")
    ap.add_argument("--mean-len", type=float, default=96.0)
    ap.add_argument("--max-new", type=int, default=512)
    ap.add_argument("--flush-s", type=float, default=0.2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--migrate", type=int, default=10_000, help="partial responses to migrate at once (0: skip)")
    ap.add_argument("--migrate-after", type=float, default=2.0, help="seconds into the last step")
    ap.add_argument("--no-migration", action="store_true", help="disable tail migration")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--profile", action="store_true", help="cProfile the coordinator process (stderr)")
    ap.add_argument("--inproc", action="store_true", help="the coordinator's own work only, no sockets")
    args = ap.parse_args()
    if args.inproc:
        print(json.dumps(inproc(args), indent=2))
        return
    global FLEET_MEAN
    FLEET_MEAN = args.mean_len
    args.cue = f"/tmp/rlboost-bench-drain-{os.getpid()}"
    Path(args.cue).unlink(missing_ok=True)
    ctx = mp.get_context("fork")
    port_q, result_q = ctx.Queue(), ctx.Queue()
    cp = ctx.Process(target=coordinator_proc, args=(args, port_q, result_q))
    cp.start()
    port = port_q.get(timeout=60)
    url = f"http://127.0.0.1:{port}/v1/worker"
    per = args.engines // args.procs
    fleets = []
    for i in range(args.procs):
        n = per if i < args.procs - 1 else args.engines - per * (args.procs - 1)
        drain = {"cue": args.cue, "count": 0}
        if args.migrate and i == 0:
            drain["count"] = max(1, int(args.engines * 0.5))  # engines that may be told to drain
        fp = ctx.Process(target=fleet_proc, args=(url, i * per, n, args.capacity, args.seq_rate, args.flush_s, drain))
        fp.start()
        fleets.append(fp)
    res = result_q.get(timeout=3600)
    cp.join(30)
    for fp in fleets:
        fp.join(30)
        if fp.is_alive():
            fp.kill()
    Path(args.cue).unlink(missing_ok=True)
    res["config"] = {k: v for k, v in vars(args).items() if k != "out"} | {"out": str(args.out) if args.out else None}
    res["cpu_count"] = os.cpu_count()
    print(json.dumps(res, indent=2))
    if args.out:
        args.out.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
