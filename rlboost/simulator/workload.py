"""The prompts a replay samples, for any job file, with no model weights and no tokenizer.

Built-in string tasks are cheap and exact: the replay samples them as the live trainer does. A jsonl
task (kind: hf) would need the model's tokenizer and chat template to encode its prompts, so the
replay stands in for it: each record becomes a prompt of its estimated token count (the job's
`rollout.synthetic.prompt_tokens` when set, else ~4 characters a token, the usual rule of thumb for
BPE tokenizers on English text) with ids derived from its text, so each prompt keeps one length key
(GRPO groups share it) and the same record gives the same key in every replay. Response lengths come
from `rollout.synthetic.lengths` or `--lengths` a recorded run, never from a model.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from rlboost.contracts.mounts import source_path
from rlboost.contracts.spec import JobSpec
from rlboost.trainer.tasks import EpochOrder, Problem, Task, make_task

CHARS_PER_TOKEN = 4.0
DEFAULT_PROMPT_TOKENS = 256  # no dataset to estimate from and no prompt_tokens set


class EstimatedPrompts:
    """A jsonl task's prompts as token counts (the sampling order as JsonlTask: a seeded shuffle,
    epoch after epoch)."""

    name = "jsonl-estimate"

    def __init__(self, texts: list[str], prompt_tokens: int | None) -> None:
        self.prompts: list[list[int]] = []
        for i, text in enumerate(texts):
            n = prompt_tokens or max(1, round(len(text) / CHARS_PER_TOKEN))
            seed = int.from_bytes(hashlib.blake2b(f"{i}\0{text}".encode(), digest_size=8).digest(), "little")
            ids = np.random.default_rng(seed).integers(0, 1 << 31, size=n)
            self.prompts.append([int(x) for x in ids])
        self._order = EpochOrder()

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        out = []
        for _ in range(n):
            i = self._order.next(rng, len(self.prompts))
            out.append(Problem(list(self.prompts[i]), [], f"record {i + 1}", index=i))
        return out


def replay_task(spec: JobSpec) -> Task | EstimatedPrompts:
    """What the replay samples prompts from (module docstring)."""
    if spec.task.name != "jsonl":
        return make_task(spec.task)
    prompt_tokens = spec.rollout.synthetic.prompt_tokens
    path = spec.task.path
    if path is not None:  # a node path inside a file mount: read its local source
        path = source_path(str(path), spec.file_mounts) or path
    texts: list[str] = []
    if path is not None and Path(path).exists():
        from rlboost.trainer import datasets

        fields = datasets.Fields(spec.task.prompt_field, spec.task.answer_field, require_answer=False)
        texts = [r.prompt for r in datasets.load_records(Path(path), fields, spec.task.split)]
    if not texts:
        texts = [f"prompt {i}" for i in range(1024)]
        prompt_tokens = prompt_tokens or DEFAULT_PROMPT_TOKENS
    return EstimatedPrompts(texts, prompt_tokens)
