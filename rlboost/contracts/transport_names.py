"""The weight transports a job file may name (`weights.transport`), by name only.

A transport's code is rlboost.weights.transports (imported where weights move: the trainer and the
workers); a job file is validated where it is not (the CLI). So the names live here:
`rlboost.weights.transports.register_transport` registers each transport's name here as well, and
code of your own that registers a transport does so in every process that reads the job file (the
launching one and the trainer's), as for a provider (contracts/provider_kinds.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlboost.contracts.kind_registry import Registry

AUTO = "auto"  # the first transport registered as auto where it suits, else the pull


@dataclass(frozen=True)
class TransportName:
    name: str


class UnknownTransportError(ValueError):
    """A transport name with no registration; the message names the known ones."""


TRANSPORT_NAMES: Registry[TransportName] = Registry(
    "transport", UnknownTransportError, "unknown transport {name!r} (known: " + AUTO + ", {known})"
)
# rlboost's own (rlboost/weights/transports BUILTIN; tests/test_weight_transport.py checks they agree)
for _name in ("http", "torch"):
    TRANSPORT_NAMES.register(TransportName(_name))


def transport_names() -> tuple[str, ...]:
    """Every name a job file may give `weights.transport`, `auto` first."""
    return (AUTO, *TRANSPORT_NAMES.names())


def check_transport(name: str) -> str:
    """`name` if a job may name it; else a ValueError in the words of a choice among the known ones."""
    known = transport_names()
    if name not in known:
        quoted = [repr(n) for n in known]
        raise ValueError(f"invalid value {name!r}; input should be {', '.join(quoted[:-1])} or {quoted[-1]}")
    return name
