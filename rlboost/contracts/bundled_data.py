"""Data files shipped inside the package (rlboost/contracts/data): price catalogs and spot traces.

A job file's `local.trace` / `local.catalog` (and `rlboost simulate --trace/--catalog`) name one as
`bundled:<file>`, e.g. `bundled:traces/p3-trace.csv`, so that the shipped examples work after a plain
`pip install`, from any directory, without the project's shared data folder.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

PREFIX = "bundled:"


def is_bundled(name: str | Path) -> bool:
    return str(name).startswith(PREFIX)


def bundled_names() -> list[str]:
    """Every shipped data file, as a job file names it (`bundled:...`)."""
    root = _root()
    return sorted(
        PREFIX + p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and p.suffix in (".csv", ".txt", ".json") and not p.name.startswith(".")
    )


def bundled_path(name: str | Path) -> Path:
    """The file `bundled:<file>` names; FileNotFoundError says which names exist."""
    rel = str(name)[len(PREFIX) :] if is_bundled(name) else str(name)
    root = _root()
    path = (root / rel).resolve()
    # a name may not climb out of the data folder (`bundled:../x`)
    if root.resolve() not in path.parents or not path.is_file():
        raise FileNotFoundError(f"no bundled file {PREFIX}{rel} (bundled: {', '.join(bundled_names())})")
    return path


def _root() -> Path:
    # setuptools installs the package as plain files, so the data folder is a real directory
    return Path(str(resources.files("rlboost.contracts").joinpath("data")))


def local_file(path: str | Path) -> Path:
    """Where to read `path` from: a `bundled:` name's shipped file, else the path itself."""
    return bundled_path(path) if is_bundled(path) else Path(path)
