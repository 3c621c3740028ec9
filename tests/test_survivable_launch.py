"""`launch` and `launch --dryrun` refuse what a launch cannot survive (issue 56), before anything is
created or paid for, each with a one-line error naming the job-file field and the fix: special files
as mount sources or datasets (/dev/zero filled the disk, /proc/self hung the copy, a FIFO blocks its
reader), a dataset that is not a data file, NUL bytes, environment values no exec takes, region labels
that are paths, and boot data over a cloud's limit (EC2 user-data 16 KB, GCP metadata 256 KB a value).

The corpus below is kept: each entry is a mutation of a valid job file that an adversary found (or
that is next to one), each refused with its field named. Real special files stand in: /dev/zero,
/proc/self, a FIFO and a bound unix socket made in tmp_path."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
import yaml

from rlboost.contracts import dataset_files
from rlboost.contracts.spec import SpecError, load_spec, parse_spec
from rlboost.contracts.spec.file_kinds import file_kind_problem
from rlboost.contracts.spec.text_limits import MAX_ENV_VALUE_BYTES, MAX_ENVS_BYTES, MAX_SETUP_BYTES, REGION_RE
from tests.conftest import ROOT

BASE = {"name": "corpus", "rollout": {"max_workers": 0}}
HF = {"model": {"kind": "hf", "path": "org/model"}, "task": {"name": "jsonl", "path": "{good}"}}


@pytest.fixture
def specials(tmp_path):
    """Placeholders of the corpus -> real files: a good dataset, a FIFO, a bound socket, a directory
    holding a FIFO, a directory linking into /proc, a binary file, a JSON array, a fake parquet."""
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "2+2", "answer": "4"}\n')
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(sock_path))
    nested = tmp_path / "data"
    nested.mkdir()
    (nested / "ok.txt").write_text("ok")
    os.mkfifo(nested / "pipe")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "me").symlink_to("/proc/self")
    binary = tmp_path / "blob.jsonl"
    binary.write_bytes(b"\xff\xfe\x00\x01" * 64)
    array = tmp_path / "array.jsonl"
    array.write_text('[{"prompt": "a", "answer": "b"}]\n')
    fake_parquet = tmp_path / "rows.parquet"
    fake_parquet.write_text("root:x:0:0:root:/root:/bin/bash\n")
    yield {
        "good": str(good),
        "fifo": str(fifo),
        "sock": str(sock_path),
        "nested": str(nested),
        "linked": str(linked),
        "binary": str(binary),
        "array": str(array),
        "fake_parquet": str(fake_parquet),
    }
    sock.close()


def _fill(node: object, files: dict[str, str]) -> object:
    if isinstance(node, str):
        return node.format(**files) if node.startswith("{") and node.endswith("}") else node
    if isinstance(node, dict):
        return {k: _fill(v, files) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill(v, files) for v in node]
    return node


def _merge(base: dict, change: dict) -> dict:
    out = dict(base)
    for k, v in change.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _job_file(tmp_path: Path, change: dict, files: dict[str, str]) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_fill(_merge(BASE, change), files)))  # NULs are written as "\0"
    return path


# (id, mutation of BASE, what the error must say: the field first)
CORPUS = [
    # ---- mount sources: only regular files and directories of them
    ("mount-dev-zero", {"file_mounts": {"~/z": "/dev/zero"}}, "file_mounts.~/z: /dev/zero is a character device"),
    ("mount-proc-self", {"file_mounts": {"~/p": "/proc/self"}}, "file_mounts.~/p: /proc/self is in /proc"),
    ("mount-sys", {"file_mounts": {"/s": "/sys/kernel"}}, "file_mounts./s: /sys/kernel is in /sys"),
    ("mount-fifo", {"file_mounts": {"~/f": "{fifo}"}}, "file_mounts.~/f: ", "named pipe (FIFO)"),
    ("mount-socket", {"file_mounts": {"~/s": "{sock}"}}, "file_mounts.~/s: ", "is a socket"),
    ("mount-dir-with-fifo", {"file_mounts": {"~/d": "{nested}"}}, "file_mounts.~/d: ", "pipe (in "),
    ("mount-dir-linking-proc", {"file_mounts": {"~/d": "{linked}"}}, "file_mounts.~/d: ", "is in /proc"),
    ("workdir-proc", {"workdir": "/proc/self"}, "workdir: /proc/self is in /proc"),
    ("workdir-dir-with-fifo", {"workdir": "{nested}"}, "workdir: ", "named pipe"),
    # ---- datasets: a regular file in a format rlboost reads
    ("task-dev-zero", _merge(HF, {"task": {"path": "/dev/zero"}}), "task.path: /dev/zero is a character device"),
    ("task-passwd", _merge(HF, {"task": {"path": "/etc/passwd"}}), "task.path: passwd: line 1 is not JSON", "parquet"),
    ("task-fifo", _merge(HF, {"task": {"path": "{fifo}"}}), "task.path: ", "named pipe"),
    ("task-socket", _merge(HF, {"task": {"path": "{sock}"}}), "task.path: ", "socket"),
    ("task-proc-file", _merge(HF, {"task": {"path": "/proc/self/status"}}), "task.path: /proc/self/status is in /proc"),
    ("task-proc-dir", _merge(HF, {"task": {"path": "/proc/self"}}), "task.path: /proc/self is in /proc"),
    ("task-binary", _merge(HF, {"task": {"path": "{binary}"}}), "task.path: blob.jsonl: line 1 is not", "JSON Lines"),
    ("task-json-array", _merge(HF, {"task": {"path": "{array}"}}), "task.path: array.jsonl: line 1 is a JSON list"),
    ("task-fake-parquet", _merge(HF, {"task": {"path": "{fake_parquet}"}}), "task.path: rows.parquet is not a parquet"),
    (
        "eval-dev-zero",
        _merge(HF, {"task": {"eval_every": 5, "eval_path": "/dev/zero"}}),
        "task.eval_path: /dev/zero is a character device",
    ),
    (
        "task-in-a-fifo-mount",
        _merge(HF, {"file_mounts": {"~/data": "{fifo}"}, "task": {"path": "~/data"}}),
        "file_mounts.~/data: ",
    ),
    ("model-proc", _merge(HF, {"model": {"path": "/proc/self"}}), "model.path: /proc/self is in /proc"),
    ("trace-proc", {"local": {"trace": "/proc/self/status"}}, "local.trace: /proc/self/status is in /proc"),
    ("catalog-dev", {"local": {"catalog": "/dev/null"}}, "local.catalog: file /dev/null not found"),
    # ---- NUL bytes, wherever they are: a path, an argv, an environment
    ("task-path-nul", _merge(HF, {"task": {"path": "a\0b.jsonl"}}), "task.path: holds a NUL byte"),
    ("model-id-nul", _merge(HF, {"model": {"path": "org/mo\0del"}}), "model.path: holds a NUL byte"),
    ("env-value-nul", {"envs": {"A": "x\0y"}}, "envs.A: holds a NUL byte"),
    ("mount-dest-nul", {"file_mounts": {"~/d\0x": "{good}"}}, "file_mounts: the key '~/d\\x00x' holds a NUL"),
    ("mount-source-nul", {"file_mounts": {"~/d": "/tmp/a\0b"}}, "file_mounts.~/d: holds a NUL byte"),
    ("setup-nul", {"setup": "echo a\0b"}, "setup: holds a NUL byte"),
    ("setup-list-nul", {"setup": ["echo a", "rm -rf \0"]}, "setup[1]: holds a NUL byte"),
    ("workdir-nul", {"workdir": "./\0"}, "workdir: holds a NUL byte"),
    ("trace-nul", {"local": {"trace": "x\0.csv"}}, "local.trace: holds a NUL byte"),
    ("reward-nul", {"task": {"reward": "mod\0:f"}}, "task.reward: holds a NUL byte"),
    ("region-nul", {"trainer": {"region": "us\0"}}, "trainer.region: holds a NUL byte"),
    ("name-nul", {"name": "ok\0"}, "name: holds a NUL byte"),
    # ---- what exec takes: one value, all of them, setup (one variable on every node)
    ("env-200k", {"envs": {"BIG": "x" * 200_000}}, "envs.BIG: its value is 200,000 bytes, over the 32,768"),
    ("envs-in-all", {"envs": {f"V{i}": "x" * 30_000 for i in range(5)}}, "envs: 150,015 bytes of variables in all"),
    ("setup-100k", {"setup": "echo x\n" * 15_000}, "setup: 105,000 bytes, over 65,536", "put the commands in a script"),
    # ---- region labels are names, not paths
    ("trainer-region-path", {"trainer": {"region": "../../etc"}}, "trainer.region: '../../etc' is not a region"),
    (
        "local-region-path",
        {
            "rollout": {
                "max_workers": 1,
                "candidates": [{"accelerator": "cpu", "clouds": ["local"], "regions": ["../../etc"]}],
            }
        },
        "rollout.candidates[0].regions: '../../etc' is not a region",
    ),
    ("region-dotdot", {"trainer": {"region": ".."}}, "trainer.region: '..' is not a region"),
    ("region-slash", {"trainer": {"region": "us-east-1/../x"}}, "trainer.region: "),
    ("region-empty", {"trainer": {"region": ""}}, "trainer.region: '' is not a region"),
    ("region-long", {"trainer": {"region": "a" * 65}}, "trainer.region: "),
]


@pytest.mark.parametrize("change, needles", [(c[1], c[2:]) for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_the_corpus_is_refused_naming_the_field(tmp_path, specials, change, needles):
    with pytest.raises(SpecError) as e:
        load_spec(_job_file(tmp_path, change, specials))
    msg = str(e.value)
    assert "Traceback" not in msg
    lines = [ln for ln in msg.splitlines() if not ln.endswith("invalid job file")]
    assert len(lines) == 1 and lines[0].startswith(needles[0]), msg  # one line, the field first
    for needle in needles[1:]:
        assert needle in msg, msg


def test_the_corpus_base_and_its_good_files_are_accepted(tmp_path, specials):
    """The mutations are refused for what they change: the same files with good values load."""
    good = [
        {},
        HF,
        {"file_mounts": {"~/d": str(tmp_path / "good.jsonl")}},
        {"envs": {"A": "x" * MAX_ENV_VALUE_BYTES}},
        {"setup": "echo x\n" * (MAX_SETUP_BYTES // 7)},
        {"trainer": {"region": "us-east-1"}},
    ]
    for change in good:
        load_spec(_job_file(tmp_path, change, specials))


def test_a_nul_anywhere_in_an_example_is_refused_naming_its_field():
    """Every string of every shipped example, and every mapping key, with a NUL put in: refused, its
    place named (no traceback from a path that reaches os.stat)."""
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        for where, mutated in _with_a_nul(raw):
            with pytest.raises(SpecError) as e:
                parse_spec(mutated)
            assert f"{where}: " in str(e.value) and "NUL" in str(e.value), (path.name, where, str(e.value))


def _with_a_nul(raw: object, at: str = ""):
    """(place, a copy of `raw` with a NUL in the string there) for every string of `raw`."""
    if isinstance(raw, str):
        yield at, raw + "\0"
    elif isinstance(raw, dict):
        for k, v in raw.items():
            for where, m in _with_a_nul(v, f"{at}.{k}" if at else str(k)):
                yield where, {**raw, k: m}
    elif isinstance(raw, list):
        for i, v in enumerate(raw):
            for where, m in _with_a_nul(v, f"{at}[{i}]"):
                yield where, [*raw[:i], m, *raw[i + 1 :]]


# ---- the checks one by one ---------------------------------------------------------------------
def test_file_kinds_are_told_by_stat_without_opening(tmp_path, specials):
    """A FIFO is refused without being opened (an open would block this test forever)."""
    assert stat.S_ISFIFO(os.stat(specials["fifo"]).st_mode)
    assert "named pipe (FIFO)" in (file_kind_problem(Path(specials["fifo"])) or "")
    assert "socket" in (file_kind_problem(Path(specials["sock"])) or "")
    assert "character device" in (file_kind_problem(Path("/dev/zero")) or "")
    assert "in /proc" in (file_kind_problem(Path("/proc/self")) or "")
    link = tmp_path / "to-good"
    link.symlink_to(specials["good"])
    assert file_kind_problem(link) is None  # a link to a regular file is that file
    assert file_kind_problem(Path(specials["nested"])) is None  # not walked unless asked
    assert "pipe" in (file_kind_problem(Path(specials["nested"]), walk=True) or "")
    clean = tmp_path / "clean"
    (clean / "sub").mkdir(parents=True)
    (clean / "sub" / "a.json").write_text("{}")
    assert file_kind_problem(clean, walk=True) is None


def test_a_jsonl_row_longer_than_the_sniff_is_judged_by_its_first_character(tmp_path):
    long_row = tmp_path / "long.jsonl"
    long_row.write_text('{"prompt": "' + "x" * (dataset_files.SNIFF_BYTES + 10) + '", "answer": "1"}\n')
    assert dataset_files.content_problem(long_row) is None
    long_text = tmp_path / "text.jsonl"
    long_text.write_text("x" * (dataset_files.SNIFF_BYTES + 10))
    assert "line 1 is not a JSON object" in (dataset_files.content_problem(long_text) or "")
    blank_first = tmp_path / "blank.jsonl"
    blank_first.write_text('\n\n{"prompt": "a", "answer": "b"}\n')
    assert dataset_files.content_problem(blank_first) is None


def test_env_bounds_sit_well_under_what_linux_takes():
    """MAX_ARG_STRLEN is 128 KiB a string; the bounds leave room for rlboost's own variables, and
    setup, base64'd into one variable, fits one string too. README states them."""
    assert MAX_ENV_VALUE_BYTES < MAX_ENVS_BYTES <= 128 * 1024
    assert MAX_SETUP_BYTES * 4 // 3 + 64 < 128 * 1024
    readme = (ROOT / "README.md").read_text()
    assert "32 KiB" in readme and "128 KiB" in readme and "64 KiB" in readme


@pytest.mark.parametrize("name", ["us-east-1", "us-east-1a", "us-central1", "us-central1-a", "europe-west4-b",
                                  "ap-southeast-2", "local", "zone_1", "eastus2"])  # fmt: skip
def test_real_region_and_zone_names_are_names(name):
    assert REGION_RE.fullmatch(name)
    parse_spec({**BASE, "trainer": {"region": name}})


# ---- boot data, per provider class -------------------------------------------------------------
def _cloud_spec(provider: str, cloud: str, region: str, **changes):
    return parse_spec(
        _merge(
            {
                "name": "boot",
                "provider": provider,
                "model": {"kind": "synthetic"},
                "trainer": {"cloud": cloud, "region": region, "accelerators": "A100:8"},
                "rollout": {"engine": "synthetic", "candidates": [{"accelerator": "V100" if cloud == "aws" else "A100",
                                                                   "clouds": [cloud], "regions": [region]}]},
            },
            changes,
        )
    )  # fmt: skip


def _offers(spec):
    """The job's offers from the shipped catalog (no live price call, whatever credentials are around)."""
    from rlboost.providers.prices import CloudPrices
    from rlboost.providers.pricing import spot_offers, trainer_offer

    prices = CloudPrices(use_skypilot=False)
    return trainer_offer(spec, prices), spot_offers(spec, prices)


def _boot_problems(spec) -> list[str]:
    from rlboost.cli.launch_requests import sample_requests
    from rlboost.contracts.spec import spec_to_yaml
    from rlboost.providers import provider_class

    requests = sample_requests(spec, *_offers(spec))
    return provider_class(spec.provider).boot_data_problems(requests, spec_to_yaml(spec))


def test_a_20kb_setup_is_over_ec2s_user_data_limit(home):
    problems = _boot_problems(_cloud_spec("aws", "aws", "us-east-1", setup="echo " + "x" * 20_000))
    assert len(problems) == 2, problems  # the trainer's and every worker's
    assert all(p.startswith("setup: the ") and "EC2 user-data" in p and "16,384" in p for p in problems), problems
    assert "shorten setup" in problems[0]
    assert _boot_problems(_cloud_spec("aws", "aws", "us-east-1", setup="pip install my-reward")) == []


def test_what_the_aws_provider_sends_is_what_was_checked(home, tmp_path):
    """The check measures boot_script's own text: the user-data run_instances gets."""
    from rlboost.cli.launch_requests import sample_requests
    from rlboost.contracts.spec import spec_to_yaml
    from rlboost.providers.bootstrap import boot_script, render_boot

    spec = _cloud_spec("aws", "aws", "us-east-1", envs={"A": "b"}, setup="echo hi")
    (tmp_path / "spec.yaml").write_text(spec_to_yaml(spec))
    for req in sample_requests(spec, *_offers(spec)):
        assert boot_script(req, tmp_path) == render_boot(req, spec_to_yaml(spec))


def test_gcp_metadata_is_checked_by_its_own_limit(home, monkeypatch):
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "example-project")
    envs = {f"V{i}": "x" * 30_000 for i in range(4)}
    over = _cloud_spec("gcp", "gcp", "us-central1", envs=envs, setup="echo x\n" * 9000)
    problems = _boot_problems(over)
    assert problems and problems[0].startswith("setup/envs: the trainer's startup-script metadata"), problems
    assert "262,144" in problems[0]
    # what is over EC2's limit is within GCP's
    assert _boot_problems(_cloud_spec("gcp", "gcp", "us-central1", setup="echo " + "x" * 20_000)) == []


def test_providers_without_boot_data_have_no_such_limit(home):
    from rlboost.providers import provider_class

    for name in ("local", "skypilot"):
        assert provider_class(name).boot_data_problems([], "") == []


# ---- through the CLI: refused with exit 2, one message, nothing recorded -----------------------
def _cloud_job_file(tmp_path: Path, example: str, **changes) -> Path:
    job = _merge(yaml.safe_load((ROOT / "examples" / "simulate" / example).read_text()), changes)
    job.pop("simulate", None)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_the_dryrun_refuses_a_user_data_over_16kb_before_anything(home, tmp_path):
    from tests.test_cloud_cli import cli, job_count

    path = _cloud_job_file(tmp_path, "aws-p3-v100.yaml", name="big-setup", provider="aws", setup="echo " + "x" * 20_000)
    r = cli("launch", str(path), "--dryrun", home=home)  # no credentials: a plan needs none
    assert r.returncode == 2, r.stdout + r.stderr
    assert "setup: the trainer's EC2 user-data would be" in r.stderr and "Traceback" not in r.stderr
    assert "plan for job" not in r.stdout and job_count(home) == 0


def test_a_launch_refuses_boot_data_over_the_limit_before_anything_is_recorded(home, tmp_path):
    """The launch itself (credentials found, --yes): refused before the job record or any instance."""
    from tests.test_cloud_cli import cli, creds, job_count

    big = {"name": "big-boot", "provider": "gcp", "setup": "echo x\n" * 9000}
    path = _cloud_job_file(tmp_path, "gcp-a100.yaml", envs={f"V{i}": "x" * 30_000 for i in range(4)}, **big)
    r = cli("launch", str(path), "--yes", home=home, env=creds(tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "setup/envs: the trainer's startup-script metadata would be" in r.stderr, r.stderr
    assert job_count(home) == 0


def test_the_dryrun_refuses_special_files_and_a_long_env_option(home, tmp_path):
    from tests.test_cloud_cli import cli

    local = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    for change, needle in [
        ({"file_mounts": {"~/z": "/dev/zero"}}, "file_mounts.~/z: /dev/zero is a character device"),
        ({"file_mounts": {"~/p": "/proc/self"}}, "file_mounts.~/p: /proc/self is in /proc"),
        ({"envs": {"A": "x\0"}}, "envs.A: holds a NUL byte"),
    ]:
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump({**local, **change}))
        r = cli("launch", str(path), "--dryrun", home=home)
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    path.write_text(yaml.safe_dump({**local, "envs": {"BIG": None}}))
    r = cli("launch", str(path), "--dryrun", "--env", "BIG=" + "y" * (MAX_ENV_VALUE_BYTES + 1), home=home)
    assert r.returncode == 2 and "envs.BIG: its value is 32,769 bytes" in r.stderr, r.stderr
