"""Which of rlboost's pip extras a job's nodes install besides their engine's (`local` or `vllm`).

Providers do not read job files: the controller puts the answer in the launch request's environment
(Env.EXTRAS, rlboost/contracts/env_names.py), and bootstrap.pip_spec adds it to what the node pip-installs.
"""

from __future__ import annotations

from pathlib import Path

from rlboost.contracts.dataset_files import dataset_format
from rlboost.contracts.mounts import find_mount, source_path
from rlboost.contracts.spec import JobSpec
from rlboost.providers.base import Role


def node_extras(spec: JobSpec, role: Role) -> tuple[str, ...]:
    """`hf` for a Hugging Face model (the trainer and every engine load it; the job file pairs a
    synthetic engine with a synthetic model only); `data` on the trainer when task.path or
    task.eval_path is parquet or a `datasets` directory (only the trainer reads the dataset: workers
    get prompts as token ids)."""
    out: list[str] = []
    if spec.model.kind == "hf":
        out.append("hf")
    paths = (spec.task.path, spec.task.eval_path)
    if role is Role.TRAINER and any(_needs_data(p, spec.file_mounts) for p in paths if p is not None):
        out.append("data")
    return tuple(out)


def _needs_data(path: Path, mounts: dict[str, str]) -> bool:
    """Is `path` read with the `data` extra (parquet, a `datasets` directory) rather than as JSON Lines?"""
    if find_mount(str(path), mounts) is not None:
        local = source_path(str(path), mounts)
        if local is None:  # in a bucket: judged by its name, a `datasets` directory has no suffix
            return path.suffix.lower() in (".parquet", "")
        path = local
    return dataset_format(path) != "jsonl"
