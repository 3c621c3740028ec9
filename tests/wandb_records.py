"""Read back what an offline W&B run wrote: its `run-<id>.wandb` file, a LevelDB-style record log of
wandb's own protobuf `Record`s (wandb writes no summary JSON for an offline run; `wandb sync` uploads
this file). The log format: a 7-byte file header (`:W&B`, magic, version), then 32 KiB blocks of
chunks, each `crc32 (4) | length (2) | type (1) | data`; type 1 = a whole record, 2/3/4 = its
first/middle/last part."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """Every Record in the file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B record log"
    out, part, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0 and n == 0:  # zero padding: the end of what was written
            break
        pos += HEADER
        part += data[pos : pos + n]
        pos += n
        if kind in (FULL, LAST):
            rec = pb.Record()
            rec.ParseFromString(part)
            out.append(rec)
            part = b""
    return out


def history(path: Path) -> list[dict[str, Any]]:
    """Each `run.log()` call's values by name (wandb's own `_step`, `_runtime`, … left out)."""
    rows = []
    for rec in records(path):
        if rec.WhichOneof("record_type") == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item}
            rows.append({k: v for k, v in items.items() if not k.startswith("_")})
    return rows


def run_info(path: Path) -> tuple[str, str, dict[str, Any]]:
    """(display name, project, config) of the run."""
    for rec in records(path):
        if rec.WhichOneof("record_type") == "run":
            config = {i.key: json.loads(i.value_json) for i in rec.run.config.update}
            return rec.run.display_name, rec.run.project, config
    raise AssertionError(f"{path}: no run record")
