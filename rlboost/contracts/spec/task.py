"""The job file's `task:` section: what is trained on and how it is scored and validated."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from rlboost.contracts.spec.base import LaxPath, Strict

VERIFIER_NAMES = ("exact_match", "math_boxed")


class TaskSpec(Strict):
    """A verifiable task: a built-in string task with an exact-match reward (tiny-gpt), or a JSONL
    prompt dataset (rlboost/trainer/datasets.py) scored by a verifier (rlboost/trainer/verifiers.py), for kind: hf.
    Either kind may instead be scored by the user's own function (rlboost/contracts/rewards.py)."""

    name: Literal["reverse", "copy", "add", "sort", "jsonl"] = "reverse"
    # a built-in verifier, or an import path `module:function` called as
    # function(prompt: str, response: str, row: dict) -> float (rlboost/contracts/rewards.py)
    reward: str = "exact_match"
    # how a custom reward is called (rlboost/contracts/rewards.py): rlboost f(prompt, response, row), veRL's
    # compute_score(data_source, solution_str, ground_truth, extra_info), TRL's batched f(prompts, completions,
    # **columns); auto = from the function's parameter names
    reward_style: Literal["auto", "rlboost", "verl", "trl"] = "auto"
    # a step in which more than this share of a custom reward's calls fail stops the job (so does a first
    # step in which all fail)
    reward_error_budget: Annotated[float, Field(ge=0, le=1)] = 0.5
    min_len: Annotated[int, Field(ge=1, le=64)] = 3
    max_len: Annotated[int, Field(ge=1, le=64)] = 6
    # ---- jsonl only (the name of the dataset task, whatever the file's format) ----
    # a .jsonl file (one JSON object per line), a .parquet file, or a Hugging Face `datasets` directory
    # (save_to_disk; parquet and directories need `pip install 'rlboost[data]'`); relative to the job file
    path: LaxPath | None = None
    split: str | None = None  # a DatasetDict directory's split; None = "train"
    prompt_field: str | None = None  # None: the first of prompt, question, problem
    answer_field: str | None = None  # None: the first of answer, solution (GSM8K '#### x' or \boxed{x})
    # wrap prompts in the tokenizer's chat template: auto = when it has one; on = it must have one
    chat_template: Literal["auto", "on", "off"] = "auto"
    system_prompt: str | None = None
    # appended to every prompt (the usual instruction for math_boxed)
    instruction: str | None = "Please reason step by step, and put your final answer within \\boxed{}."
    # ---- validation (rlboost/trainer/evaluation.py) ----
    # every this many steps (and before the first, and after the last), score one response per held-out
    # problem with the weights just published: pass@1 and mean reward; 0 = off
    eval_every: Annotated[int, Field(ge=0, le=10_000_000)] = 0
    eval_path: LaxPath | None = None  # jsonl: a separate held-out dataset (any format of `path`)
    eval_split: str | None = None  # eval_path a DatasetDict directory: its split; None = "test"
    # jsonl: share of task.path held out (never trained on); None = 0.1 unless eval_path is set
    eval_fraction: Annotated[float, Field(gt=0, lt=1)] | None = None
    eval_size: Annotated[int, Field(ge=1, le=1_000_000)] = 64  # problems per evaluation (at most)
    eval_temperature: Annotated[float, Field(ge=0, le=10)] = 0.0  # 0 = greedy

    @field_validator("chat_template", mode="before")
    @classmethod
    def _chat_template(cls, v: object) -> object:
        # YAML 1.1 reads a bare `on`/`off` (and `true`/`false`) as a boolean
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @field_validator("reward")
    @classmethod
    def _reward(cls, v: str) -> str:
        from rlboost.contracts.rewards import RewardImportError, import_reward, is_import_path

        if v in VERIFIER_NAMES:
            return v
        if not is_import_path(v):
            raise ValueError(
                f"{v!r} is neither a built-in verifier ({', '.join(VERIFIER_NAMES)}) nor an import path "
                "to your own function (module.submodule:function)"
            )
        try:  # imported here, so a bad path is a job-file error before anything launches
            import_reward(v)
        except RewardImportError as e:
            raise ValueError(str(e)) from None
        return v

    @model_validator(mode="after")
    def _lens(self) -> TaskSpec:
        if self.min_len > self.max_len:
            raise ValueError(f"min_len ({self.min_len}) must be <= max_len ({self.max_len})")
        if self.name == "jsonl" and self.path is None:
            raise ValueError("name: jsonl needs path (a .jsonl file of prompts and answers)")
        if self.name != "jsonl" and self.path is not None:
            raise ValueError(f"path applies to name: jsonl only (task {self.name!r} generates its own problems)")
        # as ModelSpec: "set" = differs from the default, so a model_dump() round trip validates
        jsonl_only = ("split", "prompt_field", "answer_field", "chat_template", "system_prompt", "instruction")
        fields = type(self).model_fields
        changed = sorted(k for k in jsonl_only if getattr(self, k) != fields[k].default)
        if self.name != "jsonl" and changed:
            raise ValueError(f"{', '.join(changed)}: apply to name: jsonl only (remove, or set name: jsonl)")
        self._check_reward_style(fields)
        if self.reward == "math_boxed" and self.name != "jsonl":
            raise ValueError(f"reward math_boxed scores a jsonl dataset; task {self.name!r} uses exact_match")
        if self.eval_path is not None and self.eval_fraction is not None:
            raise ValueError("eval_path and eval_fraction: give one held-out split (a file, or a share of path)")
        if self.eval_split is not None and self.eval_path is None:
            raise ValueError("eval_split: applies to eval_path (a datasets directory); set eval_path or remove it")
        eval_keys = ("eval_path", "eval_fraction", "eval_size", "eval_temperature")
        set_eval = sorted(k for k in eval_keys if getattr(self, k) != fields[k].default)
        if not self.eval_every and set_eval:
            raise ValueError(f"{', '.join(set_eval)}: apply when eval_every > 0 (set eval_every, or remove them)")
        held_out = sorted(k for k in ("eval_path", "eval_fraction") if getattr(self, k) is not None)
        if self.name != "jsonl" and held_out:
            raise ValueError(
                f"{', '.join(held_out)}: apply to name: jsonl only (task {self.name!r} draws its held-out "
                "problems from its own seeded generator; set eval_size instead)"
            )
        return self

    def _check_reward_style(self, fields: dict) -> None:
        from rlboost.contracts.rewards import detect_style, import_reward, is_import_path

        if not is_import_path(self.reward):
            keys = ("reward_style", "reward_error_budget")
            changed = [k for k in keys if getattr(self, k) != fields[k].default]
            if changed:
                raise ValueError(f"{', '.join(changed)}: apply to a custom reward (task.reward: module:function)")
            return
        # the signature is checked when the job file loads: a reward written for another trainer must not
        # silently score 0 (import_reward succeeded in the field validator)
        detect_style(import_reward(self.reward), self.reward_style, self.reward)
