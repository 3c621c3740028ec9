"""Verifiable toy tasks over a character-level vocabulary, with an exact-match reward.

A problem is `BOS <symbols> SEP`; the policy must answer `<answer symbols> EOS`. The reward is 1.0
iff the generated response (exactly the ids the engine produced, EOS included when it stopped on
EOS) equals `answer_ids + [EOS]`, else 0.0. Everything is drawn from the caller's numpy Generator, so
a seeded generator gives the same problems on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlboost_cli.spec import TaskSpec

PAD, BOS, EOS, SEP = 0, 1, 2, 3
SYMBOLS = "0123456789abcdefghijklmnopqrstuvwxyz+"
_FIRST_SYMBOL = 4
VOCAB_SIZE = _FIRST_SYMBOL + len(SYMBOLS)  # 41

_STOI = {c: _FIRST_SYMBOL + i for i, c in enumerate(SYMBOLS)}
# How special tokens print in decode(): readable and unambiguous (none of them is a symbol).
_SPECIAL_TEXT = {PAD: "_", BOS: "^", EOS: "$", SEP: "="}

DIGITS = SYMBOLS[:10]
LETTERS = SYMBOLS[10:36]


def encode(text: str) -> list[int]:
    """Symbol string -> ids (symbols only; specials are added by the task)."""
    return [_STOI[c] for c in text]


def decode(ids: list[int]) -> str:
    """Ids -> text; specials print as ^ (BOS), = (SEP), $ (EOS), _ (PAD), ? (out of range)."""
    out = []
    for i in ids:
        if i in _SPECIAL_TEXT:
            out.append(_SPECIAL_TEXT[i])
        elif _FIRST_SYMBOL <= i < VOCAB_SIZE:
            out.append(SYMBOLS[i - _FIRST_SYMBOL])
        else:
            out.append("?")
    return "".join(out)


@dataclass
class Problem:
    prompt_ids: list[int]  # BOS + symbols + SEP
    answer_ids: list[int]  # the correct answer, without EOS
    text: str  # e.g. "^abc=cba$", for logs


class Task:
    """Base class: subclasses define `_question(rng)` and `_answer(question)` on symbol strings."""

    name = "task"

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
            answer = encode(self._answer(q))
            problems.append(Problem(prompt, answer, decode([*prompt, *answer, EOS])))
        return problems

    def reward(self, problem: Problem, response_ids: list[int]) -> float:
        return 1.0 if list(response_ids) == [*problem.answer_ids, EOS] else 0.0

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


def make_task(spec: TaskSpec, alphabet: str = DEFAULT_ALPHABET) -> Task:
    if spec.name == "add":
        return Add(spec.min_len, spec.max_len)
    classes: dict[str, type[Task]] = {"reverse": Reverse, "copy": Copy, "sort": Sort}
    if spec.name not in classes:
        raise ValueError(f"unknown task {spec.name!r} (known: add, {', '.join(classes)})")
    return classes[spec.name](spec.min_len, spec.max_len, alphabet)
