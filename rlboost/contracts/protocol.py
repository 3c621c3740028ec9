"""Wire protocol between the coordinator (trainer) and rollout engines (workers).

Workers dial home: one WebSocket per worker at `/v1/worker`, authenticated with the job token
(`Authorization: Bearer ...`). Every frame is one JSON object with a `type` field, validated here
with size caps, so a malformed or hostile frame is rejected without touching job state.

Token streaming is batched per frame: one `tokens` frame carries the new tokens of many requests
(one decode step of a whole engine batch), which keeps frame rate independent of batch size. When the
welcome says `binary_tokens`, workers send token frames as binary columns instead (format and
validation in rlboost/contracts/token_frames.py); every other message stays JSON.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 8 * 1024 * 1024
MAX_IDS = 1 << 20

Rid = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")]
TokenIds = Annotated[list[Annotated[int, Field(ge=0, lt=1 << 31)]], Field(max_length=MAX_IDS)]
Logprobs = Annotated[list[Annotated[float, Field(allow_inf_nan=False)]], Field(max_length=MAX_IDS)]
Rate = Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)]  # finite: it feeds scheduling arithmetic
Count = Annotated[int, Field(ge=0, lt=1 << 31)]
GroupKey = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")]
# siblings' tokens one generate frame may carry for drafting (the coordinator sends fewer: SIBLING_TOKENS)
MAX_SIBLING_TOKENS = 1 << 19
WorkerId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
# what binds a worker id to the connection that holds it: the welcome hands one out, and only a hello that
# presents it may take that id over while its connection is still up (a reconnect; see rollout/live.py)
ResumeKey = Annotated[str, Field(min_length=32, max_length=64, pattern=r"^[0-9a-f]+$")]
# offsets, versions and lengths as numpy columns hold them (int64 arithmetic, 32-bit on the wire)
Position = Annotated[int, Field(ge=0, lt=1 << 31)]


class Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- worker -> coordinator -------------------------------------------------------------


class Hello(Msg):
    type: Literal["hello"] = "hello"
    protocol: int = PROTOCOL_VERSION
    worker_id: WorkerId
    kind: Literal["spot", "on-demand", "reserved"]
    engine: Literal["torch", "vllm", "synthetic"]
    capacity: Annotated[int, Field(ge=1, le=100_000)]  # concurrent sequences it will take
    # e.g. "A100:8": lets the coordinator use the accelerator's performance model before it has measured
    accelerator: Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9._-]+(:[0-9]+)?$")] | None = None
    cuda: bool = False  # its engine runs on a GPU: `weights.transport: auto` may broadcast to it over NCCL
    cloud: Annotated[str, Field(max_length=32, pattern=r"^[a-z0-9-]+$")] | None = None  # RLBOOST_CLOUD
    region: Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9._-]+$")] | None = None  # RLBOOST_REGION
    # a reconnect: the resume key its last welcome gave; lets it replace a connection of its id not yet
    # known dead (without it, a hello naming a live worker's id is refused)
    resume_key: ResumeKey | None = None


class Ready(Msg):
    """The worker holds `version` and takes work for it."""

    type: Literal["ready"] = "ready"
    version: Position
    pull_seconds: Rate = 0.0
    # concurrent sequences, once the engine is built (hello is sent before the worker knows it)
    capacity: Annotated[int, Field(ge=1, le=100_000)] | None = None


class TokenChunk(Msg):
    rid: Rid
    offset: Position  # index in the response of ids[0]
    ids: TokenIds
    logprobs: Logprobs
    version: Position


class Tokens(Msg):
    type: Literal["tokens"] = "tokens"
    chunks: Annotated[list[TokenChunk], Field(max_length=100_000)]


class Finished(Msg):
    """Requests that ended: `eos`/`length` complete them; `aborted` hands them back."""

    type: Literal["finished"] = "finished"
    rids: Annotated[list[Rid], Field(max_length=100_000)]
    reasons: Annotated[list[Literal["eos", "length", "aborted"]], Field(max_length=100_000)]
    lengths: Annotated[list[Position], Field(max_length=100_000)]
    # speculative decoding, per rid where the engine drafted (else empty): drafted tokens verified, of
    # which accepted, and the forward passes that verified a draft for it
    drafted: Annotated[list[Count], Field(max_length=100_000)] = Field(default_factory=list)
    accepted: Annotated[list[Count], Field(max_length=100_000)] = Field(default_factory=list)
    draft_passes: Annotated[list[Count], Field(max_length=100_000)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _draft_counts(self) -> Finished:
        n = {len(self.drafted), len(self.accepted), len(self.draft_passes)}
        if n != {0} and n != {len(self.rids)}:
            raise ValueError("drafted, accepted and draft_passes: one each per rid, or none")
        if any(a > d for a, d in zip(self.accepted, self.drafted)):
            raise ValueError("more tokens accepted than drafted")
        return self


class Draining(Msg):
    """A preemption notice arrived: the worker has sent what it has and takes no more work."""

    type: Literal["draining"] = "draining"
    reason: Annotated[str, Field(max_length=200)] = "preemption-notice"


class Heartbeat(Msg):
    type: Literal["heartbeat"] = "heartbeat"
    tokens_per_s: Rate = 0.0
    active: Annotated[int, Field(ge=0, le=1 << 31)] = 0


WorkerMsg = Annotated[Hello | Ready | Tokens | Finished | Draining | Heartbeat, Field(discriminator="type")]
worker_msg = TypeAdapter(WorkerMsg)


# ---- coordinator -> worker -------------------------------------------------------------


# in Welcome.model: true when model.path is a node path in a file_mounts destination (`~/models/x`),
# which each worker finds where its own node has the mount (contracts.mounts.node_path)
MOUNTED_PATH_KEY = "path_in_mount"


class Speculation(Msg):
    """rollout.speculative as engines get it (the job file's SpeculativeSpec; this module imports nothing
    of ours)."""

    method: Literal["none", "group", "ngram"] = "none"
    max_tokens: Annotated[int, Field(ge=1, le=64)] = 4


class Welcome(Msg):
    type: Literal["welcome"] = "welcome"
    worker_id: str
    version: int  # the version to pull now (-1: none published yet, wait for `version`)
    weights_url: str  # base URL of the weight publisher
    chunk_tokens: int
    heartbeat_s: float
    seed: int
    temperature: float
    top_k: int = 0  # algorithm.top_k / top_p: off by default (a trainer that sends neither)
    top_p: float = 1.0
    model: dict[str, Any]  # ModelSpec as JSON (+ MOUNTED_PATH_KEY): what engine to build
    engine_dtype: str
    engine_batch: int
    # send tokens as binary frames (rlboost/contracts/token_frames.py) using GenSpec.handle; JSON otherwise
    binary_tokens: bool = False
    flush_s: Annotated[float, Field(gt=0, le=10)] = 0.02  # how often to send the tokens produced
    speculative: Speculation = Speculation()  # rollout.speculative
    resume_key: str = ""  # present it in the hello of a reconnect (Hello.resume_key)


class GenSpec(Msg):
    """One generation request: continue `prefix` (already generated tokens) after `prompt`."""

    rid: Rid
    prompt: TokenIds
    prefix: TokenIds = Field(default_factory=list)
    max_new_tokens: Annotated[int, Field(ge=1)]  # remaining budget
    seed: int
    version: int
    handle: Annotated[int, Field(ge=0, lt=1 << 32)] | None = None  # names the request in binary frames
    group: GroupKey | None = None  # its GRPO group: Generate.siblings[group] drafts for it


class Generate(Msg):
    type: Literal["generate"] = "generate"
    requests: list[GenSpec]
    # speculative decoding by group: tokens of the requests' siblings generated elsewhere, as the
    # coordinator held them when it sent this, per group (once per frame, whatever the requests)
    siblings: Annotated[dict[GroupKey, list[TokenIds]], Field(max_length=100_000)] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bounded(self) -> Generate:
        if sum(len(s) for seqs in self.siblings.values() for s in seqs) > MAX_SIBLING_TOKENS:
            raise ValueError(f"siblings carry more than {MAX_SIBLING_TOKENS} tokens")
        return self


class Abort(Msg):
    type: Literal["abort"] = "abort"
    rids: list[Rid]


class Offer(Msg):
    """Get a version by a transport other than the pull: the transport's name (its registration in
    rlboost/weights/transports/) and its plan for this worker, which that transport validates (this
    module imports nothing of ours); for `torch`, a BroadcastPlan's JSON."""

    transport: Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9_-]*$")]
    plan: Annotated[dict[str, Any], Field(max_length=32)] = Field(default_factory=dict)


class NewVersion(Msg):
    type: Literal["version"] = "version"
    version: int
    offer: Offer | None = None  # None: pull it over HTTP (a worker whose offered transport fails pulls too)


class Shutdown(Msg):
    type: Literal["shutdown"] = "shutdown"
    reason: str = ""


CoordMsg = Annotated[Welcome | Generate | Abort | NewVersion | Shutdown, Field(discriminator="type")]
coord_msg = TypeAdapter(CoordMsg)
