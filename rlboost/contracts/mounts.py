"""`file_mounts:` and `workdir:` on a node: which sources a provider can place, where a node path lands.

A destination is a node path, `~/data` or `/data`. SkyPilot mounts or uploads it there. The local
provider has no node to write to: each instance's directory stands in for the node, so both `~/data`
and `/data` become `<instance dir>/data` (a copy), and rlboost reads such paths (`task.path`) through
`node_path`, which maps them the same way on that instance.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from rlboost.contracts.env_names import Env

BUCKET_SCHEMES = ("s3://", "gs://")
# where rlboost itself puts the trainer's job file on SkyPilot nodes
RESERVED_DESTINATIONS = ("~/.rlboost",)


def is_bucket(source: str) -> bool:
    return source.startswith(BUCKET_SCHEMES)


def destination_problem(dest: str) -> str | None:
    """Why `dest` is no usable node path, or None."""
    if not dest.startswith(("~/", "/")):
        return f"{dest!r}: write the node path as ~/NAME or /NAME (e.g. ~/data)"
    rel = relative_part(dest)
    if not rel.parts:
        return f"{dest!r}: name a directory or file below ~ or /, not the root itself"
    if ".." in rel.parts:
        return f"{dest!r}: '..' is not allowed in a node path"
    for reserved in RESERVED_DESTINATIONS:
        if _under(rel, relative_part(reserved)):
            return f"{dest!r}: {reserved} is where rlboost keeps its own files on a node; choose another path"
    return None


def relative_part(dest: str) -> PurePosixPath:
    """`~/data/x` and `/data/x` -> `data/x` (normalised: no `.`, no doubled slashes)."""
    text = dest[2:] if dest.startswith("~/") else dest.lstrip("/")
    return PurePosixPath(*[p for p in PurePosixPath(text).parts if p not in (".", "/")])


def _under(path: PurePosixPath, prefix: PurePosixPath) -> bool:
    return path.parts[: len(prefix.parts)] == prefix.parts


def find_mount(path: str, mounts: Mapping[str, str]) -> tuple[str, PurePosixPath] | None:
    """The mount (destination) that `path` lies in and the rest of the path below it; the deepest wins."""
    if not path.startswith(("~/", "/")):
        return None
    home = path.startswith("~/")
    rel = relative_part(path)
    best: tuple[str, PurePosixPath] | None = None
    for dest in mounts:
        if dest.startswith("~/") != home:
            continue
        d = relative_part(dest)
        if _under(rel, d) and (best is None or len(d.parts) > len(relative_part(best[0]).parts)):
            best = (dest, PurePosixPath(*rel.parts[len(d.parts) :]))
    return best


def source_path(path: str, mounts: Mapping[str, str]) -> Path | None:
    """Where a node path inside a mount of a local source is on the launching machine (None: not in
    one, or in a bucket)."""
    hit = find_mount(path, mounts)
    if hit is None or is_bucket(mounts[hit[0]]):
        return None
    dest, rest = hit
    return Path(mounts[dest]) / rest if rest.parts else Path(mounts[dest])


def node_path(path: str) -> Path:
    """A node path as this node sees it: under the instance directory on the local provider."""
    root = os.environ.get(Env.MOUNT_ROOT)  # set by the local provider on every instance
    if root:
        return Path(root) / relative_part(path)
    return Path(path).expanduser()


def mounted_name(path: str, mounts: Mapping[str, str]) -> str | None:
    """The node path (`~/models/qwen`, as a job file writes it) of `path`, a path where this node
    finds a file of a mount (what `node_path` made of it), or None when it lies in none of `mounts`.
    Another node finds its own copy with `node_path` of that name."""
    full = Path(path)
    best: tuple[int, str] | None = None
    for dest in mounts:
        top = node_path(dest)
        if full == top or top in full.parents:
            rest = full.relative_to(top).as_posix()
            name = dest.rstrip("/") + ("" if rest == "." else "/" + rest)
            if best is None or len(top.parts) > best[0]:
                best = (len(top.parts), name)
    return best[1] if best else None


def copy_mounts(root: Path, mounts: Mapping[str, str], workdir: str | None) -> None:
    """The local provider's file_mounts and workdir: copies of local files and directories under `root`."""
    for dest, source in mounts.items():
        if is_bucket(source):  # the job file check refuses these for provider: local
            raise ValueError(f"file_mounts.{dest}: the local provider cannot fetch {source}")
        target = root / relative_part(dest)
        src = Path(source)
        if src.is_dir():
            shutil.copytree(src, target, dirs_exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    if workdir:
        shutil.copytree(workdir, root / "workdir", dirs_exist_ok=True)
