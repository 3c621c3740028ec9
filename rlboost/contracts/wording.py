"""Counts in messages: "1 spot worker", "2 spot workers", never "up to 1 spot workers"."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n noun`, the noun in the plural unless n is 1 (`plural`: where adding an s would be wrong)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def spot_workers(n: int) -> str:
    return counted(n, "spot worker")
