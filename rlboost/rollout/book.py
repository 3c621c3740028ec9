"""Migration bookkeeping: who holds which response, and every token generated so far.

Pure data structure (no I/O, no clock). The coordinator feeds it token chunks and engine events;
it guarantees that each response of a step:
  * is appended to only by the engine it is currently assigned to (late frames from a released
    engine are dropped),
  * only receives tokens generated under the step's weight version,
  * is completed exactly once, and continues elsewhere from prompt + partial tokens when its
    engine goes away (notice, broken stream, missed heartbeat, abort).

Storage is columnar so a whole frame of many responses is checked and stored with a few numpy
operations (`accept_columns`), which is what lets one core ingest a thousand engines: per response a
slot in fixed arrays (length, owner, budget, version, last token), tokens in a paged pool (pages of
`page` tokens, allocated as a response grows and freed when its step is collected). Each response has
a numeric `handle` (sent to engines in `generate`, echoed in binary token frames); handles are never
reused, so a stale frame can never land in another response.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from rlboost.contracts.stop import StopStrings


@dataclass(eq=False)
class Response:
    rid: str
    step: int
    version: int
    prompt: list[int]
    max_new_tokens: int
    seed: int
    engine: str | None = None
    finish: str | None = None  # "eos" | "length" | "stop" (algorithm.stop) once complete
    engines: list[str] = field(default_factory=list)  # every engine that generated part of it
    dispatches: int = 0
    handle: int = -1  # set by RolloutBook.add
    group: str | None = None  # GRPO group (prompt) id, when the caller tracks groups
    first_version: int = -1  # the version that began it (set by RolloutBook.add; `version` moves on an
    # in-flight swap: algorithm.weight_swap)
    swaps: list[tuple[int, int]] = field(default_factory=list)  # (token offset, version): tokens from the
    # offset on come from that version (per-token versions after in-flight swaps)
    # speculative decoding, summed over the engines that generated it: drafted tokens verified, of
    # which accepted, and the forward passes that verified a draft for it
    drafted: int = 0
    accepted: int = 0
    draft_passes: int = 0
    _book: RolloutBook | None = field(default=None, repr=False)
    _tok: list[int] = field(default_factory=list, repr=False)
    _lp: list[float] = field(default_factory=list, repr=False)

    @property
    def tokens(self) -> list[int]:
        if self._book is not None:
            return self._book.tokens_of(self)[0]
        return self._tok

    @property
    def logprobs(self) -> list[float]:
        if self._book is not None:
            return self._book.tokens_of(self)[1]
        return self._lp

    @property
    def generated(self) -> int:
        if self._book is not None:
            return self._book.length_of(self)
        return len(self._tok)

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - self.generated

    @property
    def done(self) -> bool:
        return self.finish is not None

    @property
    def migrated(self) -> bool:
        """Continued on another engine after partial generation."""
        return len(set(self.engines)) > 1


class ProtocolViolation(Exception):
    """An engine sent something inconsistent (the coordinator drops that engine)."""


_I64 = np.int64
_ID_LIMIT = 1 << 31  # the token pool is int32; positions and versions are 32-bit on the wire
FINISH_REASONS = ("eos", "length", "aborted")


def _below_zero(a: np.ndarray) -> bool:
    return a.dtype.kind == "i" and bool((a < 0).any())


class RolloutBook:
    def __init__(
        self, eos_id: int, page: int = 64, stop: StopStrings | None = None, vocab_size: int | None = None
    ) -> None:
        self.eos_id = eos_id
        # the model's vocabulary (its embedding's rows): an id outside it never gets in, or the learner's
        # embedding lookup fails on it (None: only the pool's int32 range is enforced)
        self.vocab_size = min(vocab_size, _ID_LIMIT) if vocab_size else _ID_LIMIT
        # algorithm.stop: checked here, on each response's whole token list (contracts/stop.py), so a
        # stop string split between two engines' parts of a migrated response is found all the same
        self.stop = stop
        self._stop_checked: dict[int, int] = {}  # handle -> tokens checked for stop strings so far
        self.stopped: list[tuple[str, str]] = []  # (engine, rid) ended by a stop string: abort it there
        self.responses: dict[str, Response] = {}
        self.queue: deque[str] = deque()
        self.by_engine: dict[str, set[str]] = {}
        self.migrations = 0  # responses whose tokens came from more than one engine (Response.migrated)
        self.redispatches = 0
        self._open: dict[int, int] = {}  # step -> responses not complete yet
        self._completed: list[Response] = []  # completed since the last drain_completed()
        if page < 1 or page & (page - 1):
            raise ValueError(f"page must be a power of two, got {page}")
        self._page = page
        self._page_shift = page.bit_length() - 1
        self._next_handle = 0
        self._eidx: dict[str, int] = {}
        self._alloc_slots(1024, max_pages=1)
        self._pool_ids = np.zeros(0, np.int32)
        self._pool_lps = np.zeros(0, np.float64)
        self._free = np.zeros(0, _I64)  # a stack of freed page numbers: _free[:_nfree]
        self._nfree = 0
        self._pool_pages = 0

    # ---- slots -------------------------------------------------------------------------
    def _alloc_slots(self, cap: int, max_pages: int) -> None:
        self._cap = cap
        self._hnd = np.full(cap, -1, _I64)  # handle held by each slot (-1: free)
        self._len = np.zeros(cap, _I64)
        self._owner = np.full(cap, -1, _I64)  # engine index, -1 when unassigned or done
        self._budget = np.zeros(cap, _I64)
        self._ver = np.zeros(cap, _I64)
        self._last = np.full(cap, -1, _I64)
        self._taken_len = np.zeros(cap, _I64)
        self._pt = np.full((cap, max_pages), -1, _I64)  # page table
        self._mark = np.zeros(cap, _I64)  # scratch: duplicate detection within a frame
        self._resp: list[Response | None] = [None] * cap

    def _grow(self, cap: int | None = None, max_pages: int | None = None) -> None:
        """Rehash every live slot into bigger arrays (slot = handle mod capacity)."""
        old = (self._hnd, self._len, self._owner, self._budget, self._ver, self._last, self._taken_len, self._pt)
        old_resp = self._resp
        cap = cap or self._cap
        max_pages = max(max_pages or 0, self._pt.shape[1])
        live = np.nonzero(old[0] >= 0)[0]
        while True:
            new_slots = old[0][live] & (cap - 1)
            if np.unique(new_slots).size == live.size:
                break
            cap *= 2
        self._alloc_slots(cap, max_pages)
        for dst, src in zip(
            (self._hnd, self._len, self._owner, self._budget, self._ver, self._last, self._taken_len), old
        ):
            dst[new_slots] = src[live]
        self._pt[new_slots, : old[7].shape[1]] = old[7][live]
        for s_old, s_new in zip(live.tolist(), new_slots.tolist()):
            self._resp[s_new] = old_resp[s_old]

    def _slot(self, r: Response) -> int:
        return r.handle & (self._cap - 1)

    def _engine_index(self, engine: str) -> int:
        i = self._eidx.get(engine)
        if i is None:
            i = self._eidx[engine] = len(self._eidx)
        return i

    # ---- steps -------------------------------------------------------------------------
    def add(self, responses: Iterable[Response]) -> None:
        for r in responses:
            if r.rid in self.responses:
                raise ValueError(f"duplicate request id {r.rid}")
            pages = -(-max(r.max_new_tokens, 1) // self._page)
            if pages > self._pt.shape[1]:
                self._grow(max_pages=pages)
            h = self._next_handle
            while self._hnd[h & (self._cap - 1)] >= 0:
                self._grow(cap=self._cap * 2)
            self._next_handle += 1
            s = h & (self._cap - 1)
            self._hnd[s], self._len[s], self._owner[s], self._last[s] = h, 0, -1, -1
            self._budget[s], self._ver[s], self._taken_len[s] = r.max_new_tokens, r.version, 0
            self._resp[s] = r
            r.handle, r._book = h, self
            if r.first_version < 0:
                r.first_version = r.version
            self.responses[r.rid] = r
            self.queue.append(r.rid)
            self._open[r.step] = self._open.get(r.step, 0) + 1

    def outstanding(self, step: int) -> int:
        return self._open.get(step, 0)

    def drain_completed(self) -> list[Response]:
        """Responses completed since the last call, in completion order."""
        out, self._completed = self._completed, []
        return out

    def discard(self, rids: Iterable[str]) -> None:
        """Drop responses for good (tail batching abandons a round's unfinished groups)."""
        for rid in rids:
            r = self.responses.pop(rid, None)
            if r is None:
                continue
            self._unassign(r)
            if not r.done:
                self._open[r.step] -= 1
            r._tok, r._lp = self.tokens_of(r)
            self._free_slot(self._slot(r))
            r._book = None

    def prune_queue(self) -> None:
        """Forget queue entries that no longer need dispatch."""
        self.queue = deque(
            rid for rid in self.queue if (r := self.responses.get(rid)) is not None and not r.done and r.engine is None
        )

    def collect(self, step: int) -> list[Response]:
        """Remove and return a finished step's responses (tokens move into the Response objects)."""
        out = [r for r in self.responses.values() if r.step == step]
        if any(not r.done for r in out):
            raise RuntimeError(f"step {step} still has unfinished responses")
        for r in out:
            r._tok, r._lp = self.tokens_of(r)
            s = self._slot(r)
            self._free_slot(s)
            r._book = None
            del self.responses[r.rid]
        self._open.pop(step, None)
        return out

    def _free_slot(self, s: int) -> None:
        pages = self._pt[s]
        used = pages[pages >= 0]
        if used.size:
            if self._nfree + used.size > self._free.size:
                grown = np.zeros(max(2 * self._free.size, self._nfree + used.size), _I64)
                grown[: self._nfree] = self._free[: self._nfree]
                self._free = grown
            self._free[self._nfree : self._nfree + used.size] = used
            self._nfree += used.size
        self._pt[s] = -1
        self._stop_checked.pop(int(self._hnd[s]), None)
        self._hnd[s], self._owner[s], self._len[s] = -1, -1, 0
        self._resp[s] = None

    # ---- dispatch ----------------------------------------------------------------------
    def take(self, engine: str, n: int, version: int) -> list[Response]:
        """Assign up to n queued responses of `version` to `engine`."""
        out: list[Response] = []
        skipped: list[str] = []
        e = self._engine_index(engine)
        while self.queue and len(out) < n:
            rid = self.queue.popleft()
            r = self.responses.get(rid)
            if r is None or r.done or r.engine is not None:
                continue
            if r.version != version:
                skipped.append(rid)
                continue
            self._assign(r, engine, e)
            out.append(r)
        self.queue.extendleft(reversed(skipped))
        return out

    def _assign(self, r: Response, engine: str, e: int) -> None:
        s = self._slot(r)
        r.engine = engine
        r.dispatches += 1
        if r.dispatches > 1:
            self.redispatches += 1
        self._owner[s] = e
        self._taken_len[s] = self._len[s]
        self.by_engine.setdefault(engine, set()).add(r.rid)

    def assign(self, plan: Sequence[tuple[str, str]], version: int) -> dict[str, list[Response]]:
        """Assign queued responses as a policy planned ((rid, engine) pairs, taken from the queue's
        head); returns what each engine got, in queue order. Costs O(how deep the plan reaches)."""
        want = dict(plan)
        out: dict[str, list[Response]] = {}
        keep: list[str] = []
        while want and self.queue:
            rid = self.queue.popleft()
            eng = want.pop(rid, None)
            r = self.responses.get(rid)
            if r is None or r.done or r.engine is not None:
                continue  # stale entry
            if eng is None or r.version != version:
                keep.append(rid)
                continue
            self._assign(r, eng, self._engine_index(eng))
            out.setdefault(eng, []).append(r)
        self.queue.extendleft(reversed(keep))
        return out

    def assigned(self, engine: str) -> set[str]:
        return self.by_engine.get(engine, set())

    # ---- streaming ---------------------------------------------------------------------
    def accept(self, engine: str, rid: str, offset: int, ids: list[int], logprobs: list[float], version: int) -> int:
        """Append streamed tokens of one response; returns how many were new. Stale frames are ignored."""
        return self.accept_chunks(engine, [(rid, offset, ids, logprobs, version)])

    def accept_chunks(self, engine: str, chunks: Sequence[tuple[str, int, Sequence[int], Sequence[float], int]]) -> int:
        """Many (rid, offset, ids, logprobs, version) chunks, e.g. one JSON tokens frame."""
        if not chunks:
            return 0
        handles, offsets, counts, ids, lps = [], [], [], [], []
        versions = set()
        for rid, off, cids, clps, ver in chunks:
            if len(cids) != len(clps):
                raise ProtocolViolation(f"{rid}: {len(cids)} ids but {len(clps)} logprobs")
            r = self.responses.get(rid)
            handles.append(r.handle if r is not None else -1)
            offsets.append(off)
            counts.append(len(cids))
            ids.extend(cids)
            lps.extend(clps)
            versions.add(ver)
        if len(versions) > 1:  # columns carry one version; split mixed frames
            return sum(self.accept_chunks(engine, [c]) for c in chunks)
        try:
            cols = [np.asarray(c, _I64) for c in (handles, offsets, counts, ids)]
            lp = np.asarray(lps, np.float64)
        except (OverflowError, ValueError, TypeError) as e:  # a value no int64 / float64 holds
            raise ProtocolViolation(f"a token chunk holds a value out of range ({e})") from None
        return self.accept_columns(engine, versions.pop(), *cols, lp)

    def accept_columns(
        self,
        engine: str,
        version: int,
        handles: np.ndarray,
        offsets: np.ndarray,
        counts: np.ndarray,
        ids: np.ndarray,
        lps: np.ndarray,
    ) -> int:
        """Append a frame of token chunks (columns, see rlboost/contracts/token_frames.py); returns new tokens.

        All-or-nothing: a violation anywhere (ProtocolViolation) raises before anything is stored."""
        self._check_columns(version, handles, offsets, counts, ids, lps)
        n = self._accept_columns(engine, version, handles, offsets, counts, ids, lps)
        if n and self.stop is not None:
            self._check_stops(engine, handles)
        return n

    def _check_columns(self, version, handles, offsets, counts, ids, lps) -> None:
        """Every value of a frame, whatever path it came by (binary frame, JSON, a direct call): shapes
        that agree, counts that add up, positions and version in range, ids in the vocabulary, finite
        log-probs. A few vectorised passes over the frame."""
        cols = (handles, offsets, counts, ids)
        if not all(isinstance(c, np.ndarray) and c.ndim == 1 and c.dtype.kind in "iu" for c in cols) or not (
            isinstance(lps, np.ndarray) and lps.ndim == 1 and lps.dtype.kind == "f"
        ):
            raise ProtocolViolation("token columns are not 1-d integer ids and float log-probs")
        k, n = handles.shape[0], ids.shape[0]
        if offsets.shape[0] != k or counts.shape[0] != k or lps.shape[0] != n:
            raise ProtocolViolation(
                f"column lengths differ ({k} handles, {offsets.shape[0]} offsets, "
                f"{counts.shape[0]} counts, {n} ids, {lps.shape[0]} log-probs)"
            )
        if not 0 <= version < _ID_LIMIT:
            raise ProtocolViolation(f"version {version} out of range")
        if k and (_below_zero(counts) or _below_zero(offsets) or int(offsets.max()) >= _ID_LIMIT):
            raise ProtocolViolation("a negative count, or an offset out of range")
        if int(counts.sum(dtype=_I64)) != n:
            raise ProtocolViolation(f"chunk counts add up to {int(counts.sum(dtype=_I64))}, not the {n} ids sent")
        if n and (_below_zero(ids) or int(ids.max()) >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)]
            raise ProtocolViolation(f"token id {int(bad[0])} outside the model's vocabulary of {self.vocab_size}")
        if n and not np.isfinite(lps).all():
            raise ProtocolViolation("a log-prob that is not finite")

    def _accept_columns(self, engine, version, handles, offsets, counts, ids, lps) -> int:
        e = self._eidx.get(engine)
        k = handles.shape[0]
        if e is None or k == 0:
            return 0
        h = handles.astype(_I64, copy=False)
        slot = h & (self._cap - 1)
        own = (h >= 0) & (self._hnd[slot] == h) & (self._owner[slot] == e)
        if not own.all():  # late frames for responses this engine no longer holds: drop those chunks
            if not own.any():
                return 0
            tok_mask = np.repeat(own, counts.astype(_I64, copy=False))
            h, slot, offsets, counts = h[own], slot[own], offsets[own], counts[own]
            ids, lps = ids[tok_mask], lps[tok_mask]
            k = h.shape[0]
        # one response named twice in a frame? (a scratch mark per slot instead of a sort)
        order = np.arange(k, dtype=_I64)
        self._mark[slot] = order
        if (self._mark[slot] != order).any():
            return self._accept_one_by_one(engine, version, h, offsets, counts, ids, lps)
        cnt = counts.astype(_I64, copy=False)
        off = offsets.astype(_I64, copy=False)
        cur = self._len[slot]
        if (off == cur).all() and not (
            (self._ver[slot] != version) | (cur + cnt > self._budget[slot]) | (self._last[slot] == self.eos_id)
        ).any():
            # the common case: every chunk continues its response exactly, within budget
            n = ids.shape[0]
            starts = np.cumsum(cnt) - cnt
            t_slot = np.repeat(slot, cnt)
            t_pos = np.arange(n, dtype=_I64) + np.repeat(off - starts, cnt)
            self._store(t_slot, t_pos, ids, lps)
            self._len[slot] = cur + cnt
            has = cnt > 0
            self._last[slot[has]] = ids[(starts + cnt - 1)[has]]
            return n
        wrong = self._ver[slot] != version
        if wrong.any():
            i = int(np.argmax(wrong))
            raise ProtocolViolation(
                f"{self._rid(slot[i])}: tokens of version {version}, step needs {int(self._ver[slot[i]])}"
            )
        if (off > cur).any():
            i = int(np.argmax(off > cur))
            raise ProtocolViolation(f"{self._rid(slot[i])}: gap (offset {off[i]}, have {cur[i]})")
        keep = np.maximum(cnt - (cur - off), 0)
        over = keep > self._budget[slot] - cur
        if over.any():
            i = int(np.argmax(over))
            raise ProtocolViolation(f"{self._rid(slot[i])}: {keep[i]} tokens exceed the remaining budget")
        after_eos = (keep > 0) & (self._last[slot] == self.eos_id)
        if after_eos.any():
            raise ProtocolViolation(f"{self._rid(slot[int(np.argmax(after_eos))])}: tokens after EOS")
        total = int(keep.sum())
        if total == 0:
            return 0
        n = int(cnt.sum())
        starts = np.cumsum(cnt) - cnt
        within = np.arange(n, dtype=_I64) - np.repeat(starts, cnt)
        if total == n:
            t_slot = np.repeat(slot, cnt)
            t_pos = np.repeat(off, cnt) + within
            t_ids, t_lps = ids, lps
        else:
            mask = within >= np.repeat(cnt - keep, cnt)
            t_slot = np.repeat(slot, cnt)[mask]
            t_pos = (np.repeat(off, cnt) + within)[mask]
            t_ids, t_lps = ids[mask], lps[mask]
        self._store(t_slot, t_pos, t_ids, t_lps)
        has = keep > 0
        self._len[slot[has]] = cur[has] + keep[has]
        self._last[slot[has]] = ids[(starts + cnt - 1)[has]]
        return total

    def _accept_one_by_one(self, engine, version, h, offsets, counts, ids, lps) -> int:
        """A frame that names one response twice (rare): check its chunks in order against running
        lengths, then store everything at once - still all-or-nothing."""
        del engine  # ownership was checked by the caller
        slot = (h & (self._cap - 1)).tolist()
        cur: dict[int, int] = {}
        last: dict[int, int] = {}
        t_slot: list[int] = []
        t_pos: list[int] = []
        t_idx: list[int] = []
        pos = 0
        for s, off, c in zip(slot, offsets.tolist(), counts.tolist()):
            n = cur.get(s, int(self._len[s]))
            lt = last.get(s, int(self._last[s]))
            if int(self._ver[s]) != version:
                raise ProtocolViolation(f"{self._rid(s)}: tokens of version {version}, step needs {int(self._ver[s])}")
            if off > n:
                raise ProtocolViolation(f"{self._rid(s)}: gap (offset {off}, have {n})")
            kk = max(c - (n - off), 0)
            if kk > int(self._budget[s]) - n:
                raise ProtocolViolation(f"{self._rid(s)}: {kk} tokens exceed the remaining budget")
            if kk and lt == self.eos_id:
                raise ProtocolViolation(f"{self._rid(s)}: tokens after EOS")
            if kk:
                t_idx.extend(range(pos + c - kk, pos + c))
                t_slot.extend([s] * kk)
                t_pos.extend(range(n, n + kk))
                cur[s] = n + kk
                last[s] = int(ids[pos + c - 1])
            pos += c
        if not t_idx:
            return 0
        idx = np.asarray(t_idx, _I64)
        self._store(np.asarray(t_slot, _I64), np.asarray(t_pos, _I64), ids[idx], lps[idx])
        for s, n in cur.items():
            self._len[s] = n
            self._last[s] = last[s]
        return len(t_idx)

    def _check_stops(self, engine: str, handles: np.ndarray) -> None:
        """End the responses of this frame whose text now holds a stop string (at that token: the rest
        of what arrived is dropped) and complete them; their engine is to abort them (`stopped`)."""
        assert self.stop is not None
        e = self._eidx[engine]
        for h in np.unique(handles.astype(_I64, copy=False)).tolist():
            s = h & (self._cap - 1)
            if h < 0 or self._hnd[s] != h or self._owner[s] != e:
                continue
            n, checked = int(self._len[s]), self._stop_checked.get(h, 0)
            if n <= checked:
                continue
            r = self._resp[s]
            assert r is not None
            toks = self._ids_of(s)
            end = self.stop.end(toks, checked)
            self._stop_checked[h] = n if end is None else end
            if end is None:
                continue
            self._len[s], self._last[s] = end, toks[end - 1]
            r.finish = "eos" if toks[end - 1] == self.eos_id else "stop"
            self._open[r.step] -= 1
            self._completed.append(r)
            self._unassign(r)
            self.stopped.append((engine, r.rid))

    def take_stopped(self) -> list[tuple[str, str]]:
        """(engine, rid) of the responses stop strings ended since the last call: abort each there."""
        out, self.stopped = self.stopped, []
        return out

    def _store(self, t_slot: np.ndarray, t_pos: np.ndarray, t_ids: np.ndarray, t_lps: np.ndarray) -> None:
        pt = self._pt.reshape(-1)  # a view: one flat gather is cheaper than a 2-D one
        key = t_slot * self._pt.shape[1] + (t_pos >> self._page_shift)
        page = pt[key]
        if (page < 0).any():
            keys = np.unique(key[page < 0])
            pt[keys] = self._alloc_pages(keys.size)
            page = pt[key]
        flat = (page << self._page_shift) | (t_pos & (self._page - 1))
        self._pool_ids[flat] = t_ids
        self._pool_lps[flat] = t_lps

    def _alloc_pages(self, n: int) -> np.ndarray:
        take = min(n, self._nfree)
        got = self._free[self._nfree - take : self._nfree].copy()
        self._nfree -= take
        short = n - take
        if short > 0:
            first = self._pool_pages
            self._pool_pages += short
            if self._pool_pages * self._page > self._pool_ids.shape[0]:
                size = max(self._pool_pages, 2 * self._pool_ids.shape[0] // self._page) * self._page
                ids = np.zeros(size, np.int32)
                lp = np.zeros(size, np.float64)
                ids[: self._pool_ids.shape[0]] = self._pool_ids
                lp[: self._pool_lps.shape[0]] = self._pool_lps
                self._pool_ids, self._pool_lps = ids, lp
            fresh = np.arange(first, first + short, dtype=_I64)
            got = np.concatenate([got, fresh]) if take else fresh
        return got

    def _rid(self, slot: int) -> str:
        r = self._resp[int(slot)]
        return r.rid if r is not None else "?"

    def _pool_index(self, s: int) -> np.ndarray:
        """Where the tokens of the response in slot s are in the pool, in order."""
        n, P = int(self._len[s]), self._page
        pages = self._pt[s, : -(-n // P)]
        return (pages[:, None] * P + np.arange(P)).ravel()[:n]

    def _ids_of(self, s: int) -> np.ndarray:
        return self._pool_ids[self._pool_index(s)]

    def tokens_of(self, r: Response) -> tuple[list[int], list[float]]:
        s = self._slot(r)
        if self._hnd[s] != r.handle:
            return r._tok, r._lp
        if self._len[s] == 0:
            return [], []
        idx = self._pool_index(s)
        return self._pool_ids[idx].tolist(), self._pool_lps[idx].tolist()

    def length_of(self, r: Response) -> int:
        s = self._slot(r)
        return int(self._len[s]) if self._hnd[s] == r.handle else len(r._tok)

    def lengths(self, rs: Sequence[Response]) -> np.ndarray:
        """Generated-token counts of many live responses at once."""
        if not rs:
            return np.zeros(0, _I64)
        h = np.fromiter((r.handle for r in rs), _I64, len(rs))
        return self._len[h & (self._cap - 1)].copy()

    def finish(self, engine: str, rid: str, reason: str, length: int) -> bool:
        """An engine says a response ended. Returns True if that completed it."""
        if reason not in FINISH_REASONS or not 0 <= length < _ID_LIMIT:
            raise ProtocolViolation(f"{rid}: finished with reason {reason!r}, length {length}")
        r = self.responses.get(rid)
        if r is None or r.engine != engine or r.done:
            return False
        s = self._slot(r)
        if reason in ("eos", "length") and length == int(self._len[s]) and self._complete(r, s):
            self._unassign(r)
            return True
        # aborted, or its claim does not match what we hold: continue elsewhere
        self._unassign(r)
        self.queue.append(rid)
        return False

    def release(self, engine: str) -> list[str]:
        """The engine is gone or draining: requeue (or complete) everything it held."""
        rids = sorted(self.by_engine.pop(engine, set()))
        requeued = []
        for rid in rids:
            r = self.responses[rid]
            self._unassign(r, drop_from_engine=False)
            if not r.done and not self._complete(r, self._slot(r)):
                requeued.append(rid)
        # front of the queue: these are the oldest work of the step
        self.queue.extendleft(reversed(requeued))
        return requeued

    def retag(self, steps: set[int], version: int) -> None:
        """Every unfinished response of `steps` continues on weights `version` (an in-flight swap): its
        next tokens must come from it; the version that began it stays `first_version`."""
        for r in self.responses.values():
            if r.step in steps and not r.done and r.version != version:
                s = self._slot(r)
                self._ver[s] = version
                r.version = version
                held = int(self._len[s])
                if r.swaps and r.swaps[-1][0] == held:  # none generated since the last swap: that one is void
                    r.swaps[-1] = (held, version)
                elif held:
                    r.swaps.append((held, version))
                else:  # nothing generated yet: the new version begins it
                    r.first_version = version

    def requeue(self, engine: str, rids: Iterable[str]) -> list[str]:
        """Take specific responses back from an engine (e.g. a tail migration or an offload)."""
        out = []
        for rid in rids:
            r = self.responses.get(rid)
            if r is None or r.engine != engine or r.done:
                continue
            self._unassign(r)
            if not self._complete(r, self._slot(r)):
                out.append(rid)
        self.queue.extendleft(reversed(out))
        return out

    # ---- internals ---------------------------------------------------------------------
    def _complete(self, r: Response, s: int) -> bool:
        """Mark complete if the tokens held already end the response."""
        if self._len[s] and self._last[s] == self.eos_id:
            r.finish = "eos"
        elif self._len[s] >= self._budget[s]:
            r.finish = "length"
        if r.done:
            self._open[r.step] -= 1
            self._completed.append(r)
        return r.done

    def _unassign(self, r: Response, drop_from_engine: bool = True) -> None:
        if r.engine is None:
            return
        s = self._slot(r)
        if self._len[s] > self._taken_len[s] and (not r.engines or r.engines[-1] != r.engine):
            if r.engines and r.engine not in r.engines and len(set(r.engines)) == 1:
                self.migrations += 1  # its tokens now come from a second engine: counted once
            r.engines.append(r.engine)
        if drop_from_engine:
            self.by_engine.get(r.engine, set()).discard(r.rid)
        self._owner[s] = -1
        r.engine = None
