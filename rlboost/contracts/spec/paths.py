"""The job file's paths, made relative to the file and checked before anything launches: traces,
catalogs, recorded lengths, file mounts and the workdir, datasets and model directories (here, or
on the node inside a mount)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rlboost.contracts.bundled_data import bundled_path, is_bundled
from rlboost.contracts.spec.errors import SpecError
from rlboost.contracts.spec.file_kinds import file_kind_problem
from rlboost.contracts.spec.job import JobSpec
from rlboost.contracts.spec.task import TaskSpec


def resolve_paths(spec: JobSpec, base: Path, *, on_node: bool = False) -> JobSpec:
    """Make relative paths in the spec relative to the job file, and check that they exist."""
    if not on_node:
        spec = _resolve_mount_sources(spec, base)
    local = spec.local
    updates = {}
    for field in ("trace", "catalog"):
        val = getattr(local, field)
        if val is None:
            continue
        if is_bundled(val):  # shipped with the package: kept by name, so a node reads its own copy
            try:
                bundled_path(val)
            except FileNotFoundError as e:
                raise SpecError(f"local.{field}: {e}; fix the name, or give a file path") from None
            continue
        full = val if val.is_absolute() else (base / val).resolve()
        if not full.is_file():
            raise SpecError(f"local.{field}: file {val} not found (resolved to {full}); fix the path")
        _check_kind(f"local.{field}", full)
        updates[field] = full
    if updates:
        spec = spec.model_copy(update={"local": local.model_copy(update=updates)})
    lens = spec.rollout.synthetic.lengths
    if lens.recorded is not None:
        full = lens.recorded if lens.recorded.is_absolute() else (base / lens.recorded).resolve()
        if not full.is_file():
            raise SpecError(
                f"rollout.synthetic.lengths.recorded: file {lens.recorded} not found (resolved to {full}); fix the path"
            )
        _check_kind("rollout.synthetic.lengths.recorded", full)
        syn = spec.rollout.synthetic.model_copy(update={"lengths": lens.model_copy(update={"recorded": full})})
        spec = spec.model_copy(update={"rollout": spec.rollout.model_copy(update={"synthetic": syn})})
    return _resolve_hf_paths(spec, base, on_node)


def _check_kind(key: str, full: Path, *, walk: bool = False) -> None:
    """`key`'s path is a regular file or directory (with `walk`, so is everything below it)."""
    problem = file_kind_problem(full, walk=walk)
    if problem:
        raise SpecError(f"{key}: {problem}")


def _resolve_mount_sources(spec: JobSpec, base: Path) -> JobSpec:
    """file_mounts' local sources and workdir, relative to the job file, must exist."""
    from rlboost.contracts.mounts import is_bucket

    mounts = {}
    for dest, source in spec.file_mounts.items():
        if is_bucket(source):
            mounts[dest] = source
            continue
        raw = Path(source).expanduser()
        full = raw if raw.is_absolute() else (base / raw).resolve()
        if not full.exists():
            raise SpecError(f"file_mounts.{dest}: {source} not found (resolved to {full}); fix the path")
        _check_kind(f"file_mounts.{dest}", full, walk=True)  # the launch copies or uploads all of it
        mounts[dest] = str(full)
    update: dict[str, object] = {"file_mounts": mounts}
    if spec.workdir is not None:
        raw = Path(spec.workdir).expanduser()
        full = raw if raw.is_absolute() else (base / raw).resolve()
        if not full.is_dir():
            raise SpecError(f"workdir: directory {spec.workdir} not found (resolved to {full}); fix the path")
        _check_kind("workdir", full, walk=True)
        update["workdir"] = str(full)
    return spec.model_copy(update=update)


def _check_dataset(full: Path, task: TaskSpec, held_out: bool = False) -> None:
    """A dataset path that exists (task.path, or task.eval_path when `held_out`): a format rlboost reads,
    its split, and the libraries reading it needs (the `data` extra), all before anything launches."""
    from rlboost.contracts import dataset_files as datasets

    key, split_key = ("task.eval_path", "task.eval_split") if held_out else ("task.path", "task.split")
    split = task.eval_split if held_out else task.split
    default_split = datasets.DEFAULT_EVAL_SPLIT if held_out else datasets.DEFAULT_SPLIT
    _check_kind(key, full, walk=True)

    if full.is_file() and full.suffix.lower() in (".arrow", ".csv", ".tsv"):
        raise SpecError(
            f"{key}: {full.name}: rlboost reads JSON Lines (.jsonl), parquet (.parquet) or a Hugging Face datasets "
            "directory (save_to_disk); convert it, e.g. pandas.read_csv(p).to_parquet(out)"
        )
    fmt = datasets.dataset_format(full)
    if fmt != "hf-dir" and split is not None:
        raise SpecError(f"{split_key}: applies to a Hugging Face datasets directory; {full.name} is {fmt} (remove it)")
    try:
        if fmt == "hf-dir":
            datasets.pick_split(full, split, default_split, split_key)
    except datasets.DatasetError as e:
        msg = str(e)
        raise SpecError(msg if msg.startswith(split_key) else f"{key}: {msg}") from None
    content = datasets.content_problem(full) if full.is_file() else None
    if content is not None:
        raise SpecError(f"{key}: {content}; {datasets.FORMATS_HINT}")
    lib = datasets.missing_library(full)
    if lib is not None:
        what = "a Hugging Face datasets directory" if fmt == "hf-dir" else "a parquet file"
        raise SpecError(
            f"{key}: {full.name} is {what}; reading it needs {lib}, which is not installed "
            f"({datasets.INSTALL_HINT}, or give a .jsonl file)"
        )


def _path_in_mount(key: str, raw: str, spec: JobSpec, on_node: bool, check: Callable[[Path], None]) -> Path | None:
    """`key` (task.path, task.eval_path, model.path) written as a node path inside a file_mounts
    destination (`~/data/train.jsonl`): checked with `check` at its local source on the launching
    machine (a bucket cannot be checked), read on the node where the mount put it (the path returned
    there). None when it is an ordinary local path."""
    from rlboost.contracts.mounts import find_mount, node_path, source_path

    hit = find_mount(raw, spec.file_mounts)
    if hit is None:
        return None
    dest = hit[0]
    if on_node:
        full = node_path(raw)
        if not full.exists():
            raise SpecError(f"{key}: {raw} is not on this node ({full}); file_mounts.{dest} should have put it there")
        check(full)
        return full
    local = source_path(raw, spec.file_mounts)
    if local is not None and not local.exists():
        raise SpecError(
            f"{key}: {raw} lies in file_mounts.{dest}, but {local} is not there; fix {key} or the mount's source"
        )
    if local is not None:
        check(local)
    return Path(raw)  # kept as the node path: the node resolves it again


def _check_model_dir(full: Path) -> None:
    _check_kind("model.path", full, walk=True)
    if not (full / "config.json").is_file():
        raise SpecError(f"model.path: {full} has no config.json (a Hugging Face model directory is needed)")


def _resolve_dataset(spec: JobSpec, base: Path, on_node: bool, held_out: bool) -> JobSpec:
    """task.path (or task.eval_path when `held_out`) must exist, here or in a mount, in a format rlboost reads."""
    task = spec.task
    key, path = ("task.eval_path", task.eval_path) if held_out else ("task.path", task.path)
    if path is None:
        return spec
    full = _path_in_mount(key, str(path), spec, on_node, lambda p: _check_dataset(p, task, held_out))
    if full is None:
        full = path if path.is_absolute() else (base / path).resolve()
        if not full.exists():
            raise SpecError(f"{key}: file {path} not found (resolved to {full}); fix the path")
        _check_dataset(full, task, held_out)
    field = "eval_path" if held_out else "path"
    return spec.model_copy(update={"task": task.model_copy(update={field: full})})


def _resolve_hf_paths(spec: JobSpec, base: Path, on_node: bool = False) -> JobSpec:
    """task.path and task.eval_path must exist; model.path is a local directory when it looks like a
    path or exists next to the job file, else a hub id (`org/name`, fetched by the trainer and the
    workers). Any of them may lie in a file_mounts destination (`_path_in_mount`)."""
    spec = _resolve_dataset(spec, base, on_node, held_out=False)
    spec = _resolve_dataset(spec, base, on_node, held_out=True)
    model = spec.model
    if model.kind == "hf" and model.path:
        mounted = _path_in_mount("model.path", model.path, spec, on_node, _check_model_dir)
        if mounted is not None:
            return spec.model_copy(update={"model": model.model_copy(update={"path": str(mounted)})})
        raw = Path(model.path).expanduser()
        full = raw if raw.is_absolute() else (base / raw).resolve()
        looks_local = model.path.startswith(("/", "./", "../", "~")) or model.path.count("/") != 1
        if full.is_dir():
            _check_model_dir(full)
            spec = spec.model_copy(update={"model": model.model_copy(update={"path": str(full)})})
        elif looks_local:
            raise SpecError(
                f"model.path: directory {model.path} not found (resolved to {full}); fix the path, "
                "or give a hub id as org/name"
            )
    return spec
