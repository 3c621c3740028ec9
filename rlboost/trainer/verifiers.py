"""Rewards that check a response's final answer (math_boxed) or its whole text (exact_match).

math_boxed follows the usual GSM8K / MATH recipe: the answer is the content of the last `\\boxed{...}`
in the response (braces balanced), else the number after a GSM8K-style `#### `; both sides are
normalised (spaces, `$`, `\\left`/`\\right`, `\\dfrac`, thousands separators, trailing `.0`, a final
period, `\\text{...}` units) and compared as strings, then as exact rationals when both are numbers
(so `0.5`, `1/2` and `\\frac{1}{2}` agree). No sympy: it is meant to be fast and predictable.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HASHES = re.compile(r"####\s*([^\n]+)")
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_TEXT = re.compile(r"\\(?:text|mbox|mathrm)\s*\{([^{}]*)\}")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (nested braces allowed), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth, i = 1, start
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start : i - 1]
    return None


def extract_answer(text: str) -> str | None:
    """The final answer of a response or a reference solution: last \\boxed{}, else `#### x`."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    hashes = _HASHES.findall(text)
    return hashes[-1] if hashes else None


def normalize(answer: str) -> str:
    s = answer.strip()
    s = _TEXT.sub(r"\1", s)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("$", ""), (" ", "")):
        s = s.replace(old, new)
    s = _FRAC.sub(r"(\1)/(\2)", s)
    s = s.rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")  # 1,234 -> 1234 (but keep tuples like 1,2)
    if re.fullmatch(r"-?\d+\.0+", s):
        s = s.split(".")[0]
    return s


def _as_number(s: str) -> Fraction | None:
    m = re.fullmatch(r"\(?(-?\d+(?:\.\d+)?)\)?(?:/\(?(-?\d+(?:\.\d+)?)\)?)?%?", s)
    if not m:
        return None
    num = Fraction(m.group(1))
    if m.group(2) is None:
        return num
    den = Fraction(m.group(2))
    return None if den == 0 else num / den


def answers_match(predicted: str, reference: str) -> bool:
    a, b = normalize(predicted), normalize(reference)
    if not a:
        return False
    if a == b:
        return True
    x, y = _as_number(a), _as_number(b)
    return x is not None and x == y


def math_boxed(response_text: str, reference: str) -> float:
    """1.0 if the response's final answer equals the reference answer, else 0.0."""
    predicted = extract_answer(response_text)
    return 1.0 if predicted is not None and answers_match(predicted, reference) else 0.0


def exact_match(response_text: str, reference: str) -> float:
    return 1.0 if response_text.strip() == reference.strip() else 0.0


VERIFIERS: dict[str, Callable[[str, str], float]] = {"math_boxed": math_boxed, "exact_match": exact_match}
