"""`envs:`, `launch --env`, `file_mounts:` and `workdir:`: the job file's checks, what each provider
makes of them (a real local instance process, SkyPilot's own task schema), and secret values kept out
of every record (a failing SkyPilot launch whose error echoes the task)."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

import tests.sky_fake  # noqa: F401  (offline SkyPilot first)
from rlboost.cli.job_envs import (
    SECRET_ENVS_FILE,
    Redactor,
    missing_values,
    parse_env_options,
    read_secret_envs,
    split_envs,
    write_secret_envs,
)
from rlboost.contracts.env_names import Env
from rlboost.contracts.mounts import find_mount, mounted_name, node_path
from rlboost.contracts.spec import SpecError, load_spec, parse_spec, spec_to_yaml
from rlboost.providers.base import InstanceKind, InstanceState, LaunchRequest, Owner, Role
from rlboost.providers.local import LocalProvider
from rlboost.providers.skypilot import SkyPilotProvider
from tests.cloud_worlds import ScriptedMarket, write_spec
from tests.conftest import run_cli, run_json
from tests.sky_fake import FakeSky, sky

SECRET = "hf_0123456789abcdefSECRET"


def job_file(tmp_path: Path, **extra) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"name": "env-job", "rollout": {"max_workers": 0}, **extra}))
    return path


def spec_error(tmp_path: Path, **extra) -> str:
    with pytest.raises(SpecError) as e:
        load_spec(job_file(tmp_path, **extra))
    return str(e.value)


# ---- the job file ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("envs", "said"),
    [
        ({"1BAD": "x"}, "envs: '1BAD' is not a valid environment variable name"),
        ({"MY-VAR": "x"}, "envs: 'MY-VAR' is not a valid environment variable name"),
        ({"RLBOOST_JOB_TOKEN": "x"}, "envs: 'RLBOOST_JOB_TOKEN': names starting with RLBOOST_ are reserved"),
        ({"rlboost_x": "x"}, "names starting with RLBOOST_ are reserved"),
        ({"PORT": 8080}, "envs.PORT: Input should be a valid string"),
    ],
)
def test_bad_envs_are_blamed_on_their_field(tmp_path, envs, said):
    assert said in spec_error(tmp_path, envs=envs)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"file_mounts": {"data": "."}}, "file_mounts: 'data': write the node path as ~/NAME or /NAME"),
        ({"file_mounts": {"~/a/../b": "."}}, "'..' is not allowed"),
        ({"file_mounts": {"~/.rlboost/x": "."}}, "~/.rlboost is where rlboost keeps its own files"),
        ({"file_mounts": {"~/d": "https://example.com/x"}}, "is not a supported bucket (s3://, gs://)"),
        ({"file_mounts": {"~/d": "s3://bucket/x"}}, "file_mounts.~/d: the local provider copies local files only"),
        ({"file_mounts": {"~/d": "missing-dir"}}, "file_mounts.~/d: missing-dir not found"),
        ({"workdir": "no-such-dir"}, "workdir: directory no-such-dir not found"),
    ],
)
def test_bad_file_mounts_and_workdir_are_blamed_on_their_field(tmp_path, extra, said):
    assert said in spec_error(tmp_path, **extra)


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_direct_cloud_providers_refuse_file_mounts_and_workdir(provider):
    base = {"name": "x-job", "provider": provider, "trainer": {"cloud": provider}, "rollout": {"max_workers": 0}}
    for extra in ({"file_mounts": {"~/d": "s3://b/x"}}, {"workdir": "/tmp"}):
        with pytest.raises(SpecError) as e:
            parse_spec({**base, **extra})
        key = next(iter(extra))
        assert f"{key}: provider {provider!r} has no file transfer; use provider: skypilot" in str(e.value)


def test_sources_resolve_against_the_job_file_and_buckets_pass_on_skypilot(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "src").mkdir()
    spec = load_spec(
        job_file(
            tmp_path,
            provider="skypilot",
            trainer={"cloud": "aws", "accelerators": "A100:1"},
            file_mounts={"~/data": "data", "/ckpt": "s3://bucket/ckpt"},
            workdir="src",
        )
    )
    assert spec.file_mounts == {"~/data": str(tmp_path / "data"), "/ckpt": "s3://bucket/ckpt"}
    assert spec.workdir == str(tmp_path / "src")
    assert parse_spec(yaml.safe_load(spec_to_yaml(spec))) == spec  # the saved copy validates again


def test_task_path_may_live_in_a_mount(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    extra = {
        "model": {"kind": "hf", "path": "org/model"},
        "task": {"name": "jsonl", "path": "~/data/train.jsonl"},
        "file_mounts": {"~/data": "data"},
    }
    spec = load_spec(job_file(tmp_path, **extra))
    assert str(spec.task.path) == "~/data/train.jsonl"  # a node path: the launcher checked its source
    wrong = {**extra, "task": {"name": "jsonl", "path": "~/data/other.jsonl"}}
    assert "task.path: ~/data/other.jsonl lies in file_mounts.~/data" in spec_error(tmp_path, **wrong)
    # on a node the mount is where the provider put it: under the instance directory (local provider)
    saved = tmp_path / "saved.yaml"
    saved.write_text(spec_to_yaml(spec))
    node = tmp_path / "instance"
    monkeypatch.setenv(Env.MOUNT_ROOT, str(node))
    with pytest.raises(SpecError, match="is not on this node"):
        load_spec(saved, on_node=True)
    (node / "data").mkdir(parents=True)
    (node / "data" / "train.jsonl").write_text("{}\n")
    assert load_spec(saved, on_node=True).task.path == node / "data" / "train.jsonl"


def hf_model_job(tmp_path: Path, mounts: dict, model_path: str = "~/models/qwen", **extra) -> dict:
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    return {
        "model": {"kind": "hf", "path": model_path},
        "task": {"name": "jsonl", "path": "d.jsonl"},
        "file_mounts": mounts,
        **extra,
    }


def test_model_path_may_live_in_a_mount_and_each_node_reads_its_own_copy(tmp_path, monkeypatch):
    from rlboost.rollout.scheduling import welcome_model
    from rlboost.worker.engines import model_on_this_node

    monkeypatch.delenv(Env.MOUNT_ROOT, raising=False)
    (tmp_path / "my-model").mkdir()
    extra = hf_model_job(tmp_path, {"~/models/qwen": "my-model"})
    assert "model.path: " + str(tmp_path / "my-model") + " has no config.json" in spec_error(tmp_path, **extra)
    (tmp_path / "my-model" / "config.json").write_text("{}")
    spec = load_spec(job_file(tmp_path, **extra))
    assert spec.model.path == "~/models/qwen"  # a node path: the launcher checked its source
    wrong = hf_model_job(tmp_path, {"~/models": "."}, "~/models/other")
    said = spec_error(tmp_path, **wrong)
    assert f"model.path: ~/models/other lies in file_mounts.~/models, but {tmp_path / 'other'} is not there" in said
    assert "fix model.path or the mount's source" in said
    # on the trainer node (the local provider: its instance directory) the mount is where it was copied
    saved = tmp_path / "saved.yaml"
    saved.write_text(spec_to_yaml(spec))
    trainer_dir, worker_dir = tmp_path / "trainer", tmp_path / "worker"
    monkeypatch.setenv(Env.MOUNT_ROOT, str(trainer_dir))
    with pytest.raises(SpecError, match=r"model.path: ~/models/qwen is not on this node .*file_mounts.~/models/qwen"):
        load_spec(saved, on_node=True)
    (trainer_dir / "models" / "qwen").mkdir(parents=True)
    with pytest.raises(SpecError, match=r"has no config\.json"):
        load_spec(saved, on_node=True)
    (trainer_dir / "models" / "qwen" / "config.json").write_text("{}")
    node_spec = load_spec(saved, on_node=True)
    assert node_spec.model.path == str(trainer_dir / "models" / "qwen")
    # workers are told the node path, and read it where their own node has the mount
    welcome = welcome_model(node_spec)
    assert welcome["path"] == "~/models/qwen" and welcome["path_in_mount"] is True
    monkeypatch.setenv(Env.MOUNT_ROOT, str(worker_dir))
    with pytest.raises(ValueError, match=r"model.path: ~/models/qwen is not on this node"):
        model_on_this_node(welcome)
    (worker_dir / "models" / "qwen").mkdir(parents=True)
    want = {**spec.model.model_dump(mode="json"), "path": str(worker_dir / "models" / "qwen")}
    assert model_on_this_node(welcome) == want
    # a model path outside every mount goes to workers as it is
    plain = node_spec.model_copy(update={"model": node_spec.model.model_copy(update={"path": "org/model"})})
    assert model_on_this_node(welcome_model(plain))["path"] == "org/model"


def test_model_and_eval_paths_in_a_bucket_are_not_checked_here(tmp_path):
    extra = hf_model_job(
        tmp_path,
        {"~/models/qwen": "s3://bucket/qwen", "~/evals": "gs://bucket/evals"},
        provider="skypilot",
        trainer={"cloud": "aws", "accelerators": "A100:1"},
    )
    extra["task"].update(eval_path="~/evals/test.parquet", eval_every=5)
    spec = load_spec(job_file(tmp_path, **extra))
    assert spec.model.path == "~/models/qwen" and str(spec.task.eval_path) == "~/evals/test.parquet"
    # outside every mount, a node-style path is a path on this machine, as before
    extra["file_mounts"] = {"~/evals": "gs://bucket/evals"}
    assert "model.path: directory ~/models/qwen not found" in spec_error(tmp_path, **extra)


def test_eval_path_may_live_in_a_mount(tmp_path, monkeypatch):
    monkeypatch.delenv(Env.MOUNT_ROOT, raising=False)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "test.jsonl").write_text('{"prompt": "2+2", "answer": "4"}\n')
    extra = hf_model_job(tmp_path, {"~/data": "data"}, "org/model")
    extra["task"].update(eval_path="~/data/test.jsonl", eval_every=5)
    spec = load_spec(job_file(tmp_path, **extra))
    assert str(spec.task.eval_path) == "~/data/test.jsonl"
    extra["task"]["eval_path"] = "~/data/nope.jsonl"
    assert "task.eval_path: ~/data/nope.jsonl lies in file_mounts.~/data" in spec_error(tmp_path, **extra)
    saved = tmp_path / "saved.yaml"
    saved.write_text(spec_to_yaml(spec))
    monkeypatch.setenv(Env.MOUNT_ROOT, str(tmp_path / "node"))
    with pytest.raises(SpecError, match=r"task\.eval_path: ~/data/test\.jsonl is not on this node"):
        load_spec(saved, on_node=True)


@pytest.mark.integration
def test_a_local_hf_job_reads_its_model_from_a_mount_on_every_node(tmp_path, monkeypatch):
    """model.path as a node path in file_mounts: the trainer and a spot worker each load their own
    instance's copy of the mount (the local provider copies it into each instance directory)."""
    from testkit.hf_fixtures import make_tiny_model

    make_tiny_model(tmp_path / "my-model")
    (tmp_path / "trace.json").write_text(json.dumps({"metadata": {"gap_seconds": 1}, "data": [3] * 900}))
    job = hf_model_job(
        tmp_path,
        {"~/models/qwen": "my-model"},
        name="mounted",
        algorithm={"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4, "steps": 2, "warm_start_steps": 0},
        rollout={
            "max_workers": 1,
            "min_workers": 1,
            "trainer_engine": False,  # the spot worker generates everything
            "candidates": [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.5, "on_demand_price": 3.5}],
        },
        local={"trace": "trace.json"},
    )
    job["model"]["dtype"] = "float32"
    job["task"]["instruction"] = None
    monkeypatch.setenv("RLBOOST_WAIT_ENGINES", "1")  # every step waits for the worker (inherited)
    home = tmp_path / "home"
    proc = run_cli("launch", str(job_file(tmp_path, **job)), home=home, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [j] = run_json("status", "mounted", home=home)["jobs"]
    assert j["status"] == "succeeded" and j["step"] == 2
    instances = Path(j["metrics_file"]).parent / "instances"
    [worker] = [d for d in instances.iterdir() if d.name.startswith("mounted-1-w")]
    log = (worker / "log").read_text()
    assert f"model.path ~/models/qwen: this node's copy at {worker / 'models' / 'qwen'}" in log, log
    for node in (worker, instances / "mounted-1-trainer"):
        assert (node / "models" / "qwen" / "config.json").is_file()


def test_find_mount_and_node_path(monkeypatch):
    mounts = {"~/data": "a", "~/data/big": "b", "/data": "c"}
    assert find_mount("~/data/big/x.jsonl", mounts) == ("~/data/big", Path("x.jsonl"))
    assert find_mount("~/data/x.jsonl", mounts) == ("~/data", Path("x.jsonl"))
    assert find_mount("/data/x", mounts) == ("/data", Path("x"))
    assert find_mount("~/database/x", mounts) is None
    assert find_mount("data/x", mounts) is None
    monkeypatch.delenv(Env.MOUNT_ROOT, raising=False)
    assert node_path("~/data/x") == Path.home() / "data" / "x"
    monkeypatch.setenv(Env.MOUNT_ROOT, "/r")
    assert node_path("~/data/x") == node_path("/data/x") == Path("/r/data/x")
    # and back: the name a job file gives a path that this node has in a mount (the deepest wins)
    assert mounted_name("/r/data/big/x", mounts) == "~/data/big/x"
    assert mounted_name("/r/data/big", mounts) == "~/data/big"
    assert mounted_name("/r/database/x", mounts) is None and mounted_name("/elsewhere", mounts) is None


# ---- --env and the secret file ----------------------------------------------------------------
def test_env_options_take_values_from_the_caller_or_the_command_line():
    got = parse_env_options(["HF_TOKEN", "WANDB_MODE=offline", "EMPTY="], {"HF_TOKEN": SECRET})
    assert got == {"HF_TOKEN": SECRET, "WANDB_MODE": "offline", "EMPTY": ""}
    with pytest.raises(SpecError, match="--env HF_TOKEN: HF_TOKEN is not set in your environment"):
        parse_env_options(["HF_TOKEN"], {})
    with pytest.raises(SpecError, match=r"--env RLBOOST_X: .*reserved"):
        parse_env_options(["RLBOOST_X=1"], {})
    with pytest.raises(SpecError, match="--env A B: 'A B' is not a valid"):
        parse_env_options(["A B=1"], {})


def test_a_variable_given_twice_is_an_error_naming_it():
    for items in (["HF_TOKEN=1", "HF_TOKEN=2"], ["HF_TOKEN", "HF_TOKEN"], ["HF_TOKEN", "HF_TOKEN=2"]):
        with pytest.raises(SpecError, match="--env HF_TOKEN: given more than once; pass each variable once"):
            parse_env_options(items, {"HF_TOKEN": SECRET})


def test_env_values_are_moved_out_of_a_launch_command_line():
    from rlboost.cli.argv_envs import without_values

    args = ["launch", "job.yaml", "--env", f"HF_TOKEN={SECRET}", "--env=EMPTY=", "--env", "FROM_ENV", "-d"]
    assert without_values(args) == (
        ["launch", "job.yaml", "--env", "HF_TOKEN", "--env", "EMPTY", "--env", "FROM_ENV", "-d"],
        {"HF_TOKEN": SECRET, "EMPTY": ""},
    )
    assert without_values(["launch", "job.yaml", "--env", "FROM_ENV"]) is None  # nothing to move
    assert without_values(["status", "--env", "A=1"]) is None  # launch only
    # a name given twice stays as it is: the CLI then names the duplicate
    assert without_values(["launch", "j.yaml", "--env", "A=1", "--env", "A=2"]) is None


def test_secret_values_live_in_a_private_file_and_a_null_needs_one(tmp_path):
    spec = parse_spec(
        {"name": "x-job", "rollout": {"max_workers": 0}, "envs": {"PLAIN": "shown", "HF_TOKEN": None, "OVER": "file"}}
    )
    assert missing_values(spec, {}) == [
        "envs.HF_TOKEN: no value (null in the job file); pass --env HF_TOKEN to take it from your environment, "
        "or --env HF_TOKEN=VALUE"
    ]
    write_secret_envs(tmp_path, {"HF_TOKEN": SECRET, "OVER": "from-cli"})
    assert stat.S_IMODE((tmp_path / SECRET_ENVS_FILE).stat().st_mode) == 0o600
    assert read_secret_envs(tmp_path) == {"HF_TOKEN": SECRET, "OVER": "from-cli"}
    assert split_envs(spec, tmp_path) == ({"PLAIN": "shown"}, {"HF_TOKEN": SECRET, "OVER": "from-cli"})


def test_redactor_scrubs_values_longest_first():
    r = Redactor({"A": SECRET, "B": SECRET[:10], "TINY": "ab"})
    assert r(f"boom {SECRET} and {SECRET[:10]} ab") == "boom <A redacted> and <B redacted> ab"
    assert r(None) is None


def test_launch_names_the_missing_or_bad_env(tmp_path):
    home = tmp_path / "home"
    job = job_file(tmp_path, envs={"HF_TOKEN": None})
    r = run_cli("launch", str(job), home=home, timeout=60)
    assert r.returncode == 2 and "envs.HF_TOKEN: no value (null in the job file); pass --env HF_TOKEN" in r.stderr
    r1 = run_cli("launch", str(job), "--env", "RLBOOST_TEST_UNSET_VAR_X", home=home, timeout=60)
    assert r1.returncode == 2 and "reserved" in r1.stderr
    r1 = run_cli("launch", str(job), "--env", "ENVS_TEST_UNSET_VAR", home=home, timeout=60)
    assert r1.returncode == 2 and "--env ENVS_TEST_UNSET_VAR: ENVS_TEST_UNSET_VAR is not set" in r1.stderr
    r2 = run_cli("launch", str(job), "--env", "9X=1", home=home, timeout=60)
    assert r2.returncode == 2 and "--env 9X: '9X' is not a valid environment variable name" in r2.stderr
    r3 = run_cli("launch", "--resume", "env-job", "--env", "A=1", home=home, timeout=60)
    assert r3.returncode == 2 and "--env applies to a new launch" in r3.stderr
    r4 = run_cli("launch", str(job), "--env", "HF_TOKEN=1", "--env", f"HF_TOKEN={SECRET}", home=home, timeout=60)
    assert r4.returncode == 2 and "--env HF_TOKEN: given more than once" in r4.stderr, r4.stderr
    assert SECRET not in r4.stdout + r4.stderr
    assert SECRET not in r.stdout + r.stderr


# ---- the local provider: a real instance process --------------------------------------------
def test_local_instances_get_the_envs_and_copies_of_the_mounts(tmp_path):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "a.txt").write_text("A")
    (tmp_path / "one.txt").write_text("ONE")
    work = tmp_path / "work"
    work.mkdir()
    (work / "w.txt").write_text("W")
    probe = (
        "import json, os, pathlib; "
        "d = pathlib.Path(os.environ['RLBOOST_MOUNT_ROOT']); "
        "json.dump({'env': {k: os.environ.get(k) for k in ('PLAIN', 'HF_TOKEN', 'RLBOOST_JOB_TOKEN')}, "
        "'cwd': os.getcwd(), 'a': (d / 'data/sub/a.txt').read_text(), 'one': (d / 'etc/one.txt').read_text(), "
        "'w': pathlib.Path('w.txt').read_text()}, open(d / 'probe.json', 'w'))"
    )
    prov = LocalProvider(tmp_path / "run", ScriptedMarket(), term_grace_s=1.0)
    req = LaunchRequest(
        instance_id="env-job-1-trainer",
        owner=Owner("env-job", 1, "uid-env-job"),
        role=Role.TRAINER,
        kind=InstanceKind.ON_DEMAND,
        cloud="local",
        region=None,
        accelerator=None,
        hourly_price=1.0,
        env={"RLBOOST_JOB_TOKEN": "tok"},
        command=[sys.executable, "-c", probe],
        user_envs={"PLAIN": "shown"},
        user_secrets={"HF_TOKEN": SECRET},
        file_mounts={"~/data": str(data), "/etc/one.txt": str(tmp_path / "one.txt")},
        workdir=str(work),
    )
    prov.launch(req)
    idir = tmp_path / "run" / "instances" / req.instance_id
    deadline = time.monotonic() + 60
    events: list = []
    while not any(e.state is InstanceState.EXITED for e in events):
        assert time.monotonic() < deadline, (events, (idir / "log").read_text())
        events += prov.poll()
        time.sleep(0.05)
    assert "exit code 0" in events[-1].detail, (idir / "log").read_text()
    got = json.loads((idir / "probe.json").read_text())
    assert got["env"] == {"PLAIN": "shown", "HF_TOKEN": SECRET, "RLBOOST_JOB_TOKEN": "tok"}
    assert got["cwd"] == str(idir / "workdir") and got["w"] == "W"
    assert got["a"] == "A" and got["one"] == "ONE"


# ---- SkyPilot: the task ------------------------------------------------------------------------
def sky_req(iid: str, role: Role = Role.WORKER, **extra) -> LaunchRequest:
    trainer = role is Role.TRAINER
    return LaunchRequest(
        instance_id=iid,
        owner=Owner("demo", 1, "uid-demo"),
        role=role,
        kind=InstanceKind.ON_DEMAND if trainer else InstanceKind.SPOT,
        cloud="aws",
        region="us-east-1",
        accelerator="A100:8" if trainer else "V100",
        hourly_price=1.0,
        env={"RLBOOST_JOB_TOKEN": "s3cret-token", "RLBOOST_ENGINE": "torch", "RLBOOST_WORKER_ID": iid},
        user_envs={"PLAIN": "shown"},
        user_secrets={"HF_TOKEN": SECRET},
        **extra,
    )


@pytest.fixture
def sky_prov(tmp_path):
    fake = FakeSky()
    run = tmp_path / "run"
    write_spec(run, "demo")
    p = SkyPilotProvider(run, sdk=fake, sync_workdir=True)
    yield p, fake
    p.close()


def test_skypilot_tasks_carry_envs_secrets_mounts_and_workdir(sky_prov, tmp_path):
    from sky.utils import common_utils, schemas

    prov, fake = sky_prov
    (tmp_path / "data").mkdir()
    (tmp_path / "src").mkdir()
    mounts = {"~/data": str(tmp_path / "data"), "/ckpt": "s3://bucket/ckpt", "~/gs": "gs://bucket/x"}
    prov.launch(sky_req("demo-1-trainer", Role.TRAINER, file_mounts=mounts, workdir=str(tmp_path / "src")))
    prov.launch(sky_req("demo-1-w001", file_mounts=mounts))
    calls = {c[1][0]: c[1][1] for c in fake.calls if c[0] == "launch"}
    trainer, worker = calls["demo-1-trainer"], calls["demo-1-w001"]
    for cfg in (trainer, worker):
        common_utils.validate_schema(cfg, schemas.get_task_schema(), "Invalid task YAML: ")
        assert cfg["envs"]["PLAIN"] == "shown" and "HF_TOKEN" not in cfg["envs"]
        assert cfg["secrets"] == {"RLBOOST_JOB_TOKEN": "s3cret-token", "HF_TOKEN": SECRET}
        assert {k: cfg["file_mounts"][k] for k in mounts} == mounts
    assert "~/.rlboost/spec.yaml" in trainer["file_mounts"]  # rlboost's own mount stays
    # the job's workdir wins over rlboost's source checkout, and rlboost then comes from a package
    assert trainer["workdir"] == str(tmp_path / "src") and not trainer["envs"]["RLBOOST_PIP_SPEC"].startswith(".")
    assert worker["workdir"] != str(tmp_path / "src") and worker["envs"]["RLBOOST_PIP_SPEC"].startswith(".")
    for iid in calls:
        assert SECRET not in prov.tasks[iid] and "s3cret-token" not in prov.tasks[iid]
        assert yaml.safe_load(prov.tasks[iid])["secrets"]["HF_TOKEN"] == "<redacted>"


class EchoingSky(FakeSky):
    """A SkyPilot whose launch fails with an error that quotes the task it was given, secrets and all."""

    def launch(self, task, cluster_name=None, **kw):
        full = task.to_yaml_config()
        cfg = yaml.safe_load(full["_user_specified_yaml"]) if full.get("_user_specified_yaml") else full

        def run():
            raise sky.exceptions.ResourcesUnavailableError(f"no luck provisioning {cfg}")

        return self._request(run)


def sky_controller_that_fails_to_launch(tmp_path: Path, store, name: str, out: io.StringIO, envs: dict | None = None):
    """A Controller of a SkyPilot job whose trainer launch fails (EchoingSky), quick to poll and tear down:
    (controller, provider, job id). The job's secret values, if it has any, are SECRET."""
    from rich.console import Console

    from rlboost.cli.controller import Controller
    from rlboost.providers.prices import CloudPrices
    from rlboost.providers.pricing import spot_offers, trainer_offer

    raw: dict = {
        "name": name,
        "provider": "skypilot",
        "trainer": {"cloud": "aws", "region": "us-east-1", "accelerators": "A100:8", "max_restarts": 1},
        "rollout": {"max_workers": 0},
    }
    if envs:
        raw["envs"] = envs
    spec = parse_spec(raw)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.yaml").write_text(spec_to_yaml(spec))
    if envs:
        write_secret_envs(run_dir, dict.fromkeys(envs, SECRET))
    job_id = store.create_job(spec.name, spec_to_yaml(spec), spec.provider)
    provider = SkyPilotProvider(run_dir, sdk=EchoingSky(), status_every_s=0.1, redown_after_s=0.1)
    prices = CloudPrices()
    ctl = Controller(
        spec=spec,
        store=store,
        job_id=job_id,
        run_dir=run_dir,
        provider=provider,
        token="tok",
        trainer_offer=trainer_offer(spec, prices),
        spot_offers=spot_offers(spec, prices),
        console=Console(file=out),
        poll_s=0.05,
        teardown_wait_s=5.0,
    )
    return ctl, provider, job_id


def test_a_failing_launch_records_no_secret(tmp_path):
    from rlboost.cli.state import StateStore

    store = StateStore(tmp_path / "state.db")
    out = io.StringIO()
    ctl, provider, job_id = sky_controller_that_fails_to_launch(tmp_path, store, "sky-secret", out, {"HF_TOKEN": None})
    try:
        assert ctl.run() == "failed"
    finally:
        provider.close()
    job = store.job_by_id(job_id)
    assert "no luck provisioning" in (job.error or "") and "<HF_TOKEN redacted>" in (job.error or "")
    details = [i.detail for i in store.instances(job_id)] + [e.detail for e in store.events(job_id)]
    assert any("<HF_TOKEN redacted>" in (d or "") for d in details), details
    assert not any(SECRET in (d or "") for d in details)
    assert SECRET not in out.getvalue()
    store.close()
    for path in tmp_path.rglob("state.db*"):
        assert SECRET.encode() not in path.read_bytes(), path
    assert os.environ.get("HF_TOKEN") != SECRET


def test_resume_refuses_a_job_whose_secret_values_are_gone(tmp_path):
    from rlboost.cli.state import StateStore

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    spec = parse_spec({"name": "env-job", "rollout": {"max_workers": 0}, "envs": {"HF_TOKEN": None}})
    with StateStore(home / "state.db") as store:
        job_id = store.create_job(spec.name, spec_to_yaml(spec), spec.provider)
        store.update_job(job_id, status="failed")
    run_dir = home / "jobs" / f"env-job-{job_id}"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(spec_to_yaml(spec))
    (run_dir / "token").write_text("tok")
    r = run_cli("launch", "--resume", "env-job", home=home, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"cannot be resumed: {SECRET_ENVS_FILE} in {run_dir} lacks a value" in " ".join(r.stderr.split())
    assert "envs.HF_TOKEN: no value" in r.stderr


def test_direct_cloud_boot_scripts_export_plain_envs_and_refuse_secrets(tmp_path):
    """AWS user-data and GCP startup-script metadata are readable by anyone allowed to describe the
    instance: a request that would put the job token or a secret value there is refused, by name and
    without the value; a node enrols for them (tests/test_aws.py, test_gcp.py: what the controller asks)."""
    from rlboost.providers.base import ProviderError
    from rlboost.providers.bootstrap import boot_script

    write_spec(tmp_path, "demo")
    with pytest.raises(ProviderError, match="refusing to put HF_TOKEN, RLBOOST_JOB_TOKEN into boot data") as e:
        boot_script(sky_req("demo-1-w001"), tmp_path)
    assert SECRET not in str(e.value) and "s3cret-token" not in str(e.value)
    req = sky_req("demo-1-w001")
    enrolling = replace(req, user_secrets={}, env={**req.env, "RLBOOST_JOB_TOKEN": "", "RLBOOST_ENROL": "c"})
    script = boot_script(enrolling, tmp_path)
    assert "export PLAIN=shown" in script and "export RLBOOST_ENROL=c" in script
    assert "HF_TOKEN" not in script and "RLBOOST_JOB_TOKEN" not in script


def test_a_failing_teardown_still_records_the_jobs_end(tmp_path, monkeypatch):
    """Teardown that raises (a provider error, a store interrupted mid-write) must not skip recording
    how the job ended: a node controller's launcher waits for exactly that record."""
    from rlboost.cli.state import StateStore

    store = StateStore(tmp_path / "state.db")
    ctl, provider, job_id = sky_controller_that_fails_to_launch(tmp_path, store, "sky-teardown", io.StringIO())

    def exploding_teardown() -> None:
        raise RuntimeError("cannot start a transaction within a transaction")

    monkeypatch.setattr(ctl, "teardown", exploding_teardown)
    try:
        assert ctl.run() == "failed"
    finally:
        provider.close()
    job = store.job_by_id(job_id)
    assert job.status == "failed" and job.ended_at is not None
    assert "no luck provisioning" in (job.error or "") and "teardown failed" in (job.error or "")
    assert "teardown-failed" in [e.type for e in store.events(job_id)]
    store.close()
