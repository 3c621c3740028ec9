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
