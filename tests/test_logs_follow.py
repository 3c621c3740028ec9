"""`rlboost logs -f` on recorded logs (rlboost/cli/logs.py's Follower): following the controller and the
trainer together prints each finished step once (the trainer's line), every other line of both; the
controller followed alone keeps its step lines."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from rlboost.cli.logs import CONTROLLER, Follower, _file_reader

# what a detached controller writes (rich's console.log into a file: the time column blank when it
# repeats, padded to the width) and what the trainer prints, for the same two steps
CONTROLLER_LOG = (
    "[00:50:03] job id 7: controller pid 4242                                      \n"
    "[00:50:09] step   1  reward 0.500  tokens 40  migrated 0  0.50s                 \n"
    "           step   2  reward 0.625  tokens 44  migrated 1  0.52s                 \n"
    "           eval after step 2: pass@1 0.500, mean reward 0.500                   \n"
    "[00:50:11] custom: succeeded                                                   \n"
)
TRAINER_LOG = (
    "trainer serving at http://127.0.0.1:8000\n"
    "step   1/2  reward 0.500  loss 0.0123  pg_loss 0.0123  grad_norm 0.812  lr 0.003  updates 1"
    "  tokens    40  engines 2  migrated 0  0.50s\n"
    "step   2/2  reward 0.625  loss 0.0101  pg_loss 0.0101  grad_norm 0.640  lr 0.003  updates 1"
    "  tokens    44  engines 2  migrated 1  0.52s\n"
    "done: 2 steps\n"
)


def _followed(tmp_path: Path, logs: dict[str, str]) -> list[str]:
    out = io.StringIO()
    follower = Follower(Console(file=out, width=300), show_all=False)
    srcs = []
    for label, text in logs.items():
        path = tmp_path / f"{label}.log"
        path.write_text(text)
        srcs.append(_file_reader(label, path))
    follower.drain(srcs, prefix=True)
    return out.getvalue().splitlines()


def test_following_controller_and_trainer_prints_each_step_once(tmp_path: Path) -> None:
    lines = _followed(tmp_path, {CONTROLLER: CONTROLLER_LOG, "custom-7-trainer": TRAINER_LOG})
    steps = [ln for ln in lines if "reward 0." in ln and "mean reward" not in ln]
    trainer = "custom-7-trainer | step"
    assert [ln.split("  reward")[0] for ln in steps] == [f"{trainer}   1/2", f"{trainer}   2/2"]
    assert all("grad_norm" in ln for ln in steps)  # the trainer's line, with the optimizer's figures
    # everything else of both logs is there
    for needle in ("controller pid 4242", "eval after step 2", "custom: succeeded", "trainer serving", "done: 2"):
        assert sum(needle in ln for ln in lines) == 1, needle
    assert len(lines) == (5 - 2) + 4  # the controller's 5 lines less its 2 step lines, the trainer's 4


def test_a_restarted_trainers_steps_are_all_kept(tmp_path: Path) -> None:
    again = "resumed from ckpt-00000001.pt: continuing at step 2\n" + TRAINER_LOG.split("\n", 2)[2]
    lines = _followed(
        tmp_path, {CONTROLLER: CONTROLLER_LOG, "custom-7-trainer": TRAINER_LOG, "custom-7-trainer-r1": again}
    )
    steps = [ln.split("  reward")[0] for ln in lines if "/2  reward" in ln]
    first, second = "custom-7-trainer | step", "custom-7-trainer-r1 | step"
    assert steps == [f"{first}   1/2", f"{first}   2/2", f"{second}   2/2"]
    assert not any(ln.startswith("controller |") and "step   " in ln for ln in lines)


def test_the_controller_followed_alone_keeps_its_step_lines(tmp_path: Path) -> None:
    lines = _followed(tmp_path, {CONTROLLER: CONTROLLER_LOG})
    assert sum("  reward 0." in ln for ln in lines) == 2 and len(lines) == 5
