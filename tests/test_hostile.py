"""Hostile input: property-based fuzzing of every trainer route and of the job file parser.

A real trainer app (coordinator, weight publisher, tracker, status, shutdown) serves two well-behaved
workers on synthetic engines. Hypothesis throws wrong tokens, malformed and oversized bodies and
frames, wrong protocol versions, replayed hellos and duplicated/stale/forged token frames at it; every
one is rejected (401 / 4xx / close) and the job is not harmed: the good workers keep their original
connections and still produce exactly the right responses, step after step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import string
import time
from urllib.parse import quote

import numpy as np
import pytest
import websockets
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect

from rlboost.contracts import protocol as P
from rlboost.contracts import token_frames
from rlboost.contracts.sampling import request_seed
from rlboost.contracts.spec import SpecError, load_spec
from rlboost.models.vocab import VOCAB_SIZE
from rlboost.worker.engines.synthetic import token_at
from tests.chaos import FAULTS, FaultRecord
from tests.live_trainer import LiveTrainer

pytestmark = pytest.mark.faults

TOKEN = "hostile-test-token-0d9e1f"
GOOD = ["good0", "good1"]
FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@pytest.fixture(scope="module")
def live():
    t = LiveTrainer(TOKEN)
    t.start_workers(GOOD)
    t.wait_ready(GOOD, 0)
    t.run_step(0)
    t.good_conns = {w: c for w, c in t.engines().items()}
    t.steps = 1
    yield t
    t.stop()


def assert_unharmed(t: LiveTrainer, settle_s: float = 10.0) -> None:
    """Only the good workers remain, on the very connections they started with."""
    deadline = time.monotonic() + settle_s
    while True:
        engines = t.engines()
        if set(engines) == set(GOOD) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert set(engines) == set(GOOD), sorted(engines)
    for w in GOOD:
        assert engines[w] is t.good_conns[w], f"{w} lost its connection"
        assert engines[w].state in ("ready", "busy", "idle"), engines[w].state

    def no_foreign_work() -> bool:
        return all(set(t.coord.book.by_engine) <= set(GOOD) for _ in [0])

    assert no_foreign_work(), t.coord.book.by_engine.keys()


# ---- raw HTTP --------------------------------------------------------------------------------


def raw_request(port: int, head: bytes, body: bytes = b"", timeout: float = 10) -> int:
    """Send bytes as they are (no client-side cleaning); return the status code (0: closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head + body)
        data = b""
        while b"\r\n" not in data:
            got = s.recv(4096)
            if not got:
                return 0
            data += got
    parts = data.split(b" ", 2)
    return int(parts[1])


def http(port: int, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b"") -> int:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return raw_request(port, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), body)


ROUTES = [
    ("GET", "/v1/status"),
    ("POST", "/v1/shutdown"),
    ("GET", "/v1/worker"),
    ("GET", "/v1/weights/latest"),
    ("GET", "/v1/weights/0/manifest"),
    ("GET", "/v1/weights/0/chunks/0"),
    ("GET", "/v1/weights/1/delta/0/manifest"),
    ("GET", "/v1/weights/1/delta/0/chunks/0"),
    ("POST", "/v1/weights/0/swarm"),
    ("POST", "/v1/enrol"),  # no token needed, but a credential: fuzz is refused the same way
]
PATH_CHARS = string.ascii_letters + string.digits + "/._-~%"
bad_auth = st.one_of(
    st.none(),
    st.just(f"Bearer {TOKEN[:-1]}"),
    st.just(f"bearer {TOKEN}"),
    st.just(f"Bearer  {TOKEN}"),
    st.just(f"Bearer {TOKEN}x"),
    st.just(TOKEN),
    st.text(alphabet=string.printable.strip("\r\n\x0b\x0c"), max_size=80).map(lambda s: s.strip()),
)


@FUZZ
@given(
    route=st.one_of(st.sampled_from(ROUTES), st.tuples(st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
                                                       st.text(PATH_CHARS, max_size=60).map(lambda p: "/" + p))),
    auth=bad_auth,
    body=st.binary(max_size=256),
)
def test_every_route_needs_the_token(live, route, auth, body):
    method, path = route
    headers = {} if auth is None else {"Authorization": auth}
    assert http(live.port, method, path, headers, body) == 401


def test_token_check_survives_non_utf8_and_huge_headers(live):
    head = b"GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer "
    assert raw_request(live.port, head + b"\xff\xfe" + TOKEN.encode()[2:] + b"\r\n\r\n") == 401
    big = "Bearer " + "x" * 200_000
    assert http(live.port, "GET", "/v1/status", {"Authorization": big}) in (400, 401, 431, 0)
    assert live.shutdown_requests == 0
    assert_unharmed(live)


AUTH = {"Authorization": f"Bearer {TOKEN}"}
segment = st.one_of(
    st.integers(min_value=-5, max_value=2**70).map(str),
    st.sampled_from(["..", "%2e%2e", "..%2F..", "0x1", "1_0", " 1", "+1", "1e3", "", "%00", "٣", "00"]),
    st.text(PATH_CHARS.replace("/", ""), min_size=1, max_size=20),
).map(lambda s: quote(s, safe="%.~-_"))


@FUZZ
@given(
    template=st.sampled_from(
        [
            "/v1/weights/{}/manifest",
            "/v1/weights/{}/chunks/{}",
            "/v1/weights/{}/delta/{}/manifest",
            "/v1/weights/{}/delta/{}/chunks/{}",
            "/v1/weights/{}/../../../{}",
            "/v1/weights/{}/chunks/{}/../../../../etc/passwd",
        ]
    ),
    parts=st.lists(segment, min_size=3, max_size=3),
    rng=st.one_of(st.none(), st.text(string.printable.strip("\r\n\x0b\x0c"), max_size=30),
                  st.tuples(st.integers(-3, 10**12), st.integers(-3, 10**12)).map(lambda t: f"bytes={t[0]}-{t[1]}")),
)
def test_weight_routes_reject_bad_parameters_without_failing(live, template, parts, rng):
    path = template.format(*parts[: template.count("{}")])
    headers = dict(AUTH)
    if rng is not None:
        headers["Range"] = rng.strip()
    status = http(live.port, "GET", path, headers)
    assert status in (200, 206, 400, 404, 405, 416), (path, rng, status)
    if status in (200, 206):  # only real chunks of real versions are ever served
        segs = path.split("/")
        assert segs[3].isdigit() and int(segs[3]) in live.pub.versions(), path


announce = st.fixed_dictionaries(
    {},
    optional={
        "peer_id": st.one_of(st.text(max_size=200), st.integers()),
        "url": st.one_of(
            st.none(),
            st.text(max_size=100),
            st.just("http://127.0.0.1:1"),  # a dead peer
            st.just("http://127.0.0.1:99999"),
            st.just("notaurl"),
            st.just("https://127.0.0.1:2"),  # https, not pinned
        ),
        "n_chunks": st.integers(-2, 10**9),
        "have": st.one_of(st.text(max_size=50), st.just("////"), st.just("AAAA")),
        "want": st.integers(-1, 10**6),
        "bad": st.lists(st.text(max_size=30), max_size=5),
        "done": st.one_of(st.booleans(), st.integers(), st.none()),
        "extra": st.integers(),
    },
)


@FUZZ
@given(
    version=st.one_of(st.integers(0, 3).map(str), segment),
    body=st.one_of(announce.map(lambda d: json.dumps(d).encode()), st.binary(max_size=300)),
)
def test_swarm_announces_are_validated(live, version, body):
    status = http(live.port, "POST", f"/v1/weights/{version}/swarm", dict(AUTH, **{"Content-Type": "application/json"}),
                  body)
    assert status in (200, 400, 404, 405), status


def test_oversized_bodies_are_refused(live):
    big = b"{" + b" " * (2 << 20) + b"}"
    assert http(live.port, "POST", "/v1/weights/0/swarm", AUTH, big) == 413
    assert http(live.port, "POST", "/v1/weights/0/swarm", {}, big) in (401, 0)
    # peers the fuzzers announced (dead, unpinned, garbage) must not stop a real pull: publish v1
    for url in ("http://127.0.0.1:1", "https://127.0.0.1:2", "http://127.0.0.1:3/x"):
        body = json.dumps({"peer_id": f"liar-{url[-1]}", "url": url, "n_chunks": 1, "have": "AQ==", "done": True})
        assert http(live.port, "POST", "/v1/weights/1/swarm", AUTH, body.encode()) == 200
    assert_unharmed(live)


# ---- the coordinator's WebSocket -------------------------------------------------------------


def ws_connect(t: LiveTrainer, token: str | None = TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return connect(f"ws://127.0.0.1:{t.port}/v1/worker", additional_headers=headers, open_timeout=10,
                   close_timeout=2, max_size=None)


def hello(wid: str, **over) -> str:
    msg = {"type": "hello", "protocol": P.PROTOCOL_VERSION, "worker_id": wid, "kind": "spot", "engine": "synthetic",
           "capacity": 8, **over}
    return json.dumps(msg)


def closed_code(ws, timeout: float = 10) -> int | None:
    """Read until the server closes; its close code (None: still open after `timeout`)."""
    try:
        while True:
            ws.recv(timeout=timeout)
    except websockets.ConnectionClosed as e:
        return e.rcvd.code if e.rcvd else 1006
    except TimeoutError:
        return None


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(token=st.one_of(st.none(), st.text(alphabet=string.ascii_letters + string.digits, max_size=40)))
def test_websocket_needs_the_token(live, token):
    with pytest.raises(websockets.InvalidStatus) as e:
        ws_connect(live, token)
    assert e.value.response.status_code == 401


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
KINDS = ("spot", "on-demand", "reserved")
near_messages = st.one_of(
    st.builds(lambda v: hello("fz-a", protocol=v), st.integers().filter(lambda v: v != P.PROTOCOL_VERSION)),
    st.builds(lambda k: hello("fz-a", kind=k), st.text(max_size=10).filter(lambda k: k not in KINDS)),
    st.builds(lambda c: hello("fz-a", capacity=c), st.integers().filter(lambda c: not 1 <= c <= 100_000)),
    # ids outside the protocol's WorkerId pattern (letters, digits, `_.-`; 1-64 chars)
    st.builds(lambda w: hello(w), st.text(max_size=80).filter(lambda w: not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", w))),
    json_values.map(json.dumps),
    st.dictionaries(st.sampled_from(["type", "worker_id", "protocol", "chunks", "rids"]), json_values).map(json.dumps),
    st.text(max_size=200),
)


@FUZZ
@given(first=st.one_of(near_messages, st.binary(max_size=200)))
def test_a_bad_first_frame_is_closed(live, first):
    before = live.coord.rejected_frames
    with ws_connect(live) as ws:
        ws.send(first)
        code = closed_code(ws)
    assert code == 4400, code
    assert live.coord.rejected_frames == before  # nothing was accepted, and nothing registered
    assert_unharmed(live, settle_s=2)


def test_oversized_frame_is_refused(live):
    with ws_connect(live) as ws:
        ws.send("x" * (P.MAX_FRAME_BYTES + 10))
        assert closed_code(ws) in (1009, 4400)
    with ws_connect(live) as ws:
        ws.send(hello("fz-big"))
        json.loads(ws.recv(timeout=10))
        ws.send(b"\0" * (P.MAX_FRAME_BYTES + 10))
        assert closed_code(ws) is not None
    assert_unharmed(live)


def binary_frame(draw_version: int, handles, offsets, counts, ids, lps) -> bytes:
    return token_frames.encode(draw_version, handles, offsets, counts, ids, lps)


forged_frames = st.one_of(
    st.binary(max_size=120),
    st.builds(lambda b: token_frames.MAGIC + b, st.binary(max_size=60)),
    st.builds(
        lambda v, h, o, lp: binary_frame(v, [h], [o], [2], [5, 6], [lp, lp]),
        st.integers(0, 2**31 - 1),
        st.integers(0, 2**32 - 1),
        st.integers(0, 2**31 - 1),
        st.floats(allow_nan=True, allow_infinity=True),
    ),
)
after_hello = st.one_of(
    forged_frames,
    near_messages,
    st.just(hello("fz-b")),  # a replayed hello on the same connection
    st.builds(lambda v: json.dumps({"type": "ready", "version": v}), st.integers(-3, 5)),
    st.builds(
        lambda rids, why: json.dumps({"type": "finished", "rids": rids, "reasons": [why] * len(rids),
                                      "lengths": [1] * len(rids)}),
        st.lists(st.sampled_from(["s0-p0-g0", "s1-p1-g1", "nope"]), max_size=3),
        st.sampled_from(["eos", "length", "aborted"]),
    ),
    st.builds(lambda r, lp: json.dumps({"type": "tokens", "chunks": [
        {"rid": r, "offset": 0, "ids": [5], "logprobs": [lp], "version": 0}]}), st.sampled_from(["s0-p0-g0", "x"]),
        st.sampled_from(["NaN", "Infinity", -1.0])).map(lambda s: s.replace('"NaN"', "NaN").replace('"Infinity"',
                                                                                              "Infinity")),
    st.builds(lambda x: json.dumps({"type": "heartbeat", "tokens_per_s": x}), st.sampled_from([1e308, -1, 0.5])),
    st.just('{"type": "heartbeat", "tokens_per_s": Infinity}'),
    st.just(json.dumps({"type": "draining", "reason": "x" * 300})),
)


@FUZZ
@given(frames=st.lists(after_hello, min_size=1, max_size=5))
def test_frames_after_hello_never_touch_other_workers(live, frames):
    with ws_connect(live) as ws:
        ws.send(hello("fz-b"))
        welcome = P.coord_msg.validate_json(ws.recv(timeout=10))
        assert isinstance(welcome, P.Welcome)
        for f in frames:
            try:
                ws.send(f)
            except websockets.ConnectionClosed:
                break
    assert_unharmed(live)


def test_rejections_are_counted_and_explicit(live):
    cases = [
        b"RBT1" + b"\0" * 3,  # truncated binary frame
        '{"type": "tokens", "chunks": [{"rid": "a", "offset": 0, "ids": [1], "logprobs": [NaN], "version": 0}]}',
        '{"type": "heartbeat", "tokens_per_s": Infinity}',
        hello("fz-c"),  # replayed hello
        json.dumps({"type": "finished", "rids": ["a", "b"], "reasons": ["eos"], "lengths": [1, 2]}),
        token_frames.encode(0, [1], [0], [1], [5], [float("nan")]),
    ]
    for frame in cases:
        before = live.coord.rejected_frames
        with ws_connect(live) as ws:
            ws.send(hello("fz-c"))
            ws.recv(timeout=10)
            ws.send(frame)
            assert closed_code(ws) is not None, frame
        assert live.coord.rejected_frames == before + 1, frame
    assert_unharmed(live)


def test_replayed_duplicated_stale_and_wrong_version_frames_during_a_step(live):
    """A worker holding real work replays, duplicates and forges its frames; the step still ends
    with exactly the right responses, and its work moves to the good workers."""
    step = live.steps
    live.publish(step)
    live.wait_ready(GOOD, step)
    with ws_connect(live) as ws:
        ws.send(hello("fz-holder", capacity=8))
        ws.recv(timeout=10)
        ws.send(json.dumps({"type": "ready", "version": step}))
        fut, _ = live.run_step_async(step)
        gen = None
        deadline = time.monotonic() + 20
        while gen is None and time.monotonic() < deadline:
            msg = P.coord_msg.validate_json(ws.recv(timeout=20))
            if isinstance(msg, P.Generate):
                gen = msg
        assert gen is not None and gen.requests, "the hostile worker got no work"
        g = gen.requests[0]
        seed = request_seed(1, g.rid)
        right = [token_at(seed, p) for p in range(3)]
        frame = token_frames.encode(step, [g.handle], [0], [3], right, [-0.5] * 3)
        ws.send(frame)
        ws.send(frame)  # duplicated: a no-op
        ws.send(token_frames.encode(step, [g.handle], [0], [2], [9, 9], [-0.1, -0.1]))  # stale, forged: ignored
        foreign = max(r.handle for r in gen.requests) + 12345  # names no request it holds: ignored
        ws.send(token_frames.encode(step, [foreign], [0], [1], [9], [-0.1]))
        ws.send(json.dumps({"type": "finished", "rids": ["s0-p0-g0"], "reasons": ["eos"], "lengths": [1]}))
        time.sleep(0.3)
        ws.send(token_frames.encode(step + 7, [g.handle], [3], [1], [9], [-0.1]))  # wrong version: dropped
        assert closed_code(ws) is not None
    done = fut.result(120)
    from tests.live_trainer import check_responses

    check_responses(done, live.requests(step))
    rec = {r.rid: r for r in done}[g.rid]
    assert rec.tokens[:3] == right
    live.steps += 1
    assert_unharmed(live)


def hostile_holder(t: LiveTrainer, wid: str, step: int):
    """A connection `wid` that takes work in step `step` (begun here): (ws, its first generate, the step)."""
    t.publish(step)
    t.wait_ready(GOOD, step)
    ws = ws_connect(t)
    ws.send(hello(wid, capacity=8))
    ws.recv(timeout=10)
    ws.send(json.dumps({"type": "ready", "version": step}))
    fut, _ = t.run_step_async(step)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        msg = P.coord_msg.validate_json(ws.recv(timeout=20))
        if isinstance(msg, P.Generate) and msg.requests:
            return ws, msg, fut
    raise AssertionError(f"{wid} got no work")


def test_a_token_id_outside_the_vocabulary_drops_that_worker_only(live):
    """Issue 56: an id inside the protocol's range (2**31 - 1) but past the model's vocabulary, for a
    response the worker holds, at the right version, then `finished`: refused at the book (it would reach
    the learner's embedding), the worker closed, its work done by the others; the job goes on."""
    from tests.live_trainer import check_responses

    step = live.steps
    before = live.coord.rejected_frames
    ws, gen, fut = hostile_holder(live, "fz-vocab", step)
    with ws:
        g = gen.requests[0]
        ws.send(token_frames.encode(step, [g.handle], [0], [1], [2**31 - 1], [-0.5]))
        with contextlib.suppress(websockets.ConnectionClosed):
            ws.send(json.dumps({"type": "finished", "rids": [g.rid], "reasons": ["eos"], "lengths": [1]}))
        assert closed_code(ws) == 4400
    done = fut.result(120)
    check_responses(done, live.requests(step))  # every token is the synthetic model's: none of the liar's
    assert all(t < VOCAB_SIZE for r in done for t in r.tokens)
    assert live.coord.rejected_frames == before + 1
    live.steps += 1
    assert_unharmed(live)


def test_a_live_workers_id_cannot_be_taken_over(live, caplog):
    """Issue 56: a second connection's hello with a live worker's id is closed (4409); the live worker
    keeps its connection and the responses it holds, and the step ends with every response right."""
    from tests.live_trainer import check_responses

    step = live.steps
    live.publish(step)
    live.wait_ready(GOOD, step)
    fut, reqs = live.run_step_async(step)

    async def holding() -> set[str]:
        while not (held := set(live.coord.book.assigned("good0"))):
            await asyncio.sleep(0.01)
        return held

    live.call(holding)
    caplog.set_level(logging.INFO, logger="rlboost.coordinator")
    with ws_connect(live) as ws:
        ws.send(hello("good0"))
        assert closed_code(ws) == 4409
    engines = live.engines()
    assert engines["good0"] is live.good_conns["good0"] and engines["good0"].state != "gone"
    assert not [r for r in caplog.records if "engine good0 dropped" in r.getMessage()]
    check_responses(fut.result(120), reqs)
    live.steps += 1
    assert_unharmed(live)


def test_a_reconnect_presents_its_resume_key(live):
    """Only the worker itself (its last welcome's resume key) replaces a connection not known dead yet;
    once its connection is gone, a plain hello of its id is welcome again."""
    first = ws_connect(live)
    first.send(hello("fz-again"))
    key = P.coord_msg.validate_json(first.recv(timeout=10)).resume_key
    assert len(key) == 32
    with ws_connect(live) as ws:  # a guess is no key
        ws.send(hello("fz-again", resume_key="0" * 32))
        assert closed_code(ws) == 4409
    second = ws_connect(live)
    second.send(hello("fz-again", resume_key=key))
    welcome = P.coord_msg.validate_json(second.recv(timeout=10))
    assert isinstance(welcome, P.Welcome) and welcome.resume_key != key
    assert closed_code(first) is not None  # the old connection was replaced
    second.close()

    async def gone() -> None:
        while "fz-again" in live.coord.engines:
            await asyncio.sleep(0.01)

    live.call(gone)
    with ws_connect(live) as ws:  # its connection is dead: the id is free
        ws.send(hello("fz-again"))
        assert isinstance(P.coord_msg.validate_json(ws.recv(timeout=10)), P.Welcome)
    assert_unharmed(live)


def test_the_job_still_runs_after_everything(live):
    """After all of the above: publish, pull (past the liars in the swarm), and two clean steps."""
    for _ in range(2):
        step = live.steps
        live.publish(step)
        live.wait_ready(GOOD, step)
        live.run_step(step)
        live.steps += 1
    assert_unharmed(live)
    assert len(live.coord.gone) <= 1024
    assert live.shutdown_requests == 0
    n = live.coord.rejected_frames
    FAULTS.append(FaultRecord("hostile input (fuzzed routes + WebSocket frames rejected)", n, n, 0))


# ---- the job file parser ---------------------------------------------------------------------

FIELDS = ["name", "algorithm", "task", "trainer", "rollout", "model", "local", "budget_usd", "steps", "tls"]
yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), kids,
                                                              max_size=4),
    max_leaves=15,
)


def alias_bomb(levels: int) -> str:
    """9**levels values in algorithm.steps once the aliases are expanded."""
    lines = ["name: fuzz", "a0: &a0 [1, 2, 3, 4, 5, 6, 7, 8, 9]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join([*lines, f"algorithm: {{steps: *a{levels - 1}}}"]) + "\n"


documents = st.one_of(
    yaml_values.map(lambda v: yaml.safe_dump(v)),
    st.dictionaries(st.sampled_from(FIELDS), yaml_values, max_size=6).map(
        lambda d: yaml.safe_dump({"name": "fuzz", **d})
    ),
    st.text(max_size=300),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.sampled_from(["a: [", "name: x\n  bad: indent", "!!python/object:os.system x", "*alias", "name: &a [*a]",
                     "name: fuzz\ntrainer: {tls: maybe}", "name: fuzz\nalgorithm: {steps: -1}", "\t\0",
                     # what a launch could not survive (issue 56): a NUL in a path, special files, path regions
                     'name: fuzz\nmodel: {kind: hf, path: o/m}\ntask: {name: jsonl, path: "a\\0b"}',
                     "name: fuzz\nmodel: {kind: hf, path: o/m}\ntask: {name: jsonl, path: /dev/zero}",
                     "name: fuzz\nfile_mounts: {~/z: /proc/self}", 'name: fuzz\nenvs: {A: "\\0"}',
                     "name: fuzz\ntrainer: {region: ../../etc}"]),
    # files that hung or crashed the parser (issue 36): raw bytes, other encodings, deep nesting, alias bombs
    st.binary(max_size=200),
    yaml_values.map(lambda v: yaml.safe_dump({"name": "fuzz", "x": v}).encode("utf-16")),
    st.tuples(st.sampled_from(["[", "{a: ", "- "]), st.integers(30, 3000)).map(lambda t: "name: f\nx: " + t[0] * t[1]),
    st.integers(2, 12).map(alias_bomb),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=documents)
def test_any_job_file_is_a_spec_or_a_spec_error(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("spec") / "job.yaml"
    if isinstance(doc, bytes):
        path.write_bytes(doc)
    else:
        path.write_text(doc, errors="surrogateescape")
    try:
        load_spec(path)
    except SpecError as e:
        msg = str(e)
        assert msg.strip(), "an empty SpecError"
        assert "Traceback" not in msg
        if "invalid job file" in msg:  # a validation error names the field(s) it is about
            assert any(line.split(":")[0].strip() for line in msg.splitlines()[1:]), msg
    # anything else (a crash) fails the test


def test_numpy_free_frames_of_nan_are_rejected_at_decode():
    with pytest.raises(token_frames.FrameError):
        token_frames.decode(token_frames.encode(0, [1], [0], [1], [5], [np.inf]))
