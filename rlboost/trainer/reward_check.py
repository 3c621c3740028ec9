"""`launch --dryrun` tries a custom reward (`task.reward: module:function`) on a few real rows before
anything is spent: each row's reference answer as the response (it should score high) and an empty one.
An exception or a value that is not a number is an error that names task.reward; built-in verifiers
are not tried. It runs on the trainer's side of the layering (it reads the dataset and samples built-in
tasks), so the CLI runs it as a process (`python -m rlboost.trainer.reward_check`, the job and the secrets
on stdin, JSON on stdout): the user's reward is imported there, not into the CLI."""

from __future__ import annotations

import json
import sys

import numpy as np

from rlboost.contracts.rewards import CustomReward, RewardFailure, ground_truth, is_import_path
from rlboost.contracts.spec import JobSpec

ROWS = 3


class RewardCheckError(ValueError):
    pass


def _rows(spec: JobSpec) -> list[tuple[str, dict]]:
    """(prompt, row) of the first ROWS problems: the dataset's first rows, or a built-in task's draws."""
    task = spec.task
    if task.name == "jsonl":
        assert task.path is not None
        from rlboost.trainer import datasets  # (rlboost.trainer: this module's own package)

        fields = datasets.Fields(task.prompt_field, task.answer_field, require_answer=False)
        return [(r.prompt, r.row) for r in datasets.load_records(task.path, fields, task.split)[:ROWS]]
    from rlboost.trainer.tasks import make_task

    builtin = task.model_copy(update={"reward": "exact_match", "reward_style": "auto"})
    return [(p.prompt_text, p.row) for p in make_task(builtin).sample(np.random.default_rng(0), ROWS)]


def check_reward(spec: JobSpec, secrets: list[str]) -> list[str] | None:
    """The lines to print (one per call), or None for a built-in verifier; RewardCheckError on a failure."""
    task = spec.task
    if not is_import_path(task.reward):
        return None
    reward = CustomReward(task.reward, task.reward_style, secrets, data_source=str(task.path or task.name))
    rows = _rows(spec)
    lines = [f"task.reward {task.reward} (style {reward.style}) on {len(rows)} rows:"]
    for i, (prompt, row) in enumerate(rows):
        answer = ground_truth(row)
        answer = "" if answer is None else str(answer)
        for response in dict.fromkeys([answer, ""]):  # the reference answer, then an empty response
            value = _try(reward, prompt, response, row, i)
            lines.append(f"  row {i + 1}  response {response[:40]!r:<44} score {value:g}")
    return lines


def _try(reward: CustomReward, prompt: str, response: str, row: dict, i: int) -> float:
    try:
        return reward.strict(prompt, response, row)
    except RewardFailure as f:
        raise RewardCheckError(
            f"task.reward {reward.path} (style {reward.style}) {f.what} on row {i + 1} (response {response[:40]!r}); "
            "it would score 0.0 in training. Fix the function, or set task.reward_style if it was written for "
            "another trainer (rlboost, verl, trl)"
        ) from None


def main() -> None:
    """stdin: {"spec": the job as JSON, "secrets": [...]}; stdout: {"lines": [...] | null} or {"error": "..."}."""
    from rlboost.contracts.dataset_files import DatasetError

    request = json.load(sys.stdin)
    spec = JobSpec.model_validate(request["spec"])
    try:
        out: dict = {"lines": check_reward(spec, request["secrets"])}
    except (RewardCheckError, DatasetError) as e:
        out = {"error": str(e)}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
