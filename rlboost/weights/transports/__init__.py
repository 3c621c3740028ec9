"""Weight transports by name, and the one factory that picks among them (the job file's
`weights.transport`).

    http    the pull: deltas, peers with the tracker's region relay, shared memory (http_pull.py)
    torch   a torch.distributed broadcast inside the trainer's network (torch_broadcast.py)
    auto    the first transport registered as `auto` (torch) where it suits, else the pull

A new transport is one module holding a `WeightTransport` subclass (rlboost/weights/transports/base.py)
and its registration: a line in BUILTIN below, or `register_transport(MyTransport)` from code of
your own, imported before the trainer and the workers start.
"""

from __future__ import annotations

from rlboost.contracts.transport_names import TRANSPORT_NAMES, TransportName
from rlboost.weights.transports.base import (
    Fetch,
    Receiver,
    Site,
    TrainerEnd,
    TransportError,
    UnknownTransportError,
    WeightTransport,
)
from rlboost.weights.transports.http_pull import HttpPull
from rlboost.weights.transports.torch_broadcast import TorchBroadcast

__all__ = [
    "AUTO",
    "BUILTIN",
    "PULL",
    "TRANSPORTS",
    "Fetch",
    "Receiver",
    "Site",
    "TrainerEnd",
    "TransportError",
    "UnknownTransportError",
    "WeightTransport",
    "register_transport",
    "trainer_transport",
    "transport_class",
    "unregister_transport",
    "worker_transport",
]

AUTO = "auto"
PULL = HttpPull.name  # every worker's fallback
BUILTIN: tuple[type[WeightTransport], ...] = (HttpPull, TorchBroadcast)
TRANSPORTS: dict[str, type[WeightTransport]] = {}


def register_transport(cls: type[WeightTransport]) -> type[WeightTransport]:
    """Make `cls` a transport a job may name (`weights.transport: <cls.name>`); usable as a decorator."""
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name or name == AUTO:
        raise ValueError(f"{cls.__name__}: a transport needs a name of its own (not {name!r})")
    if TRANSPORTS.get(name, cls) is not cls:
        raise ValueError(f"transport {name!r} is registered already ({TRANSPORTS[name].__name__})")
    TRANSPORTS[name] = cls
    TRANSPORT_NAMES.register(TransportName(name))  # a job file may name it (validated where weights are not)
    return cls


def unregister_transport(name: str) -> None:
    """Remove a transport registered from outside (a test's toy)."""
    TRANSPORTS.pop(name, None)
    TRANSPORT_NAMES.unregister(name)


for _cls in BUILTIN:
    register_transport(_cls)


def transport_class(name: str) -> type[WeightTransport]:
    try:
        return TRANSPORTS[name]
    except KeyError:
        known = ", ".join([AUTO, *TRANSPORTS])
        raise UnknownTransportError(f"weights.transport: unknown transport {name!r} (known: {known})") from None


def trainer_transport(end: TrainerEnd) -> WeightTransport:
    """The trainer's end of the transport `end.setting` names; for `auto`, the first registered
    transport marked auto (which then carries a version only where it suits), else the pull."""
    if end.setting == AUTO:
        cls = next((c for c in TRANSPORTS.values() if c.auto), HttpPull)
    else:
        cls = transport_class(end.setting)
    return cls(end)


def worker_transport(name: str) -> WeightTransport:
    """A worker's end of the transport an offer names (UnknownTransportError: the worker pulls)."""
    return transport_class(name)()
