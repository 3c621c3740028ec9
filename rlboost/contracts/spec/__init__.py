"""The job file (`job.yaml`): pydantic models, strict about unknown keys and contradictions.

One module per section of the file (model.py, algorithm.py, task.py, trainer.py, rollout.py,
local.py, simulate.py for `perf:` and `simulate:`, sinks.py for `logging:` and `weights:`), the job
model assembled from them with the rules between sections (job.py), and around it: reading a file
with `--set` overrides (loading.py), its paths checked (paths.py), and every error phrased as
`<field.path>: <problem> (<allowed values or fix>)` (errors.py) so a user can fix the file without
reading these modules. Callers import from here.
"""

from __future__ import annotations

from rlboost.contracts.spec.algorithm import LOSS_KNOBS, AlgorithmSpec, OverlongBuffer, RolloutCorrection
from rlboost.contracts.spec.base import SEED_LIMIT, LaxPath, Strict
from rlboost.contracts.spec.errors import SpecError, format_validation_error
from rlboost.contracts.spec.job import JobSpec, env_name_problem
from rlboost.contracts.spec.loading import apply_overrides, load_spec, load_yaml, parse_spec, spec_to_yaml
from rlboost.contracts.spec.local import LocalSpec
from rlboost.contracts.spec.model import LoraSpec, ModelSpec
from rlboost.contracts.spec.paths import resolve_paths
from rlboost.contracts.spec.rollout import LengthSpec, RolloutSpec, SpeculativeSpec, SpotCandidate, SyntheticSpec
from rlboost.contracts.spec.simulate import PerfSpec, SimulateSpec
from rlboost.contracts.spec.sinks import LoggingSpec, WandbSpec, WeightsSpec
from rlboost.contracts.spec.task import VERIFIER_NAMES, TaskSpec
from rlboost.contracts.spec.trainer import TrainerSpec

__all__ = [
    "LOSS_KNOBS",
    "SEED_LIMIT",
    "VERIFIER_NAMES",
    "AlgorithmSpec",
    "JobSpec",
    "LaxPath",
    "LengthSpec",
    "LocalSpec",
    "LoggingSpec",
    "LoraSpec",
    "ModelSpec",
    "OverlongBuffer",
    "PerfSpec",
    "RolloutCorrection",
    "RolloutSpec",
    "SimulateSpec",
    "SpecError",
    "SpeculativeSpec",
    "SpotCandidate",
    "Strict",
    "SyntheticSpec",
    "TaskSpec",
    "TrainerSpec",
    "WandbSpec",
    "WeightsSpec",
    "apply_overrides",
    "env_name_problem",
    "format_validation_error",
    "load_spec",
    "load_yaml",
    "parse_spec",
    "resolve_paths",
    "spec_to_yaml",
]
