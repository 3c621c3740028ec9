"""CLI habits (issue 16): shell completion installs, output fits 80 columns, piped output is plain text,
and tables fold long ids instead of cutting them. Every command runs as a real process with its stdout
piped, as `rlboost ... | less` or a script would see it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlboost.cli.state import StateStore
from rlboost.providers.base import InstanceKind, InstanceState, LaunchRequest, Owner, Role

ROOT = Path(__file__).resolve().parents[1]
NAME = "a-job-name-of-the-longest-kind-allowed-x"  # 40 characters, the most a name may have
WORKER = f"w0042-{NAME}"  # instance ids embed the job name


def _env(home: Path, **extra: str) -> dict[str, str]:
    # a user's shell: no COLUMNS exported (scripts and pipes rarely have it), PYTHONPATH to this tree
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")}
    return {**env, "RLBOOST_HOME": str(home), "PYTHONPATH": str(ROOT), **extra}


# typer finds the user's shell by walking up the process tree (shellingham), which a test run started
# outside a shell (a CI runner, nohup) lacks; its own switch makes the completion options take the
# shell's name instead (`--show-completion bash`), so the tests do not depend on how they were started
SHELL_NAMED = {"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}


def _rlboost(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlboost.cli.main", *args],
        env=_env(home, **env),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def _assert_plain_80(out: str) -> None:
    assert out.strip(), "no output"
    assert "\x1b" not in out, "ANSI escapes in piped output"
    long = [ln for ln in out.splitlines() if len(ln) > 80]
    assert not long, f"{len(long)} line(s) over 80 columns, e.g. {long[0]!r}"
    assert "…" not in out, "a cell was cut with an ellipsis"


def _folded(out: str, text: str) -> str:
    """`text` read back from a table column, following its fold onto the lines below."""
    lines = out.splitlines()
    i = next(i for i, ln in enumerate(lines) if text[:12] in ln)
    col = lines[i].index(text[:12])
    got = ""
    while len(got) < len(text) and i < len(lines):
        got += lines[i][col:].split(" ", 1)[0]
        i += 1
    return got


def test_show_completion_prints_an_installable_bash_script(tmp_path):
    proc = _rlboost("--show-completion", "bash", home=tmp_path, **SHELL_NAMED)
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    assert "complete -o default -F _rlboost_completion rlboost" in script
    assert "_RLBOOST_COMPLETE=complete_bash" in script
    # what bash runs on <TAB> with that script installed: the program answers with the candidates
    words = {"COMP_WORDS": "rlboost sim", "COMP_CWORD": "1", "_RLBOOST_COMPLETE": "complete_bash"}
    proc = _rlboost(home=tmp_path, **words)
    assert proc.returncode == 0 and proc.stdout.split() == ["simulate"], proc.stdout + proc.stderr
    words = {"COMP_WORDS": "rlboost simulate --tra", "COMP_CWORD": "2", "_RLBOOST_COMPLETE": "complete_bash"}
    assert _rlboost(home=tmp_path, **words).stdout.split() == ["--trace"]
    helptext = _rlboost("--help", home=tmp_path).stdout
    assert "--install-completion" in helptext and "--show-completion" in helptext


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_install_completion_then_bash_completes(tmp_path):
    """--install-completion into a fresh HOME, then a bash that reads its .bashrc completes `rlboost sim<TAB>`."""
    home = tmp_path / "user"
    home.mkdir()
    proc = _rlboost("--install-completion", "bash", home=tmp_path / "rl", HOME=str(home), **SHELL_NAMED)
    assert proc.returncode == 0 and "completion installed" in proc.stdout, proc.stdout + proc.stderr
    assert "rlboost.sh" in (home / ".bashrc").read_text()
    bindir = tmp_path / "bin"  # `rlboost` on PATH, as `pip install` puts it
    bindir.mkdir()
    (bindir / "rlboost").write_text(f'#!/bin/sh\nexec {sys.executable} -m rlboost.cli.main "$@"\n')
    (bindir / "rlboost").chmod(0o755)
    script = "source ~/.bashrc; COMP_WORDS=(rlboost sim); COMP_CWORD=1; _rlboost_completion rlboost; "
    script += 'echo "${COMPREPLY[@]}"'
    env = _env(tmp_path / "rl", HOME=str(home), PATH=f"{bindir}:{os.environ['PATH']}")
    out = subprocess.run(["bash", "--norc", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["simulate"], out.stdout + out.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("simulate", "--help"),
        ("check",),
        ("launch", "--dryrun", "examples/aws-gcp.yaml"),
        ("simulate", "examples/simulate/aws-p3-v100.yaml", "--hours", "0.5", "--steps", "0"),
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_piped_output_is_plain_and_fits_80_columns(tmp_path, args):
    home = tmp_path / "home"
    (tmp_path / "h").mkdir()
    proc = _rlboost(*args, home=home, HOME=str(tmp_path / "h"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_plain_80(proc.stdout)
    if args[0] == "launch":
        assert "a3-highgpu-1g" in proc.stdout and "us-central1-a" in proc.stdout  # ids whole
    if args[0] == "simulate" and len(args) > 2:
        assert "rlboost-rule" in proc.stdout and "spot-restart" in proc.stdout


def _job_with_long_ids(home: Path) -> None:
    with StateStore(home / "state.db") as store:
        job = store.create_job(NAME, f"name: {NAME}\n", "local")
        store.update_job(job, status="running", started_at=1000.0, step=3, reward=0.25, clock=3600.0)
        for iid, kind in ((f"{NAME}-17-trainer", InstanceKind.ON_DEMAND), (WORKER, InstanceKind.SPOT)):
            role = Role.TRAINER if kind is InstanceKind.ON_DEMAND else Role.WORKER
            req = LaunchRequest(iid, Owner(NAME, 1), role, kind, "local", "us-central1-a", "A100-80GB:8", 1.5)
            store.record_launch(job, req, "local", 3.0)
            store.update_instance(iid, InstanceState.RUNNING, 60.0)


def test_status_and_cost_report_fold_long_ids_instead_of_cutting_them(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    _job_with_long_ids(home)
    for args in (("status",), ("status", NAME), ("cost-report", NAME)):
        proc = _rlboost(*args, home=home)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        _assert_plain_80(proc.stdout)
        assert _folded(proc.stdout, NAME) == NAME, proc.stdout
    assert _folded(_rlboost("status", NAME, home=home).stdout, WORKER) == WORKER
    # a terminal as wide as it likes: the same ids on one line each
    wide = _rlboost("status", NAME, home=home, COLUMNS="200").stdout
    assert WORKER in wide and max(map(len, wide.splitlines())) > 80


def test_every_help_fits_80_columns_shows_flags_without_a_type_and_examples():
    """`--dryrun <bool>` read as if it took a value (`--dryrun=true` is an error); an option cut to
    `--no-record-rollo…` could not be typed; the main commands show how they are called."""
    from typer.main import get_command
    from typer.testing import CliRunner

    from rlboost.cli.main import app

    group = get_command(app)
    names = [n for n, c in group.commands.items() if not c.hidden]
    assert {"launch", "status", "cost-report", "simulate", "check"} <= set(names)
    for args in ([], *([n] for n in names)):
        out = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "80"}).output
        assert "<bool>" not in out and "…" not in out, (args, out)
        assert all(len(line) <= 80 for line in out.splitlines()), args
        if args and args[0] in ("launch", "status", "cost-report", "simulate", "logs"):
            lines = [line.strip() for line in out.splitlines()]
            assert lines[lines.index("Examples:") + 1].split()[:2] == ["rlboost", args[0]], out
    dry = CliRunner().invoke(app, ["launch", "--dryrun=true", "x.yaml"])
    assert dry.exit_code == 2 and "does not take a value" in dry.output  # why the label misled
