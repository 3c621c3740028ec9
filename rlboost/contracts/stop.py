"""Stop strings (`algorithm.stop`, vLLM's `SamplingParams.stop`): where a response ends on its text.

Engines see token ids only (vLLM runs without a tokenizer), and a stop string is text, which can
tokenize differently in context; so engines never check them. Whoever holds a response's whole token
list and the task's tokenizer does: the rollout book on the trainer (every token of every response,
whichever engines generated its parts, rollout/book.py) and the in-process loops (evaluation). The
rule is one pure function of the token list: a response ends at the first token after which its text
(the task's `decode_response`, the text the reward sees) contains a stop string. It keeps that token,
as vLLM's `token_ids` do (veRL trains on them; only vLLM's `text` drops the stop string). An engine
may generate past the stop before its abort arrives: those tokens are dropped. Since the rule reads
nothing but the tokens, every engine, the seeded sampler and a migrated response end at the same token.

Cost: each new chunk of a response decodes a window (the new tokens and `lookback` before them), not
the whole response; the exact token is found on whole prefixes once, when the window holds a stop string.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 200


def stop_problem(stops: Sequence[object]) -> str | None:
    """Why a list is no valid `algorithm.stop` (None: valid)."""
    if len(stops) > MAX_STOP_STRINGS:
        return f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}"
    for s in stops:
        if not isinstance(s, str) or not s:
            return f"stop strings must be non-empty strings, got {s!r}"
        if len(s) > MAX_STOP_CHARS:
            return f"a stop string has at most {MAX_STOP_CHARS} characters, got {len(s)} ({s[:20]!r}...)"
    return None


class StopStrings:
    """algorithm.stop with the task's decoder (token ids -> the response's text)."""

    def __init__(self, stops: Sequence[str], decode: Callable[[list[int]], str]) -> None:
        why = stop_problem(stops)
        if why is not None:
            raise ValueError(f"algorithm.stop: {why}")
        if not stops:
            raise ValueError("algorithm.stop: no stop strings (leave the checker out instead)")
        self.stops = tuple(stops)
        self.decode = decode
        # tokens before the new ones that a stop string ending in the new text can reach back into:
        # each token is at least a byte of text, a character at most 4 (+ a few: a window's first
        # token may decode differently from its place in the whole, e.g. SentencePiece's leading space)
        self.lookback = 4 * max(len(x) for x in self.stops) + 4

    def _hit(self, tokens: Sequence[int] | np.ndarray) -> bool:
        text = self.decode(tokens.tolist() if isinstance(tokens, np.ndarray) else list(tokens))
        return any(s in text for s in self.stops)

    def end(self, tokens: Sequence[int] | np.ndarray, checked: int = 0) -> int | None:
        """The length `tokens` end at: the first n > checked whose text tokens[:n] holds a stop string;
        None if none does. tokens[:checked] holds none (the caller checked it before)."""
        n = len(tokens)
        if n <= checked or not self._hit(tokens[max(0, checked - self.lookback) :]):
            return None  # the common case: nothing new ends the response (one short decode)
        for k in range(checked + 1, n + 1):  # the exact token, on the whole text (once per response)
            if self._hit(tokens[:k]):
                return k
        return None  # (the window's text had one its start made up, e.g. a split UTF-8 character)

    def cut(self, tokens: Sequence[int]) -> list[int]:
        """tokens ended at the rule's token (all of them when no stop string occurs)."""
        n = self.end(tokens)
        return list(tokens if n is None else tokens[:n])


def stop_rule(stops: Sequence[str], decode: Callable[[list[int]], str] | None) -> StopStrings | None:
    """algorithm.stop as a rule, or None when the job has no stop strings (or no decoder: a replay of
    synthetic tokens): the one place that decides whether responses are checked at all."""
    return StopStrings(stops, decode) if stops and decode is not None else None


class StopCollector:
    """An in-process generate's on_tokens and should_abort: each response's tokens, ended by the rule
    as they arrive (its engine is told to abort at once)."""

    def __init__(self, rids: Sequence[str], stop: StopStrings | None) -> None:
        self.tokens: dict[str, list[int]] = {rid: [] for rid in rids}
        self.stop = stop
        self.stopped: set[str] = set()

    def on_tokens(self, rid: str, offset: int, ids: list[int], logprobs: list[float]) -> None:
        del logprobs
        if rid in self.stopped:
            return  # generated past the stop before the abort was seen
        toks = self.tokens[rid]
        if offset != len(toks):
            raise ValueError(f"{rid}: tokens at offset {offset}, have {len(toks)}")
        toks.extend(ids)
        if self.stop is not None:
            n = self.stop.end(toks, offset)
            if n is not None:
                del toks[n:]
                self.stopped.add(rid)

    def should_abort(self, rid: str) -> bool:
        return rid in self.stopped
