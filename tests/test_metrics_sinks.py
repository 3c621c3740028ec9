"""Metrics sinks (`logging:`; rlboost/cli/metrics_sinks.py): a real local job writes TensorBoard
scalars and an offline W&B run holding exactly what metrics.jsonl holds, never a secret's value; a
missing library is a job-file error; a sink that cannot start leaves the job and metrics.jsonl alone.

W&B never touches the network here: WANDB_MODE=offline, and the run is read back from its record log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlboost.cli.metrics_log import MetricsLog
from rlboost.cli.metrics_sinks import INSTALL_HINT, flat_numbers, open_sinks, sink_problems
from rlboost.contracts.spec import SpecError, parse_spec
from tests.conftest import ROOT, run_cli, run_json
from tests.test_metrics_log import rec as step_record

SECRET = "s3cret-value-for-sinks"
OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_API_KEY": ""}


def job(**extra) -> dict:
    return {"name": "sink", "rollout": {"max_workers": 0}, **extra}


# ---- the job file ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("logging", "message"),
    [
        ({"wandb": {}}, r"logging.wandb.project: Field required"),
        ({"wandb": {"project": "p", "mode": "cloud"}}, r"logging.wandb.mode: invalid value 'cloud'"),
        ({"wandb": {"project": "p", "team": "x"}}, r"logging.wandb.team: unknown key"),
        ({"mlflow": "x"}, r"logging.mlflow: unknown key"),
        ({"tensorboard": 3}, r"logging.tensorboard: "),
    ],
)
def test_logging_keys_are_checked(logging: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(job(logging=logging))


def test_a_missing_library_names_the_key_and_the_install(monkeypatch) -> None:
    spec = parse_spec(job(logging={"tensorboard": "tb", "wandb": {"project": "p"}}))
    assert sink_problems(spec) == []  # both installed (the dev extra)
    monkeypatch.setitem(sys.modules, "wandb", None)  # the import system's own "not importable"
    (problem,) = sink_problems(spec)
    assert problem.startswith("logging.wandb: needs the wandb package") and INSTALL_HINT in problem


def test_launch_refuses_a_sink_whose_library_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job(logging={"tensorboard": "tb"})))
    code = "import sys; sys.modules['tensorboard'] = None; from rlboost.cli.main import app; app()"
    proc = subprocess.run(
        [sys.executable, "-c", code, "launch", str(path), "--dryrun"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "RLBOOST_HOME": str(tmp_path / "home"), "COLUMNS": "200"},
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "logging.tensorboard: needs the tensorboard package" in out and "rlboost[logging]" in out


# ---- the sinks -----------------------------------------------------------------------------------
def test_numbers_by_name_nested_names_joined_with_a_slash() -> None:
    row = {"step": 3, "eval": {"pass@1": 0.5, "n": None}, "migrated": True, "note": "x", "reward": 0.25}
    assert flat_numbers(row) == {"step": 3, "eval/pass@1": 0.5, "reward": 0.25}


def test_a_sink_that_cannot_start_is_reported_and_the_job_keeps_its_jsonl(tmp_path: Path) -> None:
    (tmp_path / "tb").write_text("a file where the log directory should be")
    spec = parse_spec(job(logging={"tensorboard": "tb"}))
    failed: list[tuple[str, Exception]] = []
    sinks = open_sinks(spec, tmp_path, "sink-1", lambda name, err: failed.append((name, err)))
    assert sinks == [] and [name for name, _ in failed] == ["logging.tensorboard"]
    log = MetricsLog(tmp_path / "metrics.jsonl", sinks=sinks)
    log.write(step_record(1, reward=0.5), clock=1.0, dollars=0.0, preemptions=0)
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["reward"] == 0.5


def test_a_trainer_node_installs_the_logging_extra_when_the_job_logs(tmp_path: Path) -> None:
    from rlboost.contracts.spec import spec_to_yaml
    from rlboost.providers.skypilot import SkyPilotProvider
    from tests.sky_fake import FakeSky
    from tests.test_skypilot_node import node_request, sky_job

    pips = {}
    for name, extra in (("plain", {}), ("logs", {"logging": {"wandb": {"project": "p"}}})):
        run = tmp_path / name
        run.mkdir()
        (run / "spec.yaml").write_text(spec_to_yaml(parse_spec(sky_job(**extra), source="t")))
        prov = SkyPilotProvider(run, sdk=FakeSky(), sync_workdir=False)
        pips[name] = prov.node_task_config(node_request(), job_id=7, resume=False)["envs"]["RLBOOST_PIP_SPEC"]
        prov.close()
    assert "logging" not in pips["plain"] and "logging" in pips["logs"] and "skypilot" in pips["logs"]


# ---- a real local job ------------------------------------------------------------------------------
STEPS, EVERY = 4, 2


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sinks")
    spec = {
        "name": "sink",
        "algorithm": {"prompts_per_step": 8, "group_size": 2, "max_new_tokens": 8, "steps": STEPS, "seed": 1},
        "task": {"name": "reverse", "min_len": 3, "max_len": 4, "eval_every": EVERY, "eval_size": 8},
        "rollout": {"max_workers": 0},
        "envs": {"SINK_TOKEN": None},
        "logging": {"tensorboard": "tb", "wandb": {"project": "rlboost-sinks"}},
    }
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    home, wandb_dir = tmp / "home", tmp / "wandb-root"
    env = {**OFFLINE, "WANDB_DIR": str(wandb_dir)}
    proc = run_cli("launch", str(path), "--env", f"SINK_TOKEN={SECRET}", home=home, env=env, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [j] = run_json("status", "sink", home=home)["jobs"]
    metrics = Path(j["metrics_file"])
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return metrics.parent, wandb_dir, rows, j["id"]


@pytest.mark.integration
def test_tensorboard_holds_every_metrics_line_at_its_step(logged_run) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _, rows, _ = logged_run
    assert sum("eval/pass@1" in r for r in rows) >= 2 and sum("reward" in r for r in rows) == STEPS
    acc = EventAccumulator(str(run_dir / "tb"))  # relative to the run directory
    acc.Reload()
    expected: dict[str, list[tuple[int, float]]] = {}
    for row in rows:  # in the order written: an eval (step N) may come after step N + 1
        for tag, value in flat_numbers(row).items():
            if tag != "step":
                expected.setdefault(tag, []).append((row["step"], pytest.approx(value, rel=1e-6, abs=1e-6)))
    assert sorted(acc.Tags()["scalars"]) == sorted(expected)
    for tag, points in expected.items():
        assert [(e.step, e.value) for e in acc.Scalars(tag)] == points, tag  # float32, as TensorBoard keeps them


@pytest.mark.integration
def test_an_offline_wandb_run_holds_every_line_and_the_job_but_no_secret(logged_run) -> None:
    from tests.wandb_records import history, records, run_info

    run_dir, wandb_dir, rows, job_id = logged_run
    (offline,) = wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
    assert history(offline) == [flat_numbers(r) for r in rows]  # `step` included: the x-axis
    name, project, config = run_info(offline)
    assert (name, project) == (f"sink-{job_id}", "rlboost-sinks")
    assert config["algorithm"]["steps"] == STEPS and config["envs"] == ["SINK_TOKEN"]
    assert "exit" in [r.WhichOneof("record_type") for r in records(offline)]  # finished at the job's end
    written = [p for d in (wandb_dir, run_dir / "tb") for p in d.rglob("*") if p.is_file()]
    assert written and not [p for p in written if SECRET.encode() in p.read_bytes()]
