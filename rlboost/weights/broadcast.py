"""Weight broadcast over torch.distributed: the mechanism of the `torch` transport for workers in the
trainer's own network (rlboost/weights/transports/torch_broadcast.py says who gets it and drives both
ends), beside the HTTP pull (rlboost/weights/publisher.py, rlboost/weights/pull.py).

Per transfer the trainer opens a fresh TCPStore (its own rendezvous address) and announces a
`BroadcastPlan` to the members that asked for the version: the version's manifest (the same one the
HTTP path serves), the store's address, the members (rank = position + 1; the trainer is rank 0),
the backend (nccl on GPUs, gloo on CPU: CI runs the same code with gloo) and timeouts. Everyone then
builds a process group of their own on that store (`ProcessGroupGloo(store, rank, size)`, not the
process's default group, which the trainer may already use for training and which cannot take new
members) and the trainer broadcasts the version's buffer bucket by bucket. A member checks every
chunk of a bucket against the manifest's digest before it counts, so a corrupt or incomplete
broadcast is never loaded.

A member that dies mid-broadcast breaks the collective for everyone. The survivors then regroup on
the same store: each reports how many buckets it holds, the trainer waits `regroup_s` for the
reports (the dead never report), and a new group of those who did resumes from the first bucket
they all lack. After `max_rounds` failed rounds, or when a member is left out, the member falls
back to the HTTP pull (the worker's WeightNode does). Every wait is bounded, so neither side hangs.

Store keys (one prefix per round `r<n>/`):
    r<n>/alive/<member>  member -> trainer: buckets held (rounds after the first)
    r<n>/plan            trainer -> members: {"members": [...], "start": bucket} (rounds after the first)
    done/<member>        member -> trainer: every chunk verified
"""

from __future__ import annotations

import contextlib
import datetime
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlboost.contracts.weight_manifest import ChunkInfo, Manifest
from rlboost.weights.buffers import HostBuffer

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

Backend = Literal["gloo", "nccl"]
DEFAULT_BUCKET_BYTES = 64 * 1024 * 1024  # few collectives per version; a bucket is whole chunks
_POLL_S = 0.05


class BroadcastError(RuntimeError):
    """This member did not get the version over the broadcast (it should pull it over HTTP)."""


class BroadcastPlan(BaseModel):
    """What the trainer tells each member before a broadcast (over the HTTP control path)."""

    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=0)
    manifest: Manifest
    backend: Backend
    host: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    members: list[str] = Field(min_length=1)  # rank = position + 1 in the first round
    bucket_bytes: int = Field(ge=1)
    timeout_s: float = Field(gt=0)  # one collective, one store operation
    regroup_s: float = Field(gt=0)  # how long the trainer waits for survivors to report
    max_rounds: int = Field(default=2, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> BroadcastPlan:
        if self.manifest.version != self.version:
            raise ValueError(f"plan for version {self.version} carries the manifest of {self.manifest.version}")
        if len(set(self.members)) != len(self.members):
            raise ValueError("plan members must be unique")
        return self

    @property
    def rendezvous(self) -> str:
        return f"tcp://{self.host}:{self.port}"


@dataclass(frozen=True)
class Bucket:
    index: int
    offset: int
    size: int
    chunks: tuple[ChunkInfo, ...]


def buckets(m: Manifest, bucket_bytes: int) -> list[Bucket]:
    """Consecutive chunks grouped up to `bucket_bytes` (at least one chunk per bucket)."""
    out: list[Bucket] = []
    group: list[ChunkInfo] = []
    for c in m.chunks:
        if group and sum(g.size for g in group) + c.size > bucket_bytes:
            out.append(_bucket(len(out), group))
            group = []
        group.append(c)
    if group:
        out.append(_bucket(len(out), group))
    return out


def _bucket(index: int, group: list[ChunkInfo]) -> Bucket:
    return Bucket(index, group[0].offset, sum(c.size for c in group), tuple(group))


# ---- process groups -----------------------------------------------------------------------------


def _timeout(s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=s)


def open_store(plan_host: str, port: int, timeout_s: float, *, master: bool) -> dist.Store:
    import torch.distributed as dist

    return dist.TCPStore(plan_host, port, None, master, _timeout(timeout_s), wait_for_workers=False)


def make_group(backend: Backend, store: dist.Store, rank: int, size: int, timeout_s: float) -> dist.ProcessGroup:
    """A process group of its own on `store` (not the process's default group)."""
    import torch.distributed as dist

    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, size, _timeout(timeout_s))
    nccl = getattr(dist, "ProcessGroupNCCL", None)
    if nccl is None:
        raise BroadcastError("this torch build has no NCCL (a CPU build?): use weights.transport: http or gloo")
    opts = nccl.Options()
    opts._timeout = _timeout(timeout_s)
    return nccl(store, rank, size, opts)


def close_group(pg: dist.ProcessGroup | None, backend: Backend) -> None:
    """Release a group, broken or not. NCCL must be aborted or its destructor waits on a dead peer;
    gloo must not be (its abort leaves the sockets open, so the other members would wait out their
    timeout): dropping the last reference closes its connections at once, which tells them."""
    if pg is not None and backend == "nccl":
        with contextlib.suppress(Exception):  # already broken: nothing more to release
            pg.abort()


def broadcast_bucket(pg: dist.ProcessGroup, flat: torch.Tensor, b: Bucket, device: str, timeout_s: float) -> None:
    """Broadcast `flat[b]` from rank 0 into every rank's `flat[b]` (through `device` for NCCL)."""
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank, opts.timeout = 0, _timeout(timeout_s)
    host = flat[b.offset : b.offset + b.size]
    if device == "cpu":
        pg.broadcast([host], opts).wait()
        return
    dev = host.to(device, non_blocking=False)
    pg.broadcast([dev], opts).wait()
    host.copy_(dev.cpu())


def flat_bytes(buf: HostBuffer) -> torch.Tensor:
    import torch

    return torch.frombuffer(buf.view, dtype=torch.uint8) if buf.size else torch.empty(0, dtype=torch.uint8)


# ---- the trainer's side -------------------------------------------------------------------------


@dataclass
class BroadcastResult:
    version: int
    delivered: list[str] = field(default_factory=list)  # verified every chunk
    missed: list[str] = field(default_factory=list)  # must pull over HTTP (dead, left out, or failed)
    rounds: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class BroadcastOptions:
    backend: Backend = "gloo"
    bind_host: str = "127.0.0.1"  # where the store listens
    advertise_host: str | None = None  # the address members dial (default: bind_host)
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    timeout_s: float = 30.0
    regroup_s: float = 5.0
    max_rounds: int = 2
    device: str = "cpu"  # where rank 0's bucket goes for NCCL ("cuda:0")


class Transfer:
    """One version to one set of members: a fresh store (its own port), then `send`."""

    def __init__(self, manifest: Manifest, members: list[str], opts: BroadcastOptions) -> None:
        self.opts = opts
        self.store = open_store(opts.bind_host, 0, opts.timeout_s, master=True)
        self.plan = BroadcastPlan(
            version=manifest.version,
            manifest=manifest,
            backend=opts.backend,
            host=opts.advertise_host or opts.bind_host,
            port=self.store.port,
            members=members,
            bucket_bytes=opts.bucket_bytes,
            timeout_s=opts.timeout_s,
            regroup_s=opts.regroup_s,
            max_rounds=opts.max_rounds,
        )

    def send(self, buf: HostBuffer) -> BroadcastResult:
        """Broadcast `buf` (the published version's buffer) to the plan's members; returns who got it.
        Never raises for a member's failure and returns within about
        max_rounds * (buckets * timeout_s + regroup_s)."""
        p, t0 = self.plan, time.monotonic()
        bs = buckets(p.manifest, p.bucket_bytes)
        flat = flat_bytes(buf)
        members, start = list(p.members), 0
        res = BroadcastResult(p.version)
        for rnd in range(p.max_rounds):
            res.rounds = rnd + 1
            if rnd:
                members, start = self._regroup(rnd, members)
                if not members:
                    break
            if self._round(rnd, members, flat, bs[start:]):
                res.delivered = self._acks(members)
                break
        res.missed = [m for m in p.members if m not in res.delivered]
        res.seconds = time.monotonic() - t0
        return res

    def _round(self, rnd: int, members: list[str], flat: torch.Tensor, todo: list[Bucket]) -> bool:
        import torch.distributed as dist

        pg = None
        try:
            pg = make_group(
                self.plan.backend, dist.PrefixStore(f"r{rnd}/pg", self.store), 0, len(members) + 1, self.plan.timeout_s
            )
            for b in todo:
                broadcast_bucket(pg, flat, b, self.opts.device, self.plan.timeout_s)
            return True
        except (RuntimeError, dist.DistError):  # a member died or timed out: regroup
            return False
        finally:
            close_group(pg, self.plan.backend)
            del pg

    def _regroup(self, rnd: int, members: list[str]) -> tuple[list[str], int]:
        """Wait up to regroup_s for the survivors' reports; tell them the new group and where it resumes."""
        keys = {m: f"r{rnd}/alive/{m}" for m in members}
        deadline = time.monotonic() + self.plan.regroup_s
        while time.monotonic() < deadline and not self.store.check(list(keys.values())):
            time.sleep(_POLL_S)
        alive = {m: int(self.store.get(k)) for m, k in keys.items() if self.store.check([k])}
        survivors = [m for m in members if m in alive]
        start = min(alive.values()) if alive else 0
        self.store.set(f"r{rnd}/plan", json.dumps({"members": survivors, "start": start}))
        return survivors, start

    def _acks(self, members: list[str]) -> list[str]:
        keys = {m: f"done/{m}" for m in members}
        deadline = time.monotonic() + self.plan.timeout_s
        while time.monotonic() < deadline and not self.store.check(list(keys.values())):
            time.sleep(_POLL_S)
        return [m for m, k in keys.items() if self.store.check([k]) and self.store.get(k) == b"ok"]

    def close(self) -> None:
        # the store's server thread ends with the object
        del self.store


# ---- a member's side ----------------------------------------------------------------------------


def receive(
    plan: BroadcastPlan,
    member: str,
    buf: HostBuffer,
    *,
    device: str = "cpu",
    on_bucket: Callable[[int], None] | None = None,
) -> HostBuffer:
    """Join the broadcast as `member` and fill `buf` with the version, every chunk verified.
    Raises BroadcastError when it could not (then pull the version over HTTP)."""
    import torch.distributed as dist

    from rlboost.contracts import digest

    if member not in plan.members:
        raise BroadcastError(f"{member!r} is not in the broadcast of version {plan.version}")
    if buf.size != plan.manifest.total_bytes:
        raise BroadcastError(f"receive buffer holds {buf.size} bytes, version needs {plan.manifest.total_bytes}")
    m, bs = plan.manifest, buckets(plan.manifest, plan.bucket_bytes)
    flat = flat_bytes(buf)
    try:
        store = open_store(plan.host, plan.port, plan.timeout_s, master=False)
    except (RuntimeError, dist.DistError) as e:
        raise BroadcastError(f"cannot reach the broadcast rendezvous {plan.rendezvous}: {e}") from e
    members, start, held = list(plan.members), 0, 0
    why = "no round ran"
    for rnd in range(plan.max_rounds):
        if rnd:
            members, start = _rejoin(store, plan, rnd, member, held)
        pg = None
        try:
            pg = make_group(
                plan.backend, dist.PrefixStore(f"r{rnd}/pg", store), members.index(member) + 1, len(members) + 1,
                plan.timeout_s,
            )  # fmt: skip
            for b in bs[start:]:
                broadcast_bucket(pg, flat, b, device, plan.timeout_s)
                for c in b.chunks:
                    if digest.hexdigest(m.digest, buf.view[c.offset : c.offset + c.size]) != c.digest:
                        store.set(f"done/{member}", "corrupt")
                        raise BroadcastError(f"version {plan.version}: chunk {c.index} arrived corrupt")
                held = max(held, b.index + 1)
                if on_bucket:
                    on_bucket(b.index)
            store.set(f"done/{member}", "ok")
            return buf
        except (RuntimeError, dist.DistError) as e:
            if isinstance(e, BroadcastError):
                raise
            why = str(e).splitlines()[0][:200]
        finally:
            close_group(pg, plan.backend)
            pg = None
    raise BroadcastError(f"version {plan.version}: broadcast failed after {plan.max_rounds} round(s): {why}")


def _rejoin(store: dist.Store, plan: BroadcastPlan, rnd: int, member: str, held: int) -> tuple[list[str], int]:
    import torch.distributed as dist

    store.set(f"r{rnd}/alive/{member}", str(held))
    key = f"r{rnd}/plan"
    try:
        store.wait([key], _timeout(plan.regroup_s + plan.timeout_s))
        got = json.loads(store.get(key))
    except (RuntimeError, dist.DistError) as e:
        raise BroadcastError(f"version {plan.version}: no regroup from the trainer: {e}") from e
    if member not in got["members"]:
        raise BroadcastError(f"version {plan.version}: left out of round {rnd + 1} (reported too late)")
    return list(got["members"]), int(got["start"])
