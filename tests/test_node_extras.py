"""What a job's nodes pip-install: the engine's extra plus what the job needs there (`hf` for a Hugging
Face model, `data` where the trainer reads parquet or a `datasets` directory), as the controller
derives it from the job file and each provider turns it into RLBOOST_PIP_SPEC (SkyPilot tasks for the
trainer and workers, the SkyPilot trainer node that runs the controller, AWS/GCP boot scripts)."""

from __future__ import annotations

import base64
import dataclasses

import pytest
import yaml

import tests.sky_fake  # noqa: F401  (offline SkyPilot first)
from rlboost.cli.node_extras import node_extras, node_setup_env
from rlboost.contracts.env_names import Env
from rlboost.contracts.spec import JobSpec, parse_spec, spec_to_yaml
from rlboost.providers.base import LaunchRequest, Role
from rlboost.providers.bootstrap import boot_script
from rlboost.providers.skypilot import SkyPilotProvider
from tests.sky_fake import FakeSky
from tests.test_job_envs import sky_req

HF = {"kind": "hf", "path": "org/model"}


def job(model: dict | None = None, task: dict | None = None, **extra) -> JobSpec:
    return parse_spec(
        {
            "name": "extras",
            "provider": "skypilot",
            "trainer": {"cloud": "aws", "region": "us-east-1", "accelerators": "A100:8"},
            "model": model or {"kind": "tiny-gpt"},
            "task": task or {"name": "reverse"},
            "rollout": {"max_workers": 0},
            **extra,
        },
        source="t",
    )


def extras(spec: JobSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return node_extras(spec, Role.TRAINER), node_extras(spec, Role.WORKER)


def test_the_job_decides_the_extras_of_each_role(tmp_path):
    (tmp_path / "ds").mkdir()  # a `datasets` directory (save_to_disk); only its being a directory counts here
    assert extras(job()) == ((), ())
    assert extras(job(HF, {"name": "jsonl", "path": "train.jsonl"})) == (("hf",), ("hf",))
    # only the trainer reads the dataset: workers get prompts as token ids
    assert extras(job(HF, {"name": "jsonl", "path": "train.parquet"})) == (("hf", "data"), ("hf",))
    held_out = {"name": "jsonl", "path": "train.jsonl", "eval_path": str(tmp_path / "ds"), "eval_every": 5}
    assert extras(job(HF, held_out)) == (("hf", "data"), ("hf",))


def test_datasets_in_mounts_are_judged_at_their_source_or_by_name_in_a_bucket(tmp_path):
    (tmp_path / "local-ds").mkdir()
    mounts = {"~/data": str(tmp_path), "~/b": "s3://bucket/d"}
    for path, want in (
        ("~/data/local-ds", ("hf", "data")),  # a directory at the mount's source
        ("~/b/train.parquet", ("hf", "data")),
        ("~/b/saved-ds", ("hf", "data")),  # no suffix in a bucket: a `datasets` directory
        ("~/b/train.jsonl", ("hf",)),
    ):
        spec = job(HF, {"name": "jsonl", "path": path}, file_mounts=mounts)
        assert node_extras(spec, Role.TRAINER) == want, path


def request(spec: JobSpec, role: Role, engine: str = "torch", *, boot: bool = False) -> LaunchRequest:
    """A launch request with the environment the controller gives it (rlboost/cli/controller.py);
    `boot`: for a node that boots from boot data (AWS, GCP), which enrols for the token and secrets."""
    base = sky_req("demo-1-trainer" if role is Role.TRAINER else "demo-1-w001", role)
    env = {"RLBOOST_ENGINE": engine, **node_setup_env(spec, role)}
    if boot:
        return dataclasses.replace(base, env=env, user_secrets={})
    return dataclasses.replace(base, env={"RLBOOST_JOB_TOKEN": "tok", **env})


@pytest.mark.parametrize(
    ("spec", "trainer", "worker", "controller_node"),
    [
        (job(), "local", "local", "local,skypilot"),
        (job(HF, {"name": "jsonl", "path": "t.jsonl"}), "local,hf", "local,hf", "local,hf,skypilot"),
        (
            job(HF, {"name": "jsonl", "path": "t.parquet"}),
            "local,hf,data",
            "local,hf",
            "local,hf,data,skypilot",
        ),
        (job(logging={"tensorboard": "tb"}), "local", "local", "local,skypilot,logging"),
        (
            job(HF, {"name": "jsonl", "path": "t.parquet"}, logging={"wandb": {"project": "p"}}),
            "local,hf,data",
            "local,hf",
            "local,hf,data,skypilot,logging",
        ),
    ],
    ids=["tiny-gpt-jsonl", "hf-jsonl", "hf-parquet", "tiny-gpt-logging", "hf-parquet-logging"],
)
def test_each_node_pip_installs_what_its_role_needs(tmp_path, monkeypatch, spec, trainer, worker, controller_node):
    monkeypatch.delenv("RLBOOST_PIP_SPEC", raising=False)  # a user's override would win over all of this
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.yaml").write_text(spec_to_yaml(spec))
    prov = SkyPilotProvider(run, sdk=FakeSky(), sync_workdir=True)
    try:
        t = prov.task_config(request(spec, Role.TRAINER))["envs"]["RLBOOST_PIP_SPEC"]
        w = prov.task_config(request(spec, Role.WORKER))["envs"]["RLBOOST_PIP_SPEC"]
        node = prov.node_task_config(request(spec, Role.TRAINER), job_id=1, resume=False)
    finally:
        prov.close()
    assert (t, w) == (f".[{trainer}]", f".[{worker}]")
    assert node["envs"]["RLBOOST_PIP_SPEC"] == f".[{controller_node}]"
    # AWS and GCP nodes boot from the same environment (user-data / startup-script)
    for role, want in ((Role.TRAINER, trainer), (Role.WORKER, worker)):
        script = boot_script(request(spec, role, boot=True), run)
        assert f"export RLBOOST_PIP_SPEC='rlboost[{want}]=={_version()}'" in script


def test_the_vllm_engine_keeps_its_extra_and_a_user_override_wins(tmp_path, monkeypatch):
    monkeypatch.delenv("RLBOOST_PIP_SPEC", raising=False)
    spec = job(HF, {"name": "jsonl", "path": "t.parquet"})
    script = boot_script(request(spec, Role.WORKER, engine="vllm", boot=True), tmp_path)
    assert f"export RLBOOST_PIP_SPEC='rlboost[vllm,hf]=={_version()}'" in script
    monkeypatch.setenv("RLBOOST_PIP_SPEC", "rlboost @ git+https://example.com/fork")
    (tmp_path / "spec.yaml").write_text(spec_to_yaml(spec))
    decoded = boot_script(request(spec, Role.TRAINER, boot=True), tmp_path)
    assert "export RLBOOST_PIP_SPEC='rlboost @ git+https://example.com/fork'" in decoded
    b64 = next(line for line in decoded.splitlines() if "RLBOOST_SPEC_B64" in line).split("=", 1)[1].strip("'")
    assert yaml.safe_load(base64.b64decode(b64))["model"]["kind"] == "hf"  # the node reads the same job


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rlboost")
    except PackageNotFoundError:
        return "0.1.0"


SETUP = ["echo first >>\"$HOME/ran\"", "echo \"venv=$VIRTUAL_ENV\" >>\"$HOME/ran\""]


def _setup_block(template: str) -> str:
    """The shell lines of a template that run the job's `setup:` (from its `if` to its `fi`)."""
    lines = template.splitlines()
    start = next(i for i, ln in enumerate(lines) if "RLBOOST_SETUP_B64:-" in ln)
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "fi")
    return "\n".join(ln.strip() for ln in lines[start : end + 1])


@pytest.mark.parametrize("name", ["worker.sky.yaml", "trainer.sky.yaml", "node.sky.yaml", "node_boot.sh"])
def test_every_node_template_runs_the_jobs_setup_in_rlboosts_venv_and_stops_on_a_failure(tmp_path, name):
    import subprocess

    from rlboost.providers.bootstrap import template

    text = template(name)
    if name.endswith(".yaml"):
        text = yaml.safe_load(text)["setup"]
        assert text.index("pip install") < text.index("RLBOOST_SETUP_B64")  # rlboost first, then the job's
    block = _setup_block(text).replace("/opt/rlboost", str(tmp_path / "rlboost-venv"))
    block = block.replace("/var/lib", str(tmp_path))
    venv = tmp_path / "rlboost-venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "activate").write_text(f"export VIRTUAL_ENV={tmp_path / 'rlboost-venv'}\n")

    def run(commands: list[str]) -> subprocess.CompletedProcess:
        env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
        spec = job(setup=commands)
        env |= {k: v for k, v in node_setup_env(spec, Role.WORKER).items() if k == Env.SETUP_B64}
        return subprocess.run(["bash", "-e", "-c", block], env=env, capture_output=True, text=True)

    assert run(SETUP).returncode == 0
    assert (tmp_path / "ran").read_text() == f"first\nvenv={tmp_path / 'rlboost-venv'}\n"
    failed = run(["false", "echo after >>\"$HOME/ran\""])
    assert failed.returncode != 0 and "after" not in (tmp_path / "ran").read_text()  # stops at the failure
    (tmp_path / "ran").unlink()
    assert run([]).returncode == 0
    assert not (tmp_path / "ran").exists()  # no setup: nothing runs


def test_setup_reaches_every_node_as_the_job_wrote_it(tmp_path, monkeypatch):
    monkeypatch.delenv("RLBOOST_PIP_SPEC", raising=False)
    assert job(setup=SETUP).setup == "\n".join(SETUP)  # a list runs as one script
    assert job(setup="pip install mypkg\n").setup == "pip install mypkg\n"
    assert Env.SETUP_B64 not in node_setup_env(job(), Role.WORKER)
    spec = job(setup=SETUP)
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.yaml").write_text(spec_to_yaml(spec))
    want = base64.b64encode("\n".join(SETUP).encode()).decode()
    prov = SkyPilotProvider(run, sdk=FakeSky(), sync_workdir=True)
    try:
        for role in (Role.TRAINER, Role.WORKER):
            assert prov.task_config(request(spec, role))["envs"][Env.SETUP_B64] == want
        assert prov.node_task_config(request(spec, Role.TRAINER), job_id=1, resume=False)["envs"][Env.SETUP_B64] == want
    finally:
        prov.close()
    for role in (Role.TRAINER, Role.WORKER):  # AWS / GCP boot data (not secret: README says so)
        assert f"export {Env.SETUP_B64}={want}" in boot_script(request(spec, role, boot=True), run)
