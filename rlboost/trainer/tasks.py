"""Verifiable tasks: toy string tasks over a character-level vocabulary (tiny-gpt), with an
exact-match reward, and a JSONL prompt dataset scored by a verifier (Hugging Face models; see
JsonlTask at the end).

A problem is `BOS <symbols> SEP`; the policy must answer `<answer symbols> EOS`. The reward is 1.0
iff the generated response (exactly the ids the engine produced, EOS included when it stopped on
EOS) equals `answer_ids + [EOS]`, else 0.0. Everything is drawn from the caller's numpy Generator, so
a seeded generator gives the same problems on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlboost.contracts.rewards import CustomReward, is_import_path
from rlboost.contracts.spec import ModelSpec, TaskSpec
from rlboost.models.vocab import BOS, DIGITS, EOS, LETTERS, SEP, decode, encode


@dataclass
class Problem:
    prompt_ids: list[int]  # BOS + symbols + SEP
    answer_ids: list[int]  # the correct answer, without EOS (empty for a dataset problem)
    text: str  # e.g. "^abc=cba$", for logs
    answer: str = ""  # a dataset problem's reference answer (what the verifier compares with)
    index: int = -1  # a dataset problem's record number
    # what a custom reward (rlboost/contracts/rewards.py) is given: the prompt text and the dataset row
    prompt_text: str = ""
    row: dict = field(default_factory=dict)


class Task:
    """Base class: subclasses define `_question(rng)` and `_answer(question)` on symbol strings."""

    name = "task"
    eos_id = EOS  # the token that ends a response
    custom: CustomReward | None = None  # the job's own reward function, when task.reward names one

    def __init__(self, min_len: int, max_len: int, alphabet: str) -> None:
        if not 1 <= min_len <= max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}..{max_len}")
        self.min_len, self.max_len, self.alphabet = min_len, max_len, alphabet

    def _question(self, rng: np.random.Generator) -> str:
        n = int(rng.integers(self.min_len, self.max_len + 1))
        return "".join(self.alphabet[i] for i in rng.integers(0, len(self.alphabet), size=n))

    def _answer(self, question: str) -> str:
        raise NotImplementedError

    @property
    def max_answer_len(self) -> int:
        """Longest answer, without EOS (a response needs max_answer_len + 1 tokens)."""
        return self.max_len

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        problems = []
        for _ in range(n):
            q = self._question(rng)
            prompt = [BOS, *encode(q), SEP]
            a = self._answer(q)
            answer = encode(a)
            text = decode([*prompt, *answer, EOS])
            problems.append(Problem(prompt, answer, text, prompt_text=q, row={"prompt": q, "answer": a}))
        return problems

    def eval_problems(self, seed: int, n: int) -> list[Problem]:
        """n held-out problems: drawn from their own generator (seeded from the job's seed), the same at
        every evaluation. A generated task has no true held-out split: a few may also come up in training."""
        return self.sample(np.random.default_rng([seed, 0xE7A1]), n)

    def reward(self, problem: Problem, response_ids: list[int]) -> float:
        if self.custom is not None:
            return self.custom(problem.prompt_text, self.decode_response(response_ids), problem.row)
        return 1.0 if list(response_ids) == [*problem.answer_ids, EOS] else 0.0

    def rewards(self, problems: list[Problem], responses: list[list[int]]) -> list[float]:
        """The rewards of several responses: one call of a batched (TRL-style) custom reward for them all."""
        if self.custom is not None and self.custom.style == "trl":
            texts = [self.decode_response(ids) for ids in responses]
            return self.custom.batch([p.prompt_text for p in problems], texts, [p.row for p in problems])
        return [self.reward(p, ids) for p, ids in zip(problems, responses, strict=True)]

    def decode_response(self, ids: list[int]) -> str:
        """A response as a custom reward sees it: its text, without the final end-of-sequence."""
        return decode(ids[:-1] if ids and ids[-1] == self.eos_id else ids)

    def demo_ids(self, problem: Problem) -> list[int]:
        """A full demonstration (prompt + answer + EOS) for the supervised warm start."""
        return [*problem.prompt_ids, *problem.answer_ids, EOS]

    def decode(self, ids: list[int]) -> str:
        return decode(ids)


class Reverse(Task):
    name = "reverse"

    def _answer(self, question: str) -> str:
        return question[::-1]


class Copy(Task):
    name = "copy"

    def _answer(self, question: str) -> str:
        return question


class Sort(Task):
    name = "sort"

    def _answer(self, question: str) -> str:
        return "".join(sorted(question))


class Add(Task):
    """`a+b` with each operand of min_len..max_len digits (no leading zeros); answer in decimal."""

    name = "add"

    def __init__(self, min_len: int, max_len: int) -> None:
        super().__init__(min_len, max_len, DIGITS)

    def _operand(self, rng: np.random.Generator) -> int:
        n = int(rng.integers(self.min_len, self.max_len + 1))
        lo = 0 if n == 1 else 10 ** (n - 1)
        return int(rng.integers(lo, 10**n))

    def _question(self, rng: np.random.Generator) -> str:
        return f"{self._operand(rng)}+{self._operand(rng)}"

    def _answer(self, question: str) -> str:
        a, b = question.split("+")
        return str(int(a) + int(b))

    @property
    def max_answer_len(self) -> int:
        return self.max_len + 1  # a carry out of the top digit


# Alphabet of the symbol tasks. Small on purpose: a tiny CPU model must learn the task in
# seconds, and the vocabulary size (not the length) is what makes the warm start slow.
DEFAULT_ALPHABET = LETTERS[:10]


def make_task(spec: TaskSpec, model: ModelSpec | None = None, alphabet: str = DEFAULT_ALPHABET) -> Task:
    """The job's task; a jsonl task needs the model (its tokenizer and chat template)."""
    task: Task
    if spec.name == "jsonl":
        if model is None or model.kind != "hf":
            raise ValueError("task jsonl needs an hf model (its tokenizer encodes the prompts)")
        from rlboost.models import hf

        task = JsonlTask(spec, hf.load_tokenizer(model))
    elif spec.name == "add":
        task = Add(spec.min_len, spec.max_len)
    else:
        classes: dict[str, type[Task]] = {"reverse": Reverse, "copy": Copy, "sort": Sort}
        if spec.name not in classes:
            raise ValueError(f"unknown task {spec.name!r} (known: add, {', '.join(classes)})")
        task = classes[spec.name](spec.min_len, spec.max_len, alphabet)
    if is_import_path(spec.reward):
        source = str(spec.path) if spec.path is not None else spec.name  # veRL's data_source for rows without one
        task.custom = CustomReward(spec.reward, spec.reward_style, data_source=source, budget=spec.reward_error_budget)
    return task


def _record_problem(r: Any, prompt_ids: list[int], index: int) -> Problem:
    """A dataset record (rlboost/trainer/datasets.py Record) as a problem; index -1: a held-out record."""
    return Problem(list(prompt_ids), [], r.prompt[:80], answer=r.answer, index=index, prompt_text=r.prompt, row=r.row)


class EpochOrder:
    """Each of n items once per epoch, in a new random order every epoch (a dataset's sampler)."""

    def __init__(self) -> None:
        self._left: list[int] = []

    def next(self, rng: np.random.Generator, n: int) -> int:
        if not self._left:
            self._left = [int(i) for i in rng.permutation(n)][::-1]
        return self._left.pop()


def _wants_chat_template(mode: str, tokenizer: Any) -> bool:
    """task.chat_template: `auto` uses the tokenizer's template when it has one, `on` requires one."""
    has = bool(getattr(tokenizer, "chat_template", None))
    if mode == "on" and not has:
        where = getattr(tokenizer, "name_or_path", "") or "model.path"
        raise ValueError(
            f"task.chat_template: on, but the tokenizer of {where} has no chat template "
            "(set task.chat_template: auto to use one only when the tokenizer has it, or off)"
        )
    return mode != "off" and has


class JsonlTask(Task):
    """Prompts from a dataset (rlboost/trainer/datasets.py: jsonl, parquet or a `datasets` directory), rewarded by
    a verifier on the decoded response (rlboost/trainer/verifiers.py). Prompts go through the tokenizer's chat
    template per task.chat_template; problems are drawn in a seeded shuffled order, epoch after epoch."""

    name = "jsonl"

    def __init__(self, spec: TaskSpec, tokenizer: Any) -> None:
        from rlboost.contracts import dataset_files
        from rlboost.models import hf
        from rlboost.trainer import datasets, verifiers

        assert spec.path is not None
        self.spec, self.tokenizer = spec, tokenizer
        self.eos_id = hf.eos_token_id(tokenizer)
        # a custom reward may score rows that carry no reference answer
        fields = datasets.Fields(spec.prompt_field, spec.answer_field, require_answer=not is_import_path(spec.reward))
        self.records = datasets.load_records(spec.path, fields, spec.split)
        self.verify = verifiers.VERIFIERS.get(spec.reward, verifiers.exact_match)
        self.use_chat_template = _wants_chat_template(spec.chat_template, tokenizer)
        self._prompts = [self._encode_prompt(r.prompt) for r in self.records]
        self._order = EpochOrder()
        # the held-out split: a separate dataset, or a fixed seeded share of this one that is never trained on
        self.train_idx, self._eval = list(range(len(self.records))), []
        if spec.eval_path is not None:
            held = datasets.load_records(
                spec.eval_path,
                fields,
                spec.eval_split,
                default_split=dataset_files.DEFAULT_EVAL_SPLIT,
                split_key="task.eval_split",
            )
            self._eval = [(r, self._encode_prompt(r.prompt)) for r in held]
        elif spec.eval_every:
            fraction = spec.eval_fraction if spec.eval_fraction is not None else 0.1
            n = len(self.records)
            n_eval = max(1, round(fraction * n))
            if n_eval >= n:
                raise dataset_files.DatasetError(
                    f"{spec.path}: {n} records cannot spare {n_eval} for evaluation and still train "
                    "(lower task.eval_fraction, or give task.eval_path)"
                )
            held_idx = set(int(i) for i in np.random.default_rng(0).permutation(n)[:n_eval])
            self._eval = [(self.records[i], self._prompts[i]) for i in sorted(held_idx)]
            self.train_idx = [i for i in range(n) if i not in held_idx]

    def _encode_prompt(self, text: str) -> list[int]:
        """The prompt's token ids, exactly what the learner trains on and every engine is sent (engines
        get ids, never text). The reward still sees the raw prompt (Problem.prompt_text)."""
        content = f"{text}\n{self.spec.instruction}" if self.spec.instruction else text
        if self.use_chat_template:
            messages = [{"role": "user", "content": content}]
            if self.spec.system_prompt:
                messages.insert(0, {"role": "system", "content": self.spec.system_prompt})
            rendered = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            # the template writes its own special tokens (a BOS too, where it has one): add none
            return [int(i) for i in self.tokenizer.encode(rendered, add_special_tokens=False)]
        if self.spec.system_prompt:
            content = f"{self.spec.system_prompt}\n{content}"
        return [int(i) for i in self.tokenizer.encode(content, add_special_tokens=True)]

    @property
    def max_prompt_len(self) -> int:
        return max(len(p) for p in [*self._prompts, *(ids for _, ids in self._eval)])

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        out = []
        for _ in range(n):
            i = self.train_idx[self._order.next(rng, len(self.train_idx))]
            out.append(_record_problem(self.records[i], self._prompts[i], i))
        return out

    def eval_problems(self, seed: int, n: int) -> list[Problem]:
        """The held-out split (its first n records); empty when evaluation is off."""
        del seed  # the split is fixed when the task is built
        return [_record_problem(r, ids, -1) for r, ids in self._eval[:n]]

    def reward(self, problem: Problem, response_ids: list[int]) -> float:
        if self.custom is not None:
            return self.custom(problem.prompt_text, self.decode_response(response_ids), problem.row)
        return self.verify(self.decode_response(response_ids), problem.answer)

    def decode_response(self, ids: list[int]) -> str:
        body = ids[:-1] if ids and ids[-1] == self.eos_id else ids
        return self.tokenizer.decode(body, skip_special_tokens=True)

    def demo_ids(self, problem: Problem) -> list[int]:
        demo = self.records[problem.index].demonstration
        if demo is None:
            raise ValueError(
                f"{self.spec.path}: record {problem.index + 1} has no worked solution for the warm start "
                "(set algorithm.warm_start_steps: 0, or give answers with reasoning: '#### x' or \\boxed{x})"
            )
        return [*problem.prompt_ids, *self.tokenizer.encode(demo, add_special_tokens=False), self.eos_id]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    @property
    def max_answer_len(self) -> int:
        return 0  # unknown: responses are free text
