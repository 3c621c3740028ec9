"""Preemption-notice watchers against local HTTP servers that behave like each metadata service:
EC2's IMDSv2 (token PUT, then `spot/instance-action`: 404 until a notice, 401 on a bad token) and
GCE's metadata server (`instance/preempted`, Metadata-Flavor header, wait_for_change + last_etag)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import pytest
from aiohttp import web

from rlboost.worker.notice import AwsNotice, FileNotice, GcpNotice, watcher_from_env


class Imds:
    """EC2 instance metadata, IMDSv2 only."""

    def __init__(self) -> None:
        self.tokens: set[str] = set()
        self.notice: dict | None = None
        self.gets = 0
        self.puts = 0
        app = web.Application()
        app.router.add_put("/latest/api/token", self.token)
        app.router.add_get("/latest/meta-data/spot/instance-action", self.action)
        self.app = app

    async def token(self, req: web.Request) -> web.Response:
        if "X-aws-ec2-metadata-token-ttl-seconds" not in req.headers:
            return web.Response(status=400)
        self.puts += 1
        tok = f"tok{self.puts}"
        self.tokens.add(tok)
        return web.Response(text=tok)

    async def action(self, req: web.Request) -> web.Response:
        self.gets += 1
        if req.headers.get("X-aws-ec2-metadata-token") not in self.tokens:
            return web.Response(status=401)
        if self.notice is None:
            return web.Response(status=404, text="Not Found")
        return web.Response(text=json.dumps(self.notice), content_type="text/plain")


class GceMetadata:
    def __init__(self) -> None:
        self.value = "FALSE"
        self.etag = 1
        self.changed = asyncio.Event()
        self.requests: list[dict] = []
        app = web.Application()
        app.router.add_get("/computeMetadata/v1/instance/preempted", self.preempted)
        self.app = app

    def preempt(self) -> None:
        self.value, self.etag = "TRUE", self.etag + 1
        self.changed.set()

    async def preempted(self, req: web.Request) -> web.Response:
        if req.headers.get("Metadata-Flavor") != "Google":
            return web.Response(status=403, text="Missing Metadata-Flavor:Google header")
        self.requests.append(dict(req.query))
        if req.query.get("wait_for_change") == "true" and req.query.get("last_etag") == str(self.etag):
            with contextlib.suppress(asyncio.TimeoutError):  # hang until it changes or timeout_sec passes
                await asyncio.wait_for(self.changed.wait(), float(req.query.get("timeout_sec", "60")))
        return web.Response(text=self.value, headers={"ETag": str(self.etag)})


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def test_aws_instance_action_with_imdsv2():
    async def scenario() -> tuple[str, float, Imds]:
        imds = Imds()
        runner, url = await serve(imds.app)
        try:
            task = asyncio.create_task(AwsNotice(url, poll_s=0.05).wait())
            await asyncio.sleep(0.4)
            assert not task.done(), "404 means no notice yet"
            imds.notice = {"action": "terminate", "time": "2026-11-21T16:40:00Z"}
            t0 = time.monotonic()
            reason = await asyncio.wait_for(task, 5)
            return reason, time.monotonic() - t0, imds
        finally:
            await runner.cleanup()

    reason, lag, imds = asyncio.run(scenario())
    assert reason == "aws-spot-terminate at 2026-11-21T16:40:00Z"
    assert lag < 1.0, "drains at once"
    assert imds.puts == 1 and imds.gets > 3  # one session token, reused


def test_aws_expired_token_is_renewed():
    async def scenario() -> Imds:
        imds = Imds()
        runner, url = await serve(imds.app)
        try:
            task = asyncio.create_task(AwsNotice(url, poll_s=0.05).wait())
            await asyncio.sleep(0.3)
            imds.tokens.clear()  # the session token expired
            await asyncio.sleep(0.3)
            imds.notice = {"action": "stop", "time": "t"}
            await asyncio.wait_for(task, 5)
            return imds
        finally:
            await runner.cleanup()

    assert asyncio.run(scenario()).puts >= 2


def test_gcp_preempted_with_wait_for_change():
    async def scenario() -> tuple[str, float, GceMetadata]:
        md = GceMetadata()
        runner, url = await serve(md.app)
        try:
            task = asyncio.create_task(GcpNotice(url, hang_s=30).wait())
            await asyncio.sleep(0.5)
            assert not task.done()
            md.preempt()
            t0 = time.monotonic()
            reason = await asyncio.wait_for(task, 5)
            return reason, time.monotonic() - t0, md
        finally:
            await runner.cleanup()

    reason, lag, md = asyncio.run(scenario())
    assert reason == "gcp-preempted" and lag < 0.5
    # a plain read, then ONE hanging read armed with its ETag (not a polling loop)
    assert md.requests[0] == {}
    assert md.requests[1:] == [{"wait_for_change": "true", "timeout_sec": "30", "last_etag": "1"}]


def test_gcp_already_preempted_returns_at_once():
    async def scenario() -> str:
        md = GceMetadata()
        md.preempt()
        runner, url = await serve(md.app)
        try:
            return await asyncio.wait_for(GcpNotice(url).wait(), 3)
        finally:
            await runner.cleanup()

    assert asyncio.run(scenario()) == "gcp-preempted"


@pytest.mark.parametrize("kind", ["aws", "gcp"])
def test_an_unreachable_metadata_server_never_fakes_a_notice(kind):
    async def scenario() -> bool:
        url = "http://127.0.0.1:9"  # discard port: connection refused
        w = AwsNotice(url, poll_s=0.05) if kind == "aws" else GcpNotice(url, retry_s=0.05)
        task = asyncio.create_task(w.wait())
        await asyncio.sleep(0.5)
        done = task.done()
        task.cancel()
        return done

    assert asyncio.run(scenario()) is False


def test_watcher_from_env(tmp_path: Path):
    """RLBOOST_NOTICE names a notice source (a cloud record's `notice`), never a cloud."""
    w = watcher_from_env({"RLBOOST_NOTICE": "ec2-imds"})
    assert isinstance(w, AwsNotice) and w.base == "http://169.254.169.254"
    w = watcher_from_env({"RLBOOST_NOTICE": "gce-metadata", "RLBOOST_METADATA_URL": "http://127.0.0.1:1"})
    assert isinstance(w, GcpNotice) and w.base == "http://127.0.0.1:1"
    w = watcher_from_env({"RLBOOST_NOTICE_FILE": str(tmp_path / "n")})  # the local provider's default
    assert isinstance(w, FileNotice)
    w = watcher_from_env({"RLBOOST_NOTICE": "file", "RLBOOST_NOTICE_FILE": str(tmp_path / "n")})
    assert isinstance(w, FileNotice) and watcher_from_env({"RLBOOST_NOTICE": "file"}) is None
    assert watcher_from_env({}) is None and watcher_from_env({"RLBOOST_NOTICE": "azure"}) is None
    assert watcher_from_env({"RLBOOST_NOTICE": "aws"}) is None and watcher_from_env({"RLBOOST_NOTICE": "gcp"}) is None


def test_each_cloud_gets_the_watcher_its_record_names(tmp_path: Path):
    """A spot worker's boot environment names its cloud's notice source, and the worker watches it."""
    from rlboost.contracts.cloud_kinds import cloud_kind, cloud_names
    from rlboost.providers.base import InstanceKind, LaunchRequest, Owner, Role
    from rlboost.providers.bootstrap import node_env

    made = {"ec2-imds": AwsNotice, "gce-metadata": GcpNotice, "file": FileNotice, None: type(None)}
    for cloud in cloud_names():
        req = LaunchRequest("j-1-w001", Owner("j", 1, "u"), Role.WORKER, InstanceKind.SPOT, cloud, None, "A100", 1.0)
        env = node_env(req, port=1, from_workdir=False)
        w = watcher_from_env({**env, "RLBOOST_NOTICE_FILE": str(tmp_path / "n")} if cloud_kind(cloud).notice else env)
        assert isinstance(w, made[cloud_kind(cloud).notice]), cloud
    owner = Owner("j", 1, "u")
    trainer = LaunchRequest("j-1-trainer", owner, Role.TRAINER, InstanceKind.ON_DEMAND, "aws", None, "A100", 1.0)
    assert "RLBOOST_NOTICE" not in node_env(trainer, port=1, from_workdir=False)  # an on-demand trainer watches none
