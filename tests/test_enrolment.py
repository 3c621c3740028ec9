"""Enrolment (rlboost/contracts/enrolment.py): nodes boot without the job token and get it, with the job's
secret variables, from the trainer (spot workers) or the controller (a trainer node).

- A worker credential enrols once, before its expiry, with the trainer instance it names; the real
  trainer app refuses a second use (403), an expired or foreign one (401); it is the only route
  without the token. A real WorkerAgent enrols, puts the secrets in its environment, and keeps the
  token across a reconnect (a second enrolment would be refused).
- A trainer node booted with a commitment answers the controller's challenge bound to its own
  certificate: a wrong commitment, and a man-in-the-middle presenting another certificate, are
  refused before any token is sent; a delivery without the key is refused and the node keeps waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import os
import ssl
import threading
import time
from pathlib import Path

import pytest

from rlboost.cli.enrolment import TrainerEnrolment, TrainerEnrolmentError, pin_file
from rlboost.contracts import enrolment as E
from rlboost.contracts import tls
from rlboost.contracts.spec import parse_spec
from rlboost.trainer.enrolment import WorkerEnrolment, await_delivery, job_secret_env, listen
from tests.live_trainer import AUDIENCE, LiveTrainer

TOKEN = "enrol-test-token-5b1e"


def test_a_credential_names_its_worker_trainer_and_expiry():
    cred = E.worker_credential(TOKEN, "job-1-w001", "job-1-trainer", ttl_s=60, now=1000.0)
    claim = E.check_worker_credential(TOKEN, cred, "job-1-trainer", now=1059.0)
    assert (claim.worker_id, claim.expiry) == ("job-1-w001", 1060)
    assert TOKEN not in cred
    wid, expiry, nonce, mac = cred.split(".")
    refusals = {
        "expired": (cred, "job-1-trainer", 1061.0),
        "another trainer instance": (cred, "job-1-trainer-r1", 1000.0),
        "another worker": (".".join(["job-1-w002", expiry, nonce, mac]), "job-1-trainer", 1000.0),
        "a later expiry": (".".join([wid, str(int(expiry) + 3600), nonce, mac]), "job-1-trainer", 1000.0),
        "garbage": ("not-a-credential", "job-1-trainer", 1000.0),
    }
    for what, (c, audience, now) in refusals.items():
        with pytest.raises(E.EnrolmentRefused):
            E.check_worker_credential(TOKEN, c, audience, now=now)
            pytest.fail(f"accepted: {what}")
    with pytest.raises(E.EnrolmentRefused):  # another job's token
        E.check_worker_credential("other-token", cred, "job-1-trainer", now=1000.0)


def test_the_trainer_grants_a_credential_once_and_never_an_expired_one():
    clock = [1000.0]
    enrol = WorkerEnrolment(TOKEN, "t1", {"HF_TOKEN": "hf_x"}, clock=lambda: clock[0])
    cred = E.worker_credential(TOKEN, "w1", "t1", ttl_s=60, now=1000.0)
    assert enrol.grant(cred) == E.Grant(token=TOKEN, env={"HF_TOKEN": "hf_x"})
    with pytest.raises(E.CredentialUsed):
        enrol.grant(cred)
    late = E.worker_credential(TOKEN, "w2", "t1", ttl_s=60, now=1000.0)
    clock[0] = 1061.0
    with pytest.raises(E.EnrolmentRefused, match="expired"):
        enrol.grant(late)
    assert enrol.used == {}  # an expired nonce is forgotten: it can never come back


def test_job_secret_env_is_the_null_envs_set_here():
    envs = {"PLAIN": "x", "HF_TOKEN": None, "UNSET": None}
    spec = parse_spec({"name": "sec", "rollout": {"max_workers": 0}, "envs": envs})
    assert job_secret_env(spec, {"PLAIN": "y", "HF_TOKEN": "hf_1", "OTHER": "z"}) == {"HF_TOKEN": "hf_1"}


@pytest.fixture
def live():
    t = LiveTrainer(TOKEN, secret_env={"RLBOOST_TEST_ENROL_SECRET_X": "s3cret-value"})
    try:
        yield t
    finally:
        t.stop()


def _post(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        text = r.read().decode()
        return r.status, json.loads(text) if text.startswith("{") else {"text": text}
    finally:
        conn.close()


def test_the_enrol_route_needs_no_token_but_a_credential_used_once(live):
    cred = E.worker_credential(TOKEN, "w9", AUDIENCE)
    body = json.dumps({"credential": cred}).encode()
    status, got = _post(live.port, E.WORKER_ROUTE, body)
    assert status == 200 and got == {"token": TOKEN, "env": {"RLBOOST_TEST_ENROL_SECRET_X": "s3cret-value"}}
    status, got = _post(live.port, E.WORKER_ROUTE, body)
    assert status == 403 and "used already" in got["error"]
    expired = E.worker_credential(TOKEN, "w9", AUDIENCE, ttl_s=-1)
    assert _post(live.port, E.WORKER_ROUTE, json.dumps({"credential": expired}).encode())[0] == 401
    foreign = E.worker_credential(TOKEN, "w9", "another-trainer")
    assert _post(live.port, E.WORKER_ROUTE, json.dumps({"credential": foreign}).encode())[0] == 401
    assert _post(live.port, E.WORKER_ROUTE, b"{not json")[0] == 401
    # the exemption is this route only: its neighbours and other methods still need the token
    fresh = json.dumps({"credential": E.worker_credential(TOKEN, "w8", AUDIENCE)}).encode()
    for path in (E.WORKER_ROUTE + "/", E.CHALLENGE_ROUTE, E.DELIVER_ROUTE, "/v1/status", "/v1/shutdown"):
        assert _post(live.port, path, fresh)[0] == 401, path


def test_a_worker_enrols_once_and_keeps_its_token_across_a_reconnect(live, caplog):
    caplog.set_level(logging.INFO, logger="rlboost")
    cred = E.worker_credential(TOKEN, "w-enrolled", AUDIENCE)
    os.environ.pop("RLBOOST_TEST_ENROL_SECRET_X", None)
    try:
        live.start_workers(["w-enrolled"], token="", enrol=cred)
        live.wait_ready(["w-enrolled"], 0)
        assert os.environ.get("RLBOOST_TEST_ENROL_SECRET_X") == "s3cret-value"  # for its engine (HF_TOKEN)
        agent = live.agents["w-enrolled"]
        assert agent.cfg.token == TOKEN

        first = agent.ws

        async def drop() -> None:  # the connection breaks: the agent dials again
            assert first is not None
            await first.close()

        live.call(drop)
        deadline = time.monotonic() + 30
        while agent.ws is None or agent.ws is first:
            assert time.monotonic() < deadline, "the worker did not dial again"
            assert not live.runs["w-enrolled"].done(), "the worker gave up instead of dialling again"
            time.sleep(0.05)
        live.wait_ready(["w-enrolled"], 0)  # back, with the token it had: enrolling again would be refused
        assert not live.runs["w-enrolled"].done()
        live.run_step(0)
        assert len(live.enrolment.used) == 1

        # the same credential a second time (someone who read the worker's boot data): refused, clearly
        live.start_workers(["w-copycat"], token="", enrol=cred)
        assert live.call(lambda: asyncio.wait_for(live.runs["w-copycat"], 30)) == 3
        assert "w-copycat" not in live.engines()
    finally:
        os.environ.pop("RLBOOST_TEST_ENROL_SECRET_X", None)
    refused = [r.getMessage() for r in caplog.records if "refused this worker's enrolment" in r.getMessage()]
    assert refused and "used already" in refused[0]
    assert not any(TOKEN in r.getMessage() or "s3cret-value" in r.getMessage() for r in caplog.records)


# ---- the trainer node -------------------------------------------------------------------------


class Node:
    """`await_delivery` on a loopback port with TLS on, on its own event loop: a trainer node waiting
    to enrol. `result()`: its grant once delivered."""

    def __init__(self, run_dir: Path, commitment: str) -> None:
        spec = parse_spec({"name": "node", "trainer": {"tls": "on"}, "rollout": {"max_workers": 0}})
        run_dir.mkdir(parents=True, exist_ok=True)
        self.sock = listen("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def start() -> asyncio.Task:
            return asyncio.ensure_future(await_delivery(self.sock, spec, "127.0.0.1", run_dir, commitment, 60))

        self.task = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        endpoint = run_dir / "endpoint"
        deadline = time.monotonic() + 30
        while not endpoint.exists():
            assert time.monotonic() < deadline and not self.task.done(), self.task
            time.sleep(0.02)
        self.url = endpoint.read_text()
        self.fingerprint = tls.fingerprint_of(run_dir / "tls" / "trainer-cert.pem")

    def wait_for_delivery(self, timeout_s: float = 30) -> E.Grant:
        """What the node was delivered, once it has been (it takes it after the enrolling call returns)."""
        deadline = time.monotonic() + timeout_s
        while (got := self.delivered()) is None:
            assert time.monotonic() < deadline, "nothing delivered to the node"
            time.sleep(0.02)
        return got

    def delivered(self) -> E.Grant | None:
        return self.task.result() if self.task.done() else None

    def close(self) -> None:
        async def stop() -> None:  # still waiting: it stops serving
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.sock.close()


def _grant() -> E.Grant:
    return E.Grant(token=TOKEN, env={"HF_TOKEN": "hf_secret_value"})


def test_a_trainer_node_is_pinned_then_given_the_token(tmp_path):
    ctl = TrainerEnrolment(_grant(), pin_file(tmp_path / "ctl", "job-1-trainer"))
    node = Node(tmp_path / "node", ctl.commitment)
    try:
        assert node.url.startswith("https://127.0.0.1:")
        # someone who read the boot data knows the commitment, not the key: a delivery is refused
        forged = E.Delivery(key="ab" * 32, grant=E.Grant(token="attacker-token"))
        ctx = tls.pinned_socket_context()
        conn = http.client.HTTPSConnection("127.0.0.1", node.port, timeout=10, context=ctx)
        conn.request("POST", E.DELIVER_ROUTE, body=forged.model_dump_json())
        assert conn.getresponse().status == 401
        conn.close()
        ctl.attempt(node.url)
        assert ctl.done and ctl.pin == pin_file(tmp_path / "ctl", "job-1-trainer")
        assert tls.fingerprint_of(ctl.pin) == node.fingerprint  # what the controller and its workers pin
        assert node.wait_for_delivery() == _grant()
    finally:
        node.close()


def test_a_wrong_commitment_is_refused_before_the_token_is_sent(tmp_path):
    ctl = TrainerEnrolment(_grant(), pin_file(tmp_path / "ctl", "t"))
    _, other = E.trainer_key()  # the node was booted for another launch
    node = Node(tmp_path / "node", other)
    try:
        with pytest.raises(TrainerEnrolmentError, match="did not prove it is the trainer node"):
            ctl.attempt(node.url)
        assert not ctl.sent and ctl.pin is None and not ctl.pin_path.exists()
        assert node.delivered() is None
    finally:
        node.close()


class Mitm:
    """A TLS-terminating relay with a certificate of its own in front of the node: what a
    man-in-the-middle on the path to the node's address would be."""

    def __init__(self, cert_dir: Path, target_port: int) -> None:
        files = tls.make_self_signed(cert_dir, ["127.0.0.1"])
        self.ctx = tls.server_context(files.cert, files.key)
        self.target = target_port
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _start(self) -> asyncio.Server:
        return await asyncio.start_server(self._relay, "127.0.0.1", 0, ssl=self.ctx)

    async def _relay(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        nr, nw = await asyncio.open_connection("127.0.0.1", self.target, ssl=tls.pinned_socket_context())

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                w.close()

        await asyncio.gather(pipe(cr, nw), pipe(nr, cw))

    def close(self) -> None:
        self.server.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_a_man_in_the_middle_with_another_certificate_gets_no_token(tmp_path):
    ctl = TrainerEnrolment(_grant(), pin_file(tmp_path / "ctl", "t"))
    node = Node(tmp_path / "node", ctl.commitment)
    mitm = Mitm(tmp_path / "mitm", node.port)
    try:
        # the relay passes the node's true answer along, but it is bound to the node's certificate
        with pytest.raises(TrainerEnrolmentError, match="did not prove"):
            ctl.attempt(f"https://127.0.0.1:{mitm.port}")
        assert not ctl.sent and not ctl.pin_path.exists() and node.delivered() is None
        ctl.attempt(node.url)  # the real node, directly: enrolled
        assert ctl.done
        assert node.wait_for_delivery() == _grant()
    finally:
        mitm.close()
        node.close()


def test_nothing_at_the_address_yet_is_not_an_error(tmp_path):
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    ctl = TrainerEnrolment(_grant(), pin_file(tmp_path, "t"))
    ctl.attempt(f"https://127.0.0.1:{port}", timeout=2)  # refused: the node is still booting
    assert not ctl.done and "Connection" in ctl.last_error


def test_a_resumed_controller_completes_the_enrolment_a_dead_one_began(tmp_path):
    """Issue 56: the key lived only in the controller that launched the node. It is on disk (0600, in
    the run dir, never in boot data) before the launch, so another controller enrols the same node."""
    from rlboost.cli.enrolment import key_file

    run_dir = tmp_path / "ctl"
    begun = TrainerEnrolment.begin(_grant(), run_dir, "job-1-trainer")
    kept = key_file(run_dir, "job-1-trainer")
    assert kept.read_text() == begun.key and kept.stat().st_mode & 0o777 == 0o600
    assert begun.key not in json.dumps(begun.env)  # the node boots with the commitment alone
    node = Node(tmp_path / "node", begun.commitment)  # booted for the dead controller's launch
    try:
        resumed = TrainerEnrolment.resumed(_grant(), run_dir, "job-1-trainer")
        assert resumed is not None and resumed.commitment == begun.commitment
        resumed.attempt(node.url)
        assert resumed.done
        assert node.wait_for_delivery() == _grant()
        TrainerEnrolment.forget(run_dir, "job-1-trainer")  # serving: the key is dropped
        assert not kept.exists() and TrainerEnrolment.resumed(_grant(), run_dir, "job-1-trainer") is None
    finally:
        node.close()
