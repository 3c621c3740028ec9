"""The job token never leaks: not into the trainer's or workers' logs, `rlboost status --json`,
`rlboost cost-report --json`, `rlboost logs`, nor any file under RLBOOST_HOME that group or others
can read (a real short job on the local provider)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import rlboost_pids, run_cli

pytestmark = pytest.mark.integration

JOB = {
    "name": "secret-check",
    "algorithm": {"steps": 2, "prompts_per_step": 4, "group_size": 2, "warm_start_steps": 5, "max_new_tokens": 6},
    "trainer": {"cloud": "local", "hourly_price": 1.0},
    "rollout": {
        "max_workers": 1,
        "candidates": [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.0, "on_demand_price": 2.0}],
    },
    "local": {"time_scale": 60, "notice_fraction": 0.0},
}


def test_the_job_token_stays_secret(tmp_path):
    home = tmp_path / "home"
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(JOB))
    proc = run_cli("launch", str(job), home=home, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tokens = [p for p in home.rglob("token") if p.is_file()]
    assert len(tokens) == 1
    token = tokens[0].read_text().strip()
    assert len(token) >= 32
    assert stat.S_IMODE(tokens[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) & 0o077 == 0  # RLBOOST_HOME itself is private

    outputs = {"launch": proc.stdout + proc.stderr}
    for args in (("status", "--json"), ("cost-report", "--json"), ("status",), ("cost-report",), ("logs", JOB["name"])):
        r = run_cli(*args, home=home, timeout=60)
        outputs[" ".join(args)] = r.stdout + r.stderr
    for name, text in outputs.items():
        assert token not in text, f"the token is in `rlboost {name}`"

    logs = [p for p in home.rglob("*") if p.is_file() and (p.name.endswith(".log") or p.name == "log")]
    assert logs, "expected trainer and worker logs"
    for p in home.rglob("*"):
        if not p.is_file() or p == tokens[0]:
            continue
        data = p.read_bytes()
        if p in logs:
            assert token.encode() not in data, f"the token is in log {p}"
        if stat.S_IMODE(p.stat().st_mode) & 0o077:
            assert token.encode() not in data, f"{p} (mode {oct(p.stat().st_mode)}) holds the token"
            assert b"PRIVATE KEY" not in data, p


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(v.decode(errors="replace").partition("=")[::2] for v in raw.split(b"\0") if b"=" in v)


@pytest.mark.slow  # a whole job: .ci/run's slow tier
@pytest.mark.parametrize("controller", ["launcher", "trainer"])
def test_env_values_reach_every_node_and_only_the_secret_file_holds_them(tmp_path, controller):
    """`launch --env NAME` (from the caller's environment) and `--env NAME=VALUE` reach the trainer,
    its own engine and a spot worker, as do the job file's plain `envs:` and a copy of `file_mounts:`;
    afterwards no output and no file under RLBOOST_HOME holds a secret value but the 0600 secret file
    (and, with the controller on the trainer node, the node's copy of it)."""
    home = tmp_path / "home"
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "hello.txt").write_text("hi")
    job = {
        **JOB,
        "name": "env-secret",
        "algorithm": {**JOB["algorithm"], "steps": 100_000},  # runs until `down`: the check is never late
        "envs": {"PLAIN_SETTING": "visible", "HF_TOKEN_X": None},
        "file_mounts": {"~/data": "data"},
        "controller": controller,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    from_env, from_cli = "hf_" + secrets.token_hex(16), "key_" + secrets.token_hex(16)
    proc = run_cli(
        "launch",
        "-d",
        str(path),
        "--env",
        "HF_TOKEN_X",
        "--env",
        f"API_KEY_X={from_cli}",
        home=home,
        timeout=120,
        env={"HF_TOKEN_X": from_env},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outputs = {"launch": proc.stdout + proc.stderr}
    want = {"PLAIN_SETTING": "visible", "HF_TOKEN_X": from_env, "API_KEY_X": from_cli}
    seen: dict[str, dict[str, str]] = {}

    cmdlines: list[bytes] = []

    def every_kind_seen() -> bool:
        for pid in rlboost_pids(f"RLBOOST_RUN_DIR={home}"):
            env = _environ(pid)
            trainer = env.get("RLBOOST_ENROL_COMMITMENT") or env.get("RLBOOST_JOB_TOKEN")
            kind = env.get("RLBOOST_WORKER_KIND") or ("trainer" if trainer else "")
            if kind:
                seen[kind] = {k: env.get(k, "") for k in want}
                with contextlib.suppress(OSError):
                    cmdlines.append(Path(f"/proc/{pid}/cmdline").read_bytes())
        return {"trainer", "reserved", "spot"} <= set(seen)

    enrolled = "enrolled: job token and 2 secret variable(s) (API_KEY_X, HF_TOKEN_X)"

    def node_logs() -> dict[str, str]:
        return {p.parent.name: p.read_text() for p in home.rglob("instances/env-secret-1-*/log")}

    def both_enrolled() -> bool:
        logs = node_logs()
        return all(enrolled in logs.get(f"env-secret-1-{n}", "") for n in ("trainer", "w001"))

    try:
        deadline = time.monotonic() + 240
        # every node up, and the trainer and the spot worker enrolled (a worker's process is there,
        # with its environment, a while before it has dialled in and enrolled)
        while not (every_kind_seen() and both_enrolled()):
            assert time.monotonic() < deadline, f"not every node came up and enrolled: {sorted(seen)}"
            time.sleep(0.2)
        for args in (("status", "--json"), ("status", "env-secret"), ("logs", "env-secret")):
            r = run_cli(*args, home=home, timeout=60)
            outputs[" ".join(args) + " (running)"] = r.stdout + r.stderr
    finally:
        down = run_cli("down", "env-secret", home=home, timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    # the trainer and the spot worker enrolled for the `--env` values: they were never in their launch
    # environment (on a cloud, the boot data); the trainer's own engine inherits what it was given
    # (--env NAME from the caller's environment is inherited by every local process: no boot data here)
    assert seen["reserved"] == want
    for kind in ("trainer", "spot"):
        assert seen[kind] == {**want, "API_KEY_X": ""}, kind
    assert both_enrolled()
    assert cmdlines and not any(from_cli.encode() in c or from_env.encode() in c for c in cmdlines)

    run_dir = home / "jobs" / "env-secret-1"
    instances = sorted(p.parent for p in home.rglob("instances/env-secret-1-*/pid"))  # not node-logs/ copies
    assert len(instances) >= 2 and all((i / "data" / "hello.txt").read_text() == "hi" for i in instances)
    saved = (run_dir / "spec.yaml").read_text()
    assert "# --env HF_TOKEN_X" in saved and "# --env API_KEY_X" in saved
    assert yaml.safe_load(saved)["envs"] == {"PLAIN_SETTING": "visible", "HF_TOKEN_X": None, "API_KEY_X": None}
    secret_files = sorted(home.rglob("envs.secret.json"))
    assert run_dir / "envs.secret.json" in secret_files and len(secret_files) == (2 if controller == "trainer" else 1)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in secret_files)

    for args in (("status", "--json"), ("status", "env-secret"), ("cost-report", "--json"), ("logs", "env-secret")):
        r = run_cli(*args, home=home, timeout=60)
        outputs[" ".join(args)] = r.stdout + r.stderr
    for name, text in outputs.items():
        assert from_env not in text and from_cli not in text, f"a secret is in `rlboost {name}`"
    files = [p for p in home.rglob("*") if p.is_file() and p not in secret_files]
    assert any(p.name == "state.db" for p in files) and any(p.name == "controller.log" for p in files)
    for p in files:
        data = p.read_bytes()
        assert from_env.encode() not in data and from_cli.encode() not in data, f"a secret is in {p}"


def test_an_attached_launch_keeps_env_values_out_of_its_command_line(tmp_path):
    """`ps` and /proc/PID/cmdline are world-readable, and an attached `launch` is the job's controller
    for the whole job: a `--env NAME=VALUE` leaves its command line at start-up (same pid)."""
    home = tmp_path / "home"
    job = {**JOB, "name": "argv-secret", "algorithm": {**JOB["algorithm"], "steps": 100_000}}
    job["envs"] = {"API_KEY_X": None}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    value = "key_" + secrets.token_hex(16)
    env = {**os.environ, "RLBOOST_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlboost.cli.main", "launch", str(path), "--env", f"API_KEY_X={value}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not rlboost_pids(f"RLBOOST_RUN_DIR={home}"):  # its trainer is up: the controller runs
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert not any(value.encode() in arg for arg in cmdline), cmdline
        assert cmdline[-3:-1] == [b"--env", b"API_KEY_X"]  # the name stays: the same launch
        assert stat.S_IMODE(Path(f"/proc/{proc.pid}/environ").stat().st_mode) == 0o400  # where it went
    finally:
        down = run_cli("down", "argv-secret", home=home, timeout=180)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert down.returncode == 0, down.stdout + down.stderr
    run_dir = home / "jobs" / "argv-secret-1"
    assert json.loads((run_dir / "envs.secret.json").read_text()) == {"API_KEY_X": value}
