"""The Engine protocol: what a rollout worker (or the trainer's own engine) generates with.

Engines are synchronous and run in a worker thread; they stream through a callback so the agent
can forward tokens while the batch is still decoding. Every engine passes tests/test_engine_contract.py.

Sampling is seeded per (request seed, token position) - see rlboost/contracts/sampling.py - so a response
that migrates to another engine continues exactly as it would have on the first one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["eos", "length", "aborted"]


@dataclass
class GenRequest:
    rid: str
    prompt: list[int]
    max_new_tokens: int  # remaining budget, not counting `prefix`
    seed: int
    prefix: list[int] = field(default_factory=list)  # tokens already generated elsewhere
    group: str | None = None  # GRPO group (prompt): co-batched siblings draft from each other
    # tokens of siblings generated elsewhere (as the coordinator held them at dispatch), for drafting;
    # requests of one group may share these list objects
    siblings: list[list[int]] = field(default_factory=list)

    @property
    def position0(self) -> int:
        """Response position of the first token this engine will generate."""
        return len(self.prefix)


@dataclass
class DraftCounts:
    """Speculative decoding of one response on one engine: drafted tokens verified, of which accepted,
    and the forward passes that verified a draft for it (each gains it accepted + 1 tokens)."""

    drafted: int = 0
    accepted: int = 0
    passes: int = 0


def check_requests(requests: list[GenRequest], max_len: int | None) -> None:
    """What every engine refuses before generating: duplicate ids, nothing to continue, and (with a
    `max_len`) a budget that cannot fit the model's context."""
    rids = [r.rid for r in requests]
    if len(set(rids)) != len(rids):
        raise ValueError("request ids must be unique within a generate call")
    if max_len is None:
        return
    for r in requests:
        used = len(r.prompt) + len(r.prefix)
        if used == 0:
            raise ValueError(f"{r.rid}: empty prompt and prefix")
        if used + r.max_new_tokens > max_len:
            raise ValueError(
                f"{r.rid}: prompt + prefix + max_new_tokens = {used + r.max_new_tokens} "
                f"exceeds the model's context length (block_size / max_model_len) {max_len}"
            )


# Engines that run a batch to its longest response before taking the next (finished rows still cost a
# decode step) and report its ends when it returns; the others (synthetic) batch continuously. The
# simulator models each engine the same way. (vLLM batches continuously inside one generate call but,
# like torch, takes no request mid-call; the simulator treats it as continuous.)
STATIC_BATCH_ENGINES = frozenset({"torch"})

# on_tokens(rid, response_offset, ids, logprobs): called as tokens are produced.
OnTokens = Callable[[str, int, list[int], list[float]], None]


@runtime_checkable
class Engine(Protocol):
    name: str
    version: int | None  # weight version loaded, None before the first load

    def load_weights(self, version: int, tensors: Mapping[str, object]) -> None:
        """Load a full set of weights in place (no restart)."""

    def generate(
        self,
        requests: list[GenRequest],
        on_tokens: OnTokens,
        should_abort: Callable[[str], bool],
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
    ) -> dict[str, FinishReason]:
        """Generate for all requests (batched); stream through on_tokens; return finish reasons.

        Tokens are drawn by contracts.sampling.sample's rule at (temperature, top_k, top_p).

        Checks should_abort(rid) between decode steps and stops such requests ("aborted").

        An engine that drafts (speculative decoding) also keeps `drafts: dict[rid, DraftCounts]` for the
        requests of its calls, which the worker reports (and removes) when it reports their ends."""
