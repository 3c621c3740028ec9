"""Bad input: one clear line naming the problem and the fix, a non-zero exit, no half-created state."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from rlboost_cli.pids import controller_identity
from rlboost_cli.state import StateStore
from tests.conftest import ROOT, run_cli
from tests.route_coordinator import idle_coordinator
from trainer.server import build_app
from weights.publisher import WeightPublisher
from worker.agent import WorkerAgent, WorkerConfig


def job_count(home: Path) -> int:
    db = home / "state.db"
    if not db.exists():
        return 0
    return sqlite3.connect(db).execute("SELECT COUNT(*) FROM jobs").fetchone()[0]


def write(tmp: Path, job: dict) -> Path:
    p = tmp / "job.yaml"
    p.write_text(yaml.safe_dump(job))
    return p


@pytest.mark.parametrize(
    "job, needle",
    [
        ({"name": "bad", "algorithm": {"group_size": 0}}, "algorithm.group_size"),
        ({"name": "bad", "provider": "openstack"}, "provider: invalid value 'openstack'"),
        ({"name": "bad", "rollout": {"max_workers": 0}, "local": {"trace": "missing.csv"}}, "local.trace"),
        ({"name": "bad", "rolout": {}}, "rolout: unknown key"),
    ],
)
def test_bad_job_file_is_one_clear_error_and_creates_nothing(tmp_path, home, job, needle):
    proc = run_cli("launch", str(write(tmp_path, job)), home=home)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert job_count(home) == 0


def test_malformed_trace_file(tmp_path, home):
    (tmp_path / "t.csv").write_text("0,add,node1\nbanana\n")
    job = {"name": "bad", "rollout": {"max_workers": 0}, "local": {"trace": "t.csv"}}
    proc = run_cli("launch", str(write(tmp_path, job)), home=home)
    assert proc.returncode == 2 and "local.trace" in proc.stderr and "t.csv:2" in proc.stderr
    assert job_count(home) == 0


def test_price_cap_below_every_offer(tmp_path, home):
    job = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    job["rollout"]["max_hourly_price"] = 0.01
    proc = run_cli("launch", str(write(tmp_path, job)), home=home)
    assert proc.returncode == 2 and "max_hourly_price" in proc.stderr
    assert job_count(home) == 0


def test_second_launch_of_a_running_job_is_refused(tmp_path, home):
    store = StateStore(home / "state.db")
    jid = store.create_job("twice", "name: twice\n", "local")
    store.update_job(jid, status="running", **controller_identity())
    job = {"name": "twice", "rollout": {"max_workers": 0}}
    proc = run_cli("launch", str(write(tmp_path, job)), home=home)
    assert proc.returncode == 1
    assert "already running" in proc.stderr and f"rlboost down {jid}" in proc.stderr  # this run, by id
    assert job_count(home) == 1


@pytest.mark.parametrize("cmd", [["status", "nope"], ["down", "nope"], ["cost-report", "nope"], ["logs", "nope"]])
def test_unknown_job(home, cmd):
    proc = run_cli(*cmd, home=home)
    assert proc.returncode == 1
    assert "no job named 'nope'" in proc.stderr and "rlboost status" in proc.stderr


def test_dryrun_prints_plan_and_launches_nothing(home):
    proc = run_cli("launch", str(ROOT / "examples" / "local.yaml"), "--dryrun", home=home)
    assert proc.returncode == 0, proc.stderr
    assert "plan for job local-demo" in proc.stdout and "1.443" in proc.stdout
    assert job_count(home) == 0


def test_worker_with_wrong_token_is_refused():
    async def scenario() -> tuple[int, int]:
        coord = idle_coordinator()
        app = build_app("the-real-token", coord, WeightPublisher(), lambda *_: {})
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            agent = WorkerAgent(WorkerConfig(trainer_url=url, token="a-wrong-token", worker_id="w1",
                                             reconnect_deadline_s=2))
            code = await asyncio.wait_for(agent.run(), timeout=20)
            return code, len(coord.engines)
        finally:
            await runner.cleanup()

    code, engines = asyncio.run(scenario())
    assert code == 3  # a clear refusal, not a retry loop
    assert engines == 0
