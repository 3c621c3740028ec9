"""tiny-gpt's character-level vocabulary: four special ids, then one id per symbol.

The model (rlboost/models/tiny_gpt.py) sizes its embedding by it, the torch engine stops on EOS and pads with
PAD, and the toy tasks (rlboost/trainer/tasks.py) write problems in it.
"""

from __future__ import annotations

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
