"""The worker's environment as one typed record (rlboost/contracts/worker_env.py): what the controller and the
trainer write is what `python -m rlboost.worker` reads, and a bad environment is named before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlboost.contracts.worker_env import NAMES, REQUIRED, WorkerEnv, WorkerEnvError


def test_round_trip() -> None:
    env = WorkerEnv(trainer_url="https://h:1", token="t", worker_id="w1", kind="reserved", engine="vllm", region="eu")
    got = env.to_env()
    assert set(got) == set(NAMES.values())
    assert got["RLBOOST_CLOUD"] == "" and got["RLBOOST_WORKER_KIND"] == "reserved"
    assert WorkerEnv.from_env(got) == env


def test_missing_variables_are_named() -> None:
    with pytest.raises(WorkerEnvError) as e:
        WorkerEnv.from_env({"RLBOOST_JOB_TOKEN": "t", "RLBOOST_TRAINER_URL": ""})
    assert str(e.value).startswith("RLBOOST_TRAINER_URL, RLBOOST_WORKER_ID not set")
    assert {NAMES[k] for k in REQUIRED} == {"RLBOOST_TRAINER_URL", "RLBOOST_WORKER_ID"}
    with pytest.raises(WorkerEnvError, match="RLBOOST_JOB_TOKEN \\(or RLBOOST_ENROL\\) not set"):
        WorkerEnv.from_env({"RLBOOST_TRAINER_URL": "http://h:1", "RLBOOST_WORKER_ID": "w1"})


def test_a_spot_worker_boots_with_a_credential_instead_of_the_token() -> None:
    env = WorkerEnv(trainer_url="https://h:1", enrol="w1.123.ab.cd", worker_id="w1").to_env()
    assert env["RLBOOST_JOB_TOKEN"] == "" and env["RLBOOST_ENROL"] == "w1.123.ab.cd"
    got = WorkerEnv.from_env(env)
    assert got.token is None and got.enrol == "w1.123.ab.cd"


def test_bad_kind_is_named() -> None:
    env = {**WorkerEnv(trainer_url="http://h:1", token="t", worker_id="w").to_env(), "RLBOOST_WORKER_KIND": "gpu"}
    with pytest.raises(WorkerEnvError, match="RLBOOST_WORKER_KIND='gpu': must be spot or reserved"):
        WorkerEnv.from_env(env)


def test_worker_process_refuses_a_bad_environment() -> None:
    env = {"PATH": "/usr/bin:/bin", "RLBOOST_JOB_TOKEN": "t"}
    p = subprocess.run([sys.executable, "-m", "rlboost.worker"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "RLBOOST_TRAINER_URL, RLBOOST_WORKER_ID not set" in p.stderr
