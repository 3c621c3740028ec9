"""The synthetic engine: deterministic tokens at a modelled rate, with a prefill cost. No torch, no GPU.

It drives the control plane (coordinator, migration, offload, weight versions) at any scale without a
model. Timing follows rlboost/contracts/perf.py (continuous batching: a decode step of n sequences takes
step_time(n); admitting requests stalls decoding for their prefill), so a live run and the simulator
share one model. Token t of a response is a hash of (request seed, t) and the response ends with EOS at
the length LengthModel gives for (prompt, seed): a migrated response continues exactly as it would
have, and every engine agrees on every token.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rlboost.contracts.engine import FinishReason, GenRequest, OnTokens, check_requests
from rlboost.contracts.env_names import Env
from rlboost.contracts.lengths import LengthModel, mix64
from rlboost.contracts.perf import AcceleratorPerf, EngineModel, engine_model

EOS = 2
_FIRST_SYMBOL, _N_SYMBOLS = 4, 37  # the tiny tasks' symbol ids, so rewards and decode still work


def token_at(seed: int, pos: int) -> int:
    return _FIRST_SYMBOL + mix64((seed * 0x100000001B3) ^ pos) % _N_SYMBOLS


def logprob_at(seed: int, pos: int) -> float:
    return -0.05 - (mix64(seed ^ (pos << 20) ^ 0xABCDEF) % 1000) / 1000.0


def response_end(req: GenRequest, lengths: LengthModel) -> tuple[int, bool]:
    """(position after the last token, ends with EOS) for a request, counting the prefix."""
    full = lengths.length(req.prompt, req.seed)
    budget_end = len(req.prefix) + req.max_new_tokens
    if full <= budget_end:
        return full, True
    return budget_end, False


@dataclass
class _Seq:
    req: GenRequest
    pos: int  # next response position to generate
    end: int
    eos: bool


# admit(n) -> up to n more requests that arrived while generating (continuous batching)
Admit = Callable[[int], list[GenRequest]]
OnFinish = Callable[[str, FinishReason], None]


class SyntheticEngine:
    name = "synthetic"
    continuous = True  # takes new requests mid-batch (admit) and reports each end at once (on_finish)

    def __init__(
        self,
        model: EngineModel,
        lengths: LengthModel,
        *,
        tick_s: float = 0.01,
        prompt_tokens: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.model = model
        self.lengths = lengths
        self.tick_s = tick_s
        self.clock = clock
        self.sleep = sleep
        self.version: int | None = None
        self.max_batch = model.capacity
        self.prompt_tokens = prompt_tokens  # prefill is charged for this prompt length when set

    def load_weights(self, version: int, tensors: Mapping[str, object]) -> None:
        if not isinstance(tensors, Mapping):
            raise ValueError("weights must be a mapping of name -> tensor")
        self.version = version

    def generate(
        self,
        requests: list[GenRequest],
        on_tokens: OnTokens,
        should_abort: Callable[[str], bool],
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        admit: Admit | None = None,
        on_finish: OnFinish | None = None,
    ) -> dict[str, FinishReason]:
        del temperature, top_k, top_p  # the synthetic "distribution" is fixed
        check_requests(requests, None)  # no context limit: a synthetic engine holds no KV
        reasons: dict[str, FinishReason] = {}
        pending: deque[GenRequest] = deque(requests)
        live: dict[str, _Seq] = {}
        cap = self.model.capacity

        def end(rid: str, why: FinishReason) -> None:
            live.pop(rid, None)
            reasons[rid] = why
            if on_finish is not None:
                on_finish(rid, why)

        last = self.clock()
        carry = 0.0
        while True:
            if admit is not None and len(live) + len(pending) < cap:
                pending.extend(admit(cap - len(live) - len(pending)))
            prefill = 0
            while pending and len(live) < cap:
                r = pending.popleft()
                if r.rid in live:  # (an rid may come back after it ended here: aborted, then re-sent)
                    raise ValueError(f"{r.rid}: request id already running in this batch")
                stop, eos = response_end(r, self.lengths)
                if r.max_new_tokens <= 0 or stop <= len(r.prefix):
                    end(r.rid, "length")
                    continue
                live[r.rid] = _Seq(r, len(r.prefix), stop, eos)
                prefill += (self.prompt_tokens or len(r.prompt)) + len(r.prefix)
            if prefill:
                # decoding stalls while new sequences are prefilled
                self.sleep(self.model.prefill_time(prefill))
                last = self.clock()
            for rid in [rid for rid in live if should_abort(rid)]:
                end(rid, "aborted")
            if not live:
                if pending:
                    continue
                return reasons
            self.sleep(self.tick_s)
            now = self.clock()
            steps = (now - last) / self.model.step_time(len(live)) + carry
            k = int(steps)
            carry, last = steps - k, now
            if k <= 0:
                continue
            for s in list(live.values()):
                m = min(k, s.end - s.pos)
                seed, p0 = s.req.seed, s.pos
                ids = [token_at(seed, p) for p in range(p0, p0 + m)]
                if s.eos and p0 + m == s.end:
                    ids[-1] = EOS
                on_tokens(s.req.rid, p0, ids, [logprob_at(seed, p) for p in range(p0, p0 + m)])
                s.pos += m
                if s.pos >= s.end:
                    end(s.req.rid, "eos" if s.eos else "length")


def model_from_welcome(
    model: Mapping, max_batch: int, env: Mapping[str, str] | None = None
) -> tuple[EngineModel, LengthModel]:
    """The engine and length models for this node from the welcome's model dict.

    The trainer sends the job's performance table and length model; the node's accelerator
    (RLBOOST_ACCELERATOR, e.g. 'A100:8') and relative speed (RLBOOST_ENGINE_SPEED) come from its
    launch environment."""
    env = os.environ if env is None else env
    syn = model.get("synthetic") or {}
    table = {k: AcceleratorPerf(**v) for k, v in (syn.get("perf") or {}).items()}
    acc = env.get(Env.ACCELERATOR) or syn.get("default_accelerator") or "cpu"
    speed = float(env.get(Env.ENGINE_SPEED) or 1.0)
    em = engine_model(acc, table, max_batch, speed=speed)
    lens = syn.get("lengths") or {}
    lm = LengthModel(
        median=float(lens.get("median", 100.0)),
        sigma=float(lens.get("sigma", 0.8)),
        prompt_sigma=float(lens.get("prompt_sigma", 0.5)),
        recorded=tuple(int(x) for x in lens.get("recorded", ())),
    )
    return em, lm


def engine_from_welcome(model: Mapping, max_batch: int, env: Mapping[str, str] | None = None) -> SyntheticEngine:
    em, lm = model_from_welcome(model, max_batch, env)
    pt = (model.get("synthetic") or {}).get("prompt_tokens")
    return SyntheticEngine(em, lm, prompt_tokens=int(pt) if pt else None)
