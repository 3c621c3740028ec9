"""Third-party warnings (wandb's) during `launch` go to the job's controller.log, not the attached
console (issue 40); after the controller's run, warnings print as before."""

from __future__ import annotations

import io
import logging
import warnings

from rlboost.cli.detach import controller_log
from rlboost.cli.state import StateStore
from rlboost.cli.warnings_log import WarningsToLog
from tests.test_job_envs import sky_controller_that_fails_to_launch


def _wandb_warns(text: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn_explicit(text, UserWarning, "wandb/sdk/wandb_init.py", 1, module="wandb")


def test_warnings_go_to_the_log_while_installed(tmp_path, capsys):
    log = tmp_path / "run" / "controller.log"
    with WarningsToLog(log):
        _wandb_warns("wandb: a deprecated setting")
    assert "UserWarning: wandb: a deprecated setting" in log.read_text()
    assert "deprecated" not in capsys.readouterr().err
    assert not _file_handlers()


def test_the_controller_sends_warnings_to_controller_log_not_the_console(tmp_path, capsys):
    store = StateStore(tmp_path / "state.db")
    out = io.StringIO()
    ctl, _, _ = sky_controller_that_fails_to_launch(tmp_path, store, "warned", out)
    try:
        _wandb_warns("wandb: the run could not sync")  # as wandb.init / run.log / finish would, mid-launch
        log = controller_log(ctl.run_dir).read_text()
        assert "UserWarning: wandb: the run could not sync" in log, log
        assert ctl.run() == "failed"
    finally:
        store.close()
    assert "could not sync" not in out.getvalue()
    assert "could not sync" not in capsys.readouterr().err
    assert not _file_handlers()  # removed at the end of the run


def test_a_newer_controller_takes_over_from_one_that_never_removed_its_log(tmp_path):
    first = WarningsToLog(tmp_path / "a" / "controller.log").install()  # e.g. a controller that never ran
    second = WarningsToLog(tmp_path / "b" / "controller.log").install()
    _wandb_warns("wandb: only the newest log")
    second.remove()
    assert first.handler is None and not _file_handlers()
    assert "only the newest log" in (tmp_path / "b" / "controller.log").read_text()
    assert not (tmp_path / "a" / "controller.log").exists()


def _file_handlers() -> list[logging.Handler]:
    """Ours on the warnings logger (pytest may hang its own capture handlers there)."""
    return [h for h in logging.getLogger("py.warnings").handlers if isinstance(h, logging.FileHandler)]
