"""What a dataset path holds, read without loading it: its format (JSON Lines, parquet or a Hugging Face
`datasets` directory), its splits, and the library reading it needs. The job file's checks use it
before anything launches; rlboost/trainer/datasets.py reads the rows."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Literal

INSTALL_HINT = "pip install 'rlboost[data]'"
DEFAULT_SPLIT = "train"  # a DatasetDict's split when task.split is not given (eval_path: "test")
DEFAULT_EVAL_SPLIT = "test"

Format = Literal["jsonl", "parquet", "hf-dir"]
# what each format needs besides rlboost's own dependencies (the `data` extra)
_LIBRARIES: dict[str, tuple[str, ...]] = {"jsonl": (), "parquet": ("pyarrow",), "hf-dir": ("datasets", "pyarrow")}


class DatasetError(ValueError):
    pass


def dataset_format(path: Path) -> Format:
    """How `path` is read: a directory is a `datasets` directory, `.parquet` is parquet, else JSON Lines."""
    if path.is_dir():
        return "hf-dir"
    return "parquet" if path.suffix.lower() == ".parquet" else "jsonl"


def missing_library(path: Path) -> str | None:
    """The first library that reading `path` needs and this environment lacks, or None."""
    return next((m for m in _LIBRARIES[dataset_format(path)] if importlib.util.find_spec(m) is None), None)


def hf_dir_splits(path: Path) -> list[str] | None:
    """A `datasets` directory's splits (a DatasetDict), None for a single Dataset; read from the files
    save_to_disk writes, so it needs no library. DatasetError when `path` is neither."""
    listing = path / "dataset_dict.json"
    if listing.is_file():
        try:
            splits = json.loads(listing.read_text(encoding="utf-8"))["splits"]
        except (ValueError, KeyError, TypeError):
            raise DatasetError(f"{listing}: unreadable (save_to_disk writes {{'splits': [...]}})") from None
        return [str(x) for x in splits]
    if (path / "state.json").is_file():
        return None
    raise DatasetError(
        f"{path}: a directory, but not a Hugging Face datasets directory (no dataset_dict.json or state.json; "
        "write one with Dataset.save_to_disk(dir) or DatasetDict.save_to_disk(dir))"
    )


def pick_split(path: Path, split: str | None, default: str = DEFAULT_SPLIT, key: str = "task.split") -> str | None:
    """The split to read from a `datasets` directory (None: a single Dataset, read whole)."""
    splits = hf_dir_splits(path)
    if splits is None:
        if split is not None:
            raise DatasetError(f"{key}: {path} holds a single Dataset, which has no splits; remove {key}")
        return None
    name = split if split is not None else default
    if name not in splits:
        how = f"{key} is {name!r}" if split is not None else f"{key} is not set (default {default!r})"
        raise DatasetError(f"{key}: {path} has no split {name!r} ({how}); its splits: {', '.join(splits)}")
    return name


# how much of a file the launch check reads to tell its format (a JSON Lines row longer than this is
# judged by its first character)
SNIFF_BYTES = 1 << 20
FORMATS_HINT = (
    "rlboost reads JSON Lines (.jsonl, one JSON object per line), parquet (.parquet) or a Hugging Face "
    "datasets directory (save_to_disk)"
)


def content_problem(path: Path) -> str | None:
    """Why the regular file `path` is not the format its name says (`dataset_format`), from its first
    SNIFF_BYTES, or None. The trainer reads every row later; this catches a file of another kind
    (/etc/passwd, a binary) before anything launches."""
    fmt = dataset_format(path)
    if fmt == "hf-dir":
        return None
    with open(path, "rb") as f:  # a regular file (file_kinds checked it): the read ends
        head = f.read(SNIFF_BYTES if fmt == "jsonl" else 4)
    if fmt == "parquet":
        return None if head == b"PAR1" or not head else f"{path.name} is not a parquet file (no PAR1 header)"
    return _jsonl_problem(path, head)


def _jsonl_problem(path: Path, head: bytes) -> str | None:
    for n, line in enumerate(head.split(b"\n"), 1):
        if not line.strip():
            continue
        complete = len(head) < SNIFF_BYTES or n < head.count(b"\n") + 1
        if not complete:  # one row longer than what was read: its first character must open an object
            return None if line.lstrip().startswith(b"{") else f"{path.name}: line {n} is not a JSON object"
        try:
            obj = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            return f"{path.name}: line {n} is not UTF-8 text"
        except ValueError as e:
            return f"{path.name}: line {n} is not JSON ({e.msg if isinstance(e, json.JSONDecodeError) else e})"
        if not isinstance(obj, dict):
            return f"{path.name}: line {n} is a JSON {type(obj).__name__}, not an object"
        return None
    return None
