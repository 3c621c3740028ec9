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
from rlboost.cli.node_extras import node_extras
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
    env = {"RLBOOST_ENGINE": engine, Env.EXTRAS: ",".join(node_extras(spec, role))}
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
