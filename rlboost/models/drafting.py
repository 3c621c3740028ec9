"""Drafting for speculative decoding: propose a response's next tokens from text it is likely to repeat.

An `NgramIndex` holds a few documents (token lists that may grow: a prompt, responses being generated)
and, for every n-gram of length min_match..max_match in them, where it ended. Given a response's
recent tokens it finds the longest of its suffixes (up to max_match) that occurred before with
something after it, and proposes what followed (up to k tokens): suffix matching over an n-gram table,
O(max_match) dictionary look-ups per proposal and per token added, cheap enough for a small CPU.

What a response drafts from is its method's choice (rollout.speculative.method): `group` one index
per GRPO group (the shared prompt, every sibling's tokens, its own), `ngram` one per response (its
prompt and its own tokens). Drafts only decide speed: the engine keeps a drafted token only when it
equals the token the seeded sampler draws there, so a bad draft costs compute, never correctness.

Pure Python, no torch: the engine and the tests share it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rlboost.contracts.engine import GenRequest

MIN_MATCH = 2  # a single shared token predicts little: too many wasted drafts
MAX_MATCH = 8
_KEEP = 32  # occurrences remembered per n-gram (the most recent); more only cost memory


class NgramIndex:
    """Where each n-gram (min_match..max_match tokens) of some growing documents ended."""

    def __init__(self, min_match: int = MIN_MATCH, max_match: int = MAX_MATCH) -> None:
        if not 1 <= min_match <= max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {min_match}, {max_match}")
        self.min_match, self.max_match = min_match, max_match
        self.docs: list[list[int]] = []
        self._ends: dict[tuple[int, ...], list[tuple[int, int]]] = {}  # n-gram -> [(doc, end)], oldest first

    def add_doc(self, tokens: Iterable[int] = ()) -> int:
        """A new document (e.g. a prompt, a sibling's tokens); returns its id for `extend`."""
        self.docs.append([])
        doc = len(self.docs) - 1
        self.extend(doc, tokens)
        return doc

    def extend(self, doc: int, tokens: Iterable[int]) -> None:
        """Append tokens to a document, indexing every n-gram that ends at each of them."""
        d = self.docs[doc]
        for tok in tokens:
            d.append(int(tok))
            end = len(d)
            for n in range(self.min_match, min(self.max_match, end) + 1):
                occ = self._ends.setdefault(tuple(d[end - n : end]), [])
                occ.append((doc, end))
                if len(occ) > _KEEP:
                    del occ[0]

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that followed the longest suffix of `context` (max_match at most, min_match at
        least) seen in the documents, from its most recent occurrence with a continuation; [] if none."""
        if k <= 0:
            return []
        for n in range(min(self.max_match, len(context)), self.min_match - 1, -1):
            occ = self._ends.get(tuple(context[len(context) - n :]))
            if not occ:
                continue
            for doc, end in reversed(occ):
                d = self.docs[doc]
                if end < len(d):  # an occurrence at a document's end has nothing after it (yet)
                    return d[end : end + k]
        return []


class BatchDrafter:
    """The drafts of one engine batch: each row's document (prompt + its tokens) in the index its
    method gives it. `group`: rows of one group share an index that also holds the siblings' tokens
    the request brought (generated elsewhere, as the coordinator had them at dispatch); `ngram`: each
    row its own index."""

    def __init__(self, method: str, rows: Sequence[GenRequest]) -> None:
        if method not in ("group", "ngram"):
            raise ValueError(f"no drafting for method {method!r}")
        self.index: list[NgramIndex] = []
        self.doc: list[int] = []
        by_group: dict[str, NgramIndex] = {}
        for r in rows:
            key = r.group if method == "group" and r.group is not None else None
            idx = by_group.get(key) if key is not None else None
            if idx is None:
                idx = NgramIndex()
                if key is not None:
                    by_group[key] = idx
                    # A sibling's text follows the prompt: keep that boundary's n-grams
                    tail = r.prompt[len(r.prompt) - (idx.max_match - 1) :] if r.prompt else []
                    for sib in _distinct(q.siblings for q in rows if q.group == key):
                        idx.add_doc([*tail, *sib])
            self.index.append(idx)
            self.doc.append(idx.add_doc([*r.prompt, *r.prefix]))

    def propose(self, row: int, k: int) -> list[int]:
        idx = self.index[row]
        return idx.propose(idx.docs[self.doc[row]], k)

    def extend(self, row: int, tokens: Sequence[int]) -> None:
        self.index[row].extend(self.doc[row], tokens)


def _distinct(lists: Iterable[list[list[int]]]) -> list[list[int]]:
    """Sibling sequences of a group, each once (requests of one frame share the same list objects)."""
    seen: set[int] = set()
    out = []
    for seqs in lists:
        for s in seqs:
            if id(s) not in seen and s:
                seen.add(id(s))
                out.append(s)
    return out
