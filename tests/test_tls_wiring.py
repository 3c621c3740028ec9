"""TLS end to end: a real trainer process serving https (trainer.tls: on, on loopback) and a worker
process pinning the certificate's fingerprint (WebSocket, weight pulls, tracker); an unpinned or wrongly pinned worker
is refused; every trainer route is still behind the job token."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from rlboost.contracts import tls

pytestmark = pytest.mark.integration

TOKEN = "tls-test-token-7f3a9c"


def write_spec(tmp: Path, steps: int = 3) -> Path:
    job = {
        "name": "tlsjob",
        "algorithm": {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 8, "steps": steps, "seed": 1,
                      "warm_start_steps": 5},
        "task": {"name": "reverse", "min_len": 3, "max_len": 4},
        "trainer": {"hourly_price": 1.0, "tls": "on"},
        # no reserved engine: the spot worker (pinned https weight pulls + WebSocket) does all the work
        "rollout": {"max_workers": 1, "trainer_engine": False, "engine_batch": 16, "heartbeat_timeout_s": 4,
                    "candidates": [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.0}]},
    }
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLBOOST_")}
    return {**env, "PYTHONUNBUFFERED": "1", "RLBOOST_TORCH_THREADS": "1", **extra}


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        assert proc.poll() is None, f"process exited early ({proc.returncode})"
        time.sleep(0.1)
    raise AssertionError(f"{path} did not appear in {timeout}s")


def _worker(tmp: Path, url: str, wid: str, fingerprint: str | None) -> subprocess.Popen:
    env = _env(RLBOOST_TRAINER_URL=url, RLBOOST_JOB_TOKEN=TOKEN, RLBOOST_WORKER_ID=wid, RLBOOST_ENGINE="torch")
    if fingerprint is not None:
        env["RLBOOST_TLS_FINGERPRINT"] = fingerprint
    out = open(tmp / f"{wid}.log", "wb")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen([sys.executable, "-m", "rlboost.worker"], env=env, stdout=out, stderr=subprocess.STDOUT)


def test_trainer_and_workers_over_pinned_tls(tmp_path):
    spec = write_spec(tmp_path)
    run_dir = tmp_path / "run"
    # the controller's side: the certificate and the env for trainer and workers
    job = tls.job_tls("on", tmp_path / "ctl", "127.0.0.1")
    assert job is not None and job.worker_env == {"RLBOOST_TLS_FINGERPRINT": job.files.fingerprint}
    assert (job.files.key.stat().st_mode & 0o077) == 0
    log = open(tmp_path / "trainer.log", "wb")  # noqa: SIM115
    trainer = subprocess.Popen(
        [sys.executable, "-m", "rlboost.trainer", "--spec", str(spec), "--run-dir", str(run_dir), "--linger", "20"],
        env=_env(RLBOOST_JOB_TOKEN=TOKEN, **job.trainer_env),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    procs = [trainer]
    try:
        url = _wait_for(run_dir / "endpoint", trainer)
        assert url.startswith("https://127.0.0.1:")
        assert (run_dir / "tls-fingerprint").read_text() == job.files.fingerprint
        good = _worker(tmp_path, url, "w-good", job.files.fingerprint.upper())  # any case accepted
        wrong = _worker(tmp_path, url, "w-wrong", "ab" * 32)
        unpinned = _worker(tmp_path, url, "w-unpinned", None)
        procs += [good, wrong, unpinned]
        assert wrong.wait(60) == 5, (tmp_path / "w-wrong.log").read_text()
        assert unpinned.wait(60) == 2, (tmp_path / "w-unpinned.log").read_text()

        ctx = tls.client_context(job.files.cert)  # what the controller uses for status/shutdown
        with httpx.Client(verify=ctx, timeout=5) as http:
            # plain http to an https port, and https without the token: refused
            with pytest.raises(httpx.HTTPError):
                httpx.get(url.replace("https://", "http://") + "/v1/status", timeout=5).raise_for_status()
            with pytest.raises(httpx.ConnectError):  # an unpinned client does not trust it
                httpx.get(url + "/v1/status", timeout=5)
            for path in ("/v1/status", "/v1/weights/latest", "/v1/weights/0/manifest", "/v1/weights/0/chunks/0"):
                assert http.get(url + path).status_code == 401
            assert http.post(url + "/v1/shutdown").status_code == 401
            auth = {"Authorization": f"Bearer {TOKEN}"}
            deadline, snap = time.monotonic() + 240, {}
            while time.monotonic() < deadline and trainer.poll() is None:
                snap = http.get(url + "/v1/status", headers=auth).json()
                if snap["phase"] == "done":
                    break
                time.sleep(0.5)
            assert snap.get("phase") == "done", (tmp_path / "trainer.log").read_text()[-3000:]
            assert [h["responses"] for h in snap["history"]] == [32, 32, 32]
            ids = {w["worker_id"] for w in snap["workers"] if w["tokens"] > 0}
            assert ids == {"w-good"}, snap["workers"]
            assert not {"w-wrong", "w-unpinned"} & {w["worker_id"] for w in snap["workers"]}
            assert http.post(url + "/v1/shutdown", headers=auth).json() == {"ok": True}
        assert trainer.wait(30) == 0
        assert good.wait(30) == 0
        logs = "".join((tmp_path / n).read_text() for n in ("trainer.log", "w-good.log", "w-wrong.log"))
        assert TOKEN not in logs and "PRIVATE KEY" not in logs
        # the trainer copied nothing secret anywhere readable by others
        for p in run_dir.rglob("*"):
            if p.is_file() and (p.stat().st_mode & 0o077):
                assert "PRIVATE KEY" not in p.read_text(errors="ignore"), p
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def test_job_tls_env_choices(tmp_path):
    assert tls.job_tls("auto", tmp_path, "127.0.0.1") is None
    assert tls.job_tls("off", tmp_path, "0.0.0.0") is None
    remote = tls.job_tls("auto", tmp_path / "r", "0.0.0.0")
    assert remote is not None
    assert set(remote.trainer_env) == {"RLBOOST_TLS_CERT_PEM", "RLBOOST_TLS_KEY_PEM", "RLBOOST_TLS_FINGERPRINT"}
    # a trainer on another machine rebuilds the same files from the PEM text (key 0600)
    files = tls.server_files(tmp_path / "node", ["127.0.0.1"], remote.trainer_env)
    assert files.fingerprint == remote.files.fingerprint
    assert (files.key.stat().st_mode & 0o777) == 0o600
    assert tls.https_url("http://1.2.3.4:8000") == "https://1.2.3.4:8000"
    assert tls.server_tls_on("auto", "127.0.0.1", {"RLBOOST_TLS_CERT": "x"})
    assert not tls.server_tls_on("off", "0.0.0.0", {"RLBOOST_TLS_CERT": "x"})
    with pytest.raises(ValueError):
        tls.normalize_fingerprint("zz")
    assert json.dumps(remote.worker_env)  # plain strings: fit any provider's env


def test_peer_server_in_a_tls_job_is_pinned_through_its_url():
    import asyncio

    from rlboost.weights.chunk_http import HttpConn, SourceError
    from rlboost.weights.peer_server import PeerServer, ServeOptions
    from rlboost.weights.store import WeightStore

    def get(url: str, fingerprint: str | None = None, token: str = "tok") -> int | str:
        conn = HttpConn(url, token, 5, fingerprint)
        try:
            return conn.request("/v1/weights/0/manifest", {})[0]
        except SourceError as e:
            assert not e.retryable
            return "refused"
        finally:
            conn.close()

    async def main() -> list:
        server = PeerServer(WeightStore(), "tok", ServeOptions(tls=True))
        url = await server.start()
        try:
            bare = url.split("#")[0]
            return [url, *await asyncio.gather(
                asyncio.to_thread(get, url),  # pinned by the advertised fingerprint: served (404: holds nothing)
                asyncio.to_thread(get, url, None, "wrong"),  # and still behind the job token
                asyncio.to_thread(get, bare, "ab" * 32),  # another pin: refused
            )]
        finally:
            await server.close()

    url, ok, wrong_token, wrong_pin = asyncio.run(main())
    assert url.startswith("https://127.0.0.1:") and "#sha256=" in url
    assert (ok, wrong_token, wrong_pin) == (404, 401, "refused")


def test_an_enrolling_trainer_proves_its_own_certificate_and_workers_enrol_over_it(tmp_path):
    """The cloud path (AWS/GCP): the trainer boots with a commitment only, makes its own certificate,
    and waits; a controller holding another key is refused before any token is sent; the right one
    pins the certificate and delivers the token and a secret variable; a spot worker that boots with
    only a credential enrols over the pinned TLS, once; the delivery is not taken a second time."""
    from rlboost.cli.enrolment import TrainerEnrolment, TrainerEnrolmentError, pin_file
    from rlboost.contracts import enrolment as E

    spec = tmp_path / "job.yaml"
    job = yaml.safe_load(write_spec(tmp_path, steps=2).read_text())
    spec.write_text(yaml.safe_dump({**job, "envs": {"API_KEY_X": None}}))
    run_dir = tmp_path / "run"
    secret = "api-key-value-3f9a0c"
    grant = E.Grant(token=TOKEN, env={"API_KEY_X": secret})
    ctl = TrainerEnrolment(grant, pin_file(tmp_path / "ctl", "tlsjob-1-trainer"))
    log = open(tmp_path / "trainer.log", "wb")  # noqa: SIM115
    trainer = subprocess.Popen(
        [sys.executable, "-m", "rlboost.trainer", "--spec", str(spec), "--run-dir", str(run_dir), "--linger", "20"],
        env=_env(RLBOOST_INSTANCE_ID="tlsjob-1-trainer", **ctl.env),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    procs = [trainer]
    try:
        url = _wait_for(run_dir / "endpoint", trainer)
        assert url.startswith("https://127.0.0.1:")
        with pytest.raises(TrainerEnrolmentError, match="did not prove"):
            TrainerEnrolment(grant, tmp_path / "other.pem").attempt(url)  # another launch's key
        deadline = time.monotonic() + 60
        while not ctl.done:
            assert time.monotonic() < deadline and trainer.poll() is None, ctl.last_error
            ctl.attempt(url)
            time.sleep(0.05)
        assert ctl.pin is not None
        fingerprint = tls.fingerprint_of(ctl.pin)
        assert fingerprint == tls.fingerprint_of(run_dir / "tls" / "trainer-cert.pem")  # the one it made
        cred = E.worker_credential(TOKEN, "w-enrolled", "tlsjob-1-trainer")
        env = _env(RLBOOST_TRAINER_URL=url, RLBOOST_ENROL=cred, RLBOOST_WORKER_ID="w-enrolled",
                   RLBOOST_ENGINE="torch", RLBOOST_TLS_FINGERPRINT=fingerprint)
        out = open(tmp_path / "w-enrolled.log", "wb")  # noqa: SIM115
        worker = subprocess.Popen(
            [sys.executable, "-m", "rlboost.worker"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
        procs.append(worker)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(verify=tls.client_context(ctl.pin), timeout=5) as http:
            deadline, snap = time.monotonic() + 240, {}
            while time.monotonic() < deadline and trainer.poll() is None:
                with contextlib.suppress(httpx.HTTPError):  # loading its model: not serving yet
                    snap = http.get(url + "/v1/status", headers=auth).json()
                if snap.get("phase") == "done":
                    break
                time.sleep(0.5)
            assert snap.get("phase") == "done", (tmp_path / "trainer.log").read_text()[-3000:]
            assert {w["worker_id"] for w in snap["workers"] if w["tokens"] > 0} == {"w-enrolled"}
            # the delivery route is gone: the trainer itself answers, behind the token
            again = E.Delivery(key=ctl.key, grant=E.Grant(token="another-token"))
            assert http.post(url + E.DELIVER_ROUTE, content=again.model_dump_json()).status_code == 401
            copy = subprocess.run(
                [sys.executable, "-m", "rlboost.worker"], env=env, capture_output=True, text=True, timeout=60
            )
            assert copy.returncode == 3 and "used already" in copy.stderr, copy.stderr
            assert http.post(url + "/v1/shutdown", headers=auth).json() == {"ok": True}
        assert trainer.wait(30) == 0
        assert worker.wait(30) == 0
        logs = "".join((tmp_path / n).read_text() for n in ("trainer.log", "w-enrolled.log"))
        assert "enrolled: job token and 1 secret variable(s) (API_KEY_X)" in logs
        assert TOKEN not in logs and secret not in logs and "PRIVATE KEY" not in logs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
