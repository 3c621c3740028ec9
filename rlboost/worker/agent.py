"""The rollout worker agent: dial home, pull weights, generate, stream tokens, drain on notice.

Runs on every spot node (and as the trainer's reserved engine). The engine runs in a thread; the
asyncio side forwards its tokens in small frames, answers heartbeats and watches for a notice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from rlboost.contracts import enrolment, tls, token_frames
from rlboost.contracts import protocol as P
from rlboost.contracts.engine import DraftCounts
from rlboost.weights.peer_server import WeightNode
from rlboost.weights.pull_control import WeightPullError
from rlboost.worker.engines import Engine, GenRequest, make_engine
from rlboost.worker.notice import NoticeWatcher

log = logging.getLogger("rlboost.worker")


@dataclass
class WorkerConfig:
    trainer_url: str
    token: str
    worker_id: str
    kind: str = "spot"
    engine: str = "torch"
    reconnect_deadline_s: float = 60.0
    flush_s: float = 0.02  # the welcome's flush_s wins once connected
    accelerator: str | None = None  # e.g. "A100:8", told to the coordinator in hello
    # where this node runs (RLBOOST_CLOUD / RLBOOST_REGION, set by the provider), told in hello: the
    # trainer broadcasts weights (weights.transport: auto) only within its own cloud and region
    cloud: str | None = None
    region: str | None = None
    # sha256 of the trainer's certificate (hex): required for an https trainer URL, checked on every
    # connection (WebSocket, weights, tracker); there is no CA
    tls_fingerprint: str | None = None
    # WebSocket ping period; no pong (or any frame) within half of it = the trainer is gone: reconnect
    ws_heartbeat_s: float = 10.0
    handshake_timeout_s: float = 30.0  # connect + upgrade, and the wait for the welcome
    # a spot worker's single-use credential (RLBOOST_ENROL): traded once for the job token and the
    # job's secret variables before the first connection; `token` is empty until then
    enrol: str | None = None


class Disconnected(Exception):
    pass


class WorkerAgent:
    def __init__(self, cfg: WorkerConfig, notice: NoticeWatcher | None = None) -> None:
        self.cfg = cfg
        self.notice = notice
        self.engine: Engine | None = None
        self.welcome: P.Welcome | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.pending: deque[P.GenSpec] = deque()
        self.aborted: set[str] = set()
        self.lengths: dict[str, int] = {}
        # filled by the engine thread: (rid, offset, ids, logprobs) per callback, and ends of requests
        self.outbox: deque[tuple[str, int, list[int], list[float]]] = deque()
        self.finished_outbox: deque[tuple[str, str]] = deque()
        self.handles: dict[str, int] = {}  # rid -> handle for binary token frames
        # rid -> its siblings' tokens from its generate frame (speculative decoding by group); shared lists
        self.siblings: dict[str, list[list[int]]] = {}
        self.work = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()
        self.draining = False
        self.want_version: int | None = None
        self.want_offer: P.Offer | None = None  # the trainer's offer of another transport for want_version
        self._cuda: bool | None = None
        self.version_event = asyncio.Event()
        self.tokens_window: deque[tuple[float, int]] = deque()
        self.exit_reason = ""
        self._gen: asyncio.Future | None = None  # the engine thread's current batch
        # Pulls weights (peers, delta, shared memory on the trainer's node) and serves them to peers;
        # made in run(), once the job token is known
        self.weights: WeightNode

    # ---- entry -------------------------------------------------------------------------
    async def run(self) -> int:
        if self.cfg.trainer_url.startswith("https://") and not self.cfg.tls_fingerprint:
            log.error("https trainer URL without RLBOOST_TLS_FINGERPRINT: refusing to connect unpinned")
            return 2
        # every request is bounded: connect, and each read (the WebSocket's own liveness is its
        # heartbeat: aiohttp lifts the read timeout once upgraded)
        hs = self.cfg.handshake_timeout_s
        timeout = aiohttp.ClientTimeout(total=None, connect=hs, sock_connect=hs, sock_read=hs)
        if not self.cfg.token:  # once: a reconnect keeps the token this obtained
            code = await self._enrol(timeout)
            if code:
                return code
        headers = {"Authorization": f"Bearer {self.cfg.token}"}
        self.weights = WeightNode.from_env(self.cfg.token, self.cfg.worker_id, self.cfg.kind)
        connector = aiohttp.TCPConnector(ssl=tls.pinned(self.cfg.tls_fingerprint))
        async with (
            aiohttp.ClientSession(headers=headers, timeout=timeout, connector=connector) as session,
            self.weights,
        ):
            self.session = session
            deadline = time.monotonic() + self.cfg.reconnect_deadline_s
            while True:
                try:
                    await self._session_once()
                    return 0  # shutdown or drained
                except Disconnected as e:
                    if self.draining:
                        return 0
                    log.warning("lost the trainer (%s); reconnecting", e)
                except aiohttp.ServerFingerprintMismatch as e:
                    log.error("the trainer's TLS certificate does not match RLBOOST_TLS_FINGERPRINT: %s", e)
                    return 5
                except aiohttp.WSServerHandshakeError as e:
                    if e.status == 401:
                        log.error("trainer refused the job token (401); check RLBOOST_JOB_TOKEN")
                        return 3
                    log.warning("handshake failed: %s", e)
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                    log.warning("cannot reach the trainer: %s", e)
                else:
                    deadline = time.monotonic() + self.cfg.reconnect_deadline_s
                if time.monotonic() > deadline:
                    log.error("trainer unreachable for %.0fs; exiting", self.cfg.reconnect_deadline_s)
                    return 4
                await asyncio.sleep(1.0)

    async def _enrol(self, timeout: aiohttp.ClientTimeout) -> int:
        """Trade the enrolment credential for the job token and the job's secret variables (put in
        this process's environment, for the engine: HF_TOKEN); an exit code when that fails, else 0."""
        if not self.cfg.enrol:
            log.error("neither a job token nor an enrolment credential (RLBOOST_ENROL): nothing to join with")
            return 2
        url = self.cfg.trainer_url.rstrip("/") + enrolment.WORKER_ROUTE
        body = enrolment.WorkerEnrol(credential=self.cfg.enrol).model_dump_json()
        deadline = time.monotonic() + self.cfg.reconnect_deadline_s
        connector = aiohttp.TCPConnector(ssl=tls.pinned(self.cfg.tls_fingerprint))
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            while True:
                try:
                    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                        text = await r.text()
                        if r.status == 200:
                            grant = enrolment.Grant.model_validate_json(text)
                            break
                        if r.status in (401, 403):
                            why = _error_of(text)
                            log.error("the trainer refused this worker's enrolment (%d: %s); it cannot join",
                                      r.status, why)
                            return 3
                        log.warning("enrolment answered %d; trying again", r.status)
                except aiohttp.ServerFingerprintMismatch as e:
                    log.error("the trainer's TLS certificate does not match RLBOOST_TLS_FINGERPRINT: %s", e)
                    return 5
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError) as e:
                    log.warning("cannot enrol with the trainer yet: %s", e)
                if time.monotonic() > deadline:
                    log.error("could not enrol with the trainer for %.0fs; exiting", self.cfg.reconnect_deadline_s)
                    return 4
                await asyncio.sleep(1.0)
        self.cfg.token = grant.token
        os.environ.update(grant.env)
        names = ", ".join(sorted(grant.env)) or "none"
        log.info("enrolled: job token and %d secret variable(s) (%s)", len(grant.env), names)
        return 0

    async def _settle_engine(self) -> None:
        """Before a new connection: the batch of the lost one stops (its requests were aborted when
        the connection dropped; the coordinator moved them) and its leftovers are forgotten."""
        gen = self._gen
        if gen is not None and not gen.done():
            await asyncio.wait([gen], timeout=self.cfg.handshake_timeout_s)
        for q in (self.pending, self.outbox, self.finished_outbox):
            q.clear()
        self.lengths.clear()
        self.handles.clear()
        self.siblings.clear()
        self.aborted.clear()

    async def _session_once(self) -> None:
        await self._settle_engine()
        url = self.cfg.trainer_url.rstrip("/") + "/v1/worker"
        async with self.session.ws_connect(
            url, max_msg_size=P.MAX_FRAME_BYTES, heartbeat=self.cfg.ws_heartbeat_s
        ) as ws:
            self.ws = ws
            # Work from a previous connection was released by the coordinator when it dropped.
            self.pending.clear()
            await self._send(
                P.Hello(
                    worker_id=self.cfg.worker_id,
                    kind=self.cfg.kind,  # type: ignore[arg-type]
                    engine=self.cfg.engine,  # type: ignore[arg-type]
                    capacity=self._capacity(),
                    accelerator=self.cfg.accelerator,
                    cuda=await self._has_cuda(),
                    cloud=self.cfg.cloud,
                    region=self.cfg.region,
                    # a reconnect: what lets it replace its old connection if the trainer has not seen it drop
                    resume_key=(self.welcome.resume_key or None) if self.welcome else None,
                )
            )
            first = await asyncio.wait_for(ws.receive(), timeout=self.cfg.handshake_timeout_s)
            if first.type != aiohttp.WSMsgType.TEXT:  # e.g. 4409: its id is held by a live connection
                raise Disconnected(f"no welcome ({first.type.name}, close code {ws.close_code})")
            welcome = P.coord_msg.validate_json(first.data)
            if not isinstance(welcome, P.Welcome):
                raise Disconnected("first message was not a welcome")
            self.welcome = welcome
            if self.engine is None:
                if welcome.version >= 0:  # page in the weight buffer while the engine builds
                    self.weights.prepare_soon(self._weights_base(), welcome.version, self.session)
                self.engine = await asyncio.to_thread(
                    make_engine,
                    self.cfg.engine,
                    welcome.model,
                    welcome.engine_dtype,
                    welcome.engine_batch,
                    welcome.speculative.model_dump(),
                )
            if welcome.version >= 0:
                self._request_version(welcome.version)
            tasks = [
                asyncio.create_task(self._engine_loop()),
                asyncio.create_task(self._flusher()),
                asyncio.create_task(self._heartbeats()),
                asyncio.create_task(self._versions()),
            ]
            if self.notice is not None:
                tasks.append(asyncio.create_task(self._watch_notice()))
            try:
                await self._receive_loop(ws)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                self.ws = None
                self.pending.clear()
                self.aborted.update(self.lengths)  # the engine thread stops these at its next step

    def _capacity(self) -> int:
        cap = getattr(self.engine, "max_batch", None)  # a synthetic node may hold several GPUs' batches
        if isinstance(cap, int) and cap > 0:
            return cap
        return self.welcome.engine_batch if self.welcome else 64

    # ---- receive -----------------------------------------------------------------------
    async def _receive_loop(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for frame in ws:
            if frame.type != aiohttp.WSMsgType.TEXT:
                break
            msg = P.coord_msg.validate_json(frame.data)
            if isinstance(msg, P.Generate):
                self._take(msg)
            elif isinstance(msg, P.Abort):
                self.aborted.update(msg.rids)
            elif isinstance(msg, P.NewVersion):
                self._request_version(msg.version, msg.offer)
            elif isinstance(msg, P.Shutdown):
                log.info("shutdown: %s", msg.reason)
                self.exit_reason = "shutdown"
                return
        if self.draining or self.exit_reason:
            return
        raise Disconnected(f"connection closed ({ws.close_code})")

    def _take(self, msg: P.Generate) -> None:
        if self.draining:
            return
        # a new assignment supersedes an abort that arrived after the request had ended
        self.aborted.difference_update(g.rid for g in msg.requests)
        for g in msg.requests:
            if g.group is not None and g.group in msg.siblings:
                self.siblings[g.rid] = msg.siblings[g.group]
        self.pending.extend(msg.requests)
        self.work.set()

    # ---- weights -----------------------------------------------------------------------
    def _request_version(self, version: int, offer: P.Offer | None = None) -> None:
        self.want_version, self.want_offer = version, offer
        self.version_event.set()

    async def _has_cuda(self) -> bool:
        """Whether the engine will run on a GPU (the torch and vLLM engines import torch anyway)."""
        if self._cuda is None:
            if self.cfg.engine == "synthetic":
                self._cuda = False
            else:

                def probe() -> bool:
                    import torch

                    return torch.cuda.is_available()

                self._cuda = await asyncio.to_thread(probe)
        return self._cuda

    async def _versions(self) -> None:
        while True:
            await self.version_event.wait()
            self.version_event.clear()
            v, offer = self.want_version, self.want_offer
            self.want_offer = None  # a retry pulls over HTTP: the offered transfer is over by then
            assert self.engine is not None and self.welcome is not None and v is not None
            if self.engine.version != v:
                await self.idle.wait()  # never swap weights under a running batch
                t0 = time.monotonic()
                try:
                    tensors = await self.weights.pull(self._weights_base(), v, self.session, offer=offer)
                except WeightPullError as e:  # e.g. the trainer restarting: try again, don't hang
                    log.warning("weight pull of version %d failed: %s; retrying", v, e)
                    await asyncio.sleep(1.0)
                    self.version_event.set()
                    continue
                await asyncio.to_thread(self.engine.load_weights, v, tensors)
                log.info("loaded version %d in %.2fs", v, time.monotonic() - t0)
                pull_s = time.monotonic() - t0
            else:
                pull_s = 0.0
            if self.want_version == v and not self.draining:
                await self._send(P.Ready(version=v, pull_seconds=pull_s, capacity=self._capacity()))

    def _weights_base(self) -> str:
        """Weights are served on the port this worker dialed. The welcome's URL is the trainer's own
        view (127.0.0.1 when it binds 0.0.0.0): used only when it names a different, routable server."""
        offered = self.welcome.weights_url if self.welcome else ""
        host = urlsplit(offered).hostname if offered else None
        if not host or tls.is_loopback(host):
            return self.cfg.trainer_url
        return offered

    # ---- generation --------------------------------------------------------------------
    async def _engine_loop(self) -> None:
        assert self.engine is not None and self.welcome is not None
        while True:
            await self.work.wait()
            if not self.pending or self.draining:
                self.work.clear()
                continue
            reqs = self._admit(self._capacity())
            if not reqs:
                await self._flush()  # requests aborted before they started: report them
                continue
            self.idle.clear()
            if getattr(self.engine, "continuous", False):
                # continuous batching: requests join mid-batch, each end is reported as it happens
                gen = asyncio.ensure_future(
                    asyncio.to_thread(
                        self.engine.generate,  # type: ignore[call-arg]
                        reqs,
                        self._on_tokens,
                        self._should_abort,
                        self.welcome.temperature,
                        **self._truncation(),
                        admit=self._admit,
                        on_finish=self._on_finish,
                    )
                )
            else:
                gen = asyncio.ensure_future(
                    asyncio.to_thread(
                        self.engine.generate,
                        reqs,
                        self._on_tokens,
                        self._should_abort,
                        self.welcome.temperature,
                        **self._truncation(),
                    )
                )
            self._gen = gen
            try:
                # shielded: a lost connection cancels this loop, not the engine thread (which cannot be
                # cancelled); the next session waits for it to stop (_settle_engine)
                reasons = await asyncio.shield(gen) or {}
            except Exception:
                # never let one bad batch kill the loop: hand back everything not reported yet
                log.exception("engine failed; returning its requests to the coordinator")
                ended = {r for r, _ in self.finished_outbox}
                reasons = {rid: "aborted" for rid in self.lengths if rid not in ended}
            finally:
                if gen.done():
                    self.idle.set()
                else:  # never swap weights under a batch that is still running
                    gen.add_done_callback(lambda _f: self.idle.set())
            for rid, why in reasons.items():
                self.finished_outbox.append((rid, why))
            await self._flush()

    def _admit(self, n: int) -> list[GenRequest]:
        """Up to n pending requests for the engine (also called from the engine thread)."""
        out: list[GenRequest] = []
        while self.pending and len(out) < n and not self.draining:
            g = self.pending.popleft()
            self.lengths[g.rid] = len(g.prefix)
            if g.handle is not None:
                self.handles[g.rid] = g.handle
            if g.rid in self.aborted:  # taken back before it started: report it, skip the prefill
                self.siblings.pop(g.rid, None)
                self.finished_outbox.append((g.rid, "aborted"))
                continue
            out.append(
                GenRequest(
                    rid=g.rid,
                    prompt=g.prompt,
                    prefix=g.prefix,
                    max_new_tokens=g.max_new_tokens,
                    seed=g.seed,
                    group=g.group,
                    siblings=self.siblings.pop(g.rid, []),
                )
            )
        return out

    def _on_finish(self, rid: str, reason: str) -> None:
        self.finished_outbox.append((rid, reason))  # engine thread

    def _on_tokens(self, rid: str, offset: int, ids: list[int], logprobs: list[float]) -> None:
        # engine thread: deque.append is atomic, the flusher drains it
        self.outbox.append((rid, offset, ids, logprobs))

    def _truncation(self) -> dict[str, float]:
        """generate's top_k / top_p keywords: none when both are off (any engine takes that call)."""
        w = self.welcome
        if w is None or (w.top_k <= 0 and w.top_p >= 1.0):
            return {}
        return {"top_k": w.top_k, "top_p": w.top_p}

    def _should_abort(self, rid: str) -> bool:
        return self.draining or rid in self.aborted

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(self.welcome.flush_s if self.welcome else self.cfg.flush_s)
            await self._flush()

    async def _flush(self) -> None:
        if self.engine is None:
            return
        # Ends reported before this point had their tokens queued before them: send tokens first.
        n_fin = len(self.finished_outbox)
        if self.outbox:
            version = self.engine.version or 0
            chunks: dict[str, tuple[int, list[int], list[float]]] = {}
            n = 0
            while self.outbox:
                rid, pos, ids, lps = self.outbox.popleft()
                ch = chunks.get(rid)
                if ch is None or ch[0] + len(ch[1]) != pos:
                    if ch is not None:  # non-contiguous: send what we have, start a new chunk
                        await self._send_tokens({rid: ch}, version)
                    ch = chunks[rid] = (pos, [], [])
                ch[1].extend(ids)
                ch[2].extend(lps)
                self.lengths[rid] = pos + len(ids)
                n += len(ids)
            self.tokens_window.append((time.monotonic(), n))
            await self._send_tokens(chunks, version)
        if n_fin:
            ended = [self.finished_outbox.popleft() for _ in range(n_fin)]
            if self.draining:  # the coordinator takes unfinished ones back when we say `draining`
                ended = [(r, why) for r, why in ended if why != "aborted"]
            if ended:
                rids = [r for r, _ in ended]
                await self._send(
                    P.Finished(
                        rids=rids,
                        reasons=[why for _, why in ended],  # type: ignore[misc]
                        lengths=[self.lengths.get(r, 0) for r in rids],
                        **self._draft_counts(rids),
                    )
                )
            for r, _ in ended:
                self.lengths.pop(r, None)
                self.aborted.discard(r)
                self.handles.pop(r, None)

    def _draft_counts(self, rids: list[str]) -> dict[str, list[int]]:
        """The engine's speculative-decoding counts of these ended requests (taken: a request that comes
        back later starts new ones), for `finished`; none from an engine that does not draft."""
        drafts = getattr(self.engine, "drafts", None)
        if not drafts:
            return {}
        counts = [drafts.pop(r, None) or DraftCounts() for r in rids]
        return {
            "drafted": [c.drafted for c in counts],
            "accepted": [c.accepted for c in counts],
            "draft_passes": [c.passes for c in counts],
        }

    async def _send_tokens(self, chunks: dict[str, tuple[int, list[int], list[float]]], version: int) -> None:
        if self.welcome is not None and self.welcome.binary_tokens and all(r in self.handles for r in chunks):
            counts = [len(c[1]) for c in chunks.values()]
            frame = token_frames.encode(
                version,
                [self.handles[r] for r in chunks],
                [c[0] for c in chunks.values()],
                counts,
                [t for c in chunks.values() for t in c[1]],
                [lp for c in chunks.values() for lp in c[2]],
            )
            await self._send_bytes(frame)
            return
        await self._send(
            P.Tokens(
                chunks=[
                    P.TokenChunk(rid=r, offset=off, ids=ids, logprobs=lps, version=version)
                    for r, (off, ids, lps) in chunks.items()
                ]
            )
        )

    # ---- liveness and notices ----------------------------------------------------------
    async def _heartbeats(self) -> None:
        assert self.welcome is not None
        while True:
            await self._send(P.Heartbeat(tokens_per_s=self._tokens_per_s(), active=len(self.lengths)))
            await asyncio.sleep(self.welcome.heartbeat_s)

    def _tokens_per_s(self, window: float = 5.0) -> float:
        now = time.monotonic()
        while self.tokens_window and now - self.tokens_window[0][0] > window:
            self.tokens_window.popleft()
        return sum(n for _, n in self.tokens_window) / window

    async def _watch_notice(self) -> None:
        assert self.notice is not None
        reason = await self.notice.wait()
        log.warning("%s: draining", reason)
        self.draining = True  # engine stops after its current decode step
        await self.idle.wait()
        await self._flush()
        await self._send(P.Draining(reason=reason))
        self.exit_reason = "drained"
        if self.ws is not None:
            await self.ws.close()

    async def _send(self, msg: P.Msg) -> None:
        ws = self.ws
        if ws is None or ws.closed:
            raise Disconnected("socket closed")
        try:
            await ws.send_str(msg.model_dump_json())
        except (ConnectionError, RuntimeError) as e:
            raise Disconnected(str(e)) from e

    async def _send_bytes(self, data: bytes) -> None:
        ws = self.ws
        if ws is None or ws.closed:
            raise Disconnected("socket closed")
        try:
            await ws.send_bytes(data)
        except (ConnectionError, RuntimeError) as e:
            raise Disconnected(str(e)) from e


def _error_of(text: str) -> str:
    """The trainer's one-line reason in an error response (`{"error": ...}`), else the text, short."""
    try:
        return str(json.loads(text).get("error", text))[:200]
    except (ValueError, AttributeError):
        return text[:200]
