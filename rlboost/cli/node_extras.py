"""Which of rlboost's pip extras a job's nodes install besides their engine's (`local` or `vllm`).

Providers do not read job files: the controller puts the answer in the launch request's environment
(Env.EXTRAS, rlboost/contracts/env_names.py), and bootstrap.pip_spec adds it to what the node pip-installs.
"""

from __future__ import annotations

import base64
from pathlib import Path

from rlboost.contracts.dataset_files import dataset_format
from rlboost.contracts.env_names import Env
from rlboost.contracts.mounts import find_mount, source_path
from rlboost.contracts.provider_kinds import provider_kind
from rlboost.contracts.spec import JobSpec
from rlboost.providers.base import Role


def node_setup_env(spec: JobSpec, role: Role) -> dict[str, str]:
    """What a node's launch request carries of the job file for its installation: the extras
    (Env.EXTRAS) and the job's `setup:` script (Env.SETUP_B64), which the node templates run after
    installing rlboost and before starting it."""
    env = {Env.EXTRAS: ",".join(node_extras(spec, role))}
    if spec.setup:
        env[Env.SETUP_B64] = base64.b64encode(spec.setup.encode()).decode()
    return env


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


# what each extra installs that rlboost imports (the module, not the distribution), found without
# importing it; tests/test_declared_dependencies.py checks each against pyproject.toml's extras
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "local": ("torch",),
    "hf": ("transformers",),
    "vllm": ("vllm",),
    "data": ("pyarrow", "datasets"),
}


def extras_here(spec: JobSpec) -> list[tuple[str, str]]:
    """(job-file field, extra) for each extra this machine needs besides its provider's own library
    (which preflight checks: the local provider's torch, a cloud's SDK): where the provider's instances
    run here (`provider: local`), the trainer and every worker import the job's engine and model here.
    A cloud's nodes pip-install their extras themselves (bootstrap.pip_spec)."""
    if not provider_kind(spec.provider).runs_here:
        return []
    out = [("rollout.engine: vllm", "vllm")] if spec.rollout.engine == "vllm" else []
    fields = {"hf": "model.kind: hf", "data": "task.path (parquet or a `datasets` directory)"}
    out += [(fields.get(x, x), x) for x in node_extras(spec, Role.TRAINER)]
    return out


def missing_extras(spec: JobSpec) -> list[str]:
    """One line per module the job needs here that is not installed, with the pip command that installs it."""
    from rlboost.providers import installed

    here = extras_here(spec)
    needed = [(field, extra, module) for field, extra in here for module in EXTRA_MODULES[extra]]
    if spec.model.lora is not None and any(extra == "hf" for _, extra in here):
        needed.append(("model.lora", "hf", "peft"))  # in the hf extra, but only LoRA jobs import it
    return [
        f"{field} needs {module}, which is not installed here; install it with pip install 'rlboost[{extra}]'"
        for field, extra, module in needed
        if not installed(module)
    ]
