"""A registry of declarative records by name (providers, clouds): what rlboost ships registers itself at
import, and code from outside the package may add its own (and a test remove it again)."""

from __future__ import annotations

from typing import Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


K = TypeVar("K", bound=Named)


class Registry(dict[str, K]):
    """name -> record, in the order registered (the order errors and listings give them)."""

    def __init__(self, what: str, unknown: type[ValueError], message: str) -> None:
        """`what` names a record in errors ("provider"); `unknown` is raised with `message` formatted
        with the name asked for and the known ones."""
        super().__init__()
        self.what, self.unknown, self.message = what, unknown, message

    def register(self, kind: K) -> K:
        """Add a record; ValueError if another record holds its name (the same one again is a no-op)."""
        held = self.get(kind.name)
        if held is not None and held != kind:
            raise ValueError(f"{self.what} {kind.name!r} is registered already")
        self[kind.name] = kind
        return kind

    def unregister(self, name: str) -> None:
        """Remove a record (a test's toy); an unknown name is ignored."""
        self.pop(name, None)

    def names(self) -> tuple[str, ...]:
        return tuple(self)

    def of(self, name: str) -> K:
        """The record of `name`; `unknown` (naming the known ones) for any other."""
        try:
            return self[name]
        except KeyError:
            raise self.unknown(self.message.format(name=name, known=", ".join(self))) from None
