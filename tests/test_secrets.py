"""The job token never leaks: not into the trainer's or workers' logs, `rlboost status --json`,
`rlboost cost-report --json`, `rlboost logs`, nor any file under RLBOOST_HOME that group or others
can read (a real short job on the local provider)."""

from __future__ import annotations

import stat

import pytest
import yaml

from tests.conftest import run_cli

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
    for args in (("status", "--json"), ("cost-report", "--json"), ("status",), ("cost-report",),
                 ("logs", JOB["name"])):
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
