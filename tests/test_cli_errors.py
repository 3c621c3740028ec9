"""Bad input: one clear line naming the problem and the fix, a non-zero exit, no half-created state."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from rlboost.cli.pids import controller_identity
from rlboost.cli.state import StateStore
from rlboost.trainer.server import build_app
from rlboost.weights.publisher import WeightPublisher
from rlboost.worker.agent import WorkerAgent, WorkerConfig
from tests.conftest import ROOT, run_cli
from tests.route_coordinator import idle_coordinator
from tests.test_job_yaml import billion_laughs


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


@pytest.mark.parametrize(
    "data, args, needle",
    [
        (billion_laughs(), [], "values with its aliases expanded"),
        ("name: deep\nalgorithm: {steps: " + "[" * 10_000 + "]" * 10_000 + "}\n", [], "nested more than 32 levels"),
        ("name: deep\nrollout: " + "{a: " * 10_000 + "1" + "}" * 10_000 + "\n", [], "nested more than 32 levels"),
        ("name: u16\n".encode("utf-16"), [], "UTF-16 (little-endian)"),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00\x00", [], "binary (NUL bytes"),
        ("name: ok\n", ["--set", "algorithm.steps=" + "[" * 10_000 + "]" * 10_000], "--set algorithm.steps: nested"),
    ],
    ids=["alias-bomb", "deep-list", "deep-mapping", "utf-16", "binary", "deep-set"],
)
def test_a_job_file_that_would_hang_or_crash_the_parser_is_one_line(tmp_path, home, data, args, needle):
    p = tmp_path / "job.yaml"
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    # the timeout is the check that it returns: before, the bomb ran on at 100% CPU (2.9 GB after 40 s)
    proc = run_cli("launch", "--dryrun", str(p), *args, home=home, timeout=20)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and len(proc.stderr) < 400, proc.stderr[:2000]


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
