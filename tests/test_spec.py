"""Job-file validation: every error names the field path and how to fix it."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.spec import SpecError, load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[1]


def test_examples_validate():
    spec = load_spec(ROOT / "examples" / "local.yaml")
    assert spec.provider == "local" and spec.rollout.max_workers >= 1


def test_minimal_job_gets_defaults():
    spec = parse_spec({"name": "tiny", "rollout": {"max_workers": 0}})
    assert spec.algorithm.name == "grpo" and spec.provider == "local"
    assert spec.weights.transport == "auto"
    forced = parse_spec({"name": "tiny", "rollout": {"max_workers": 0}, "weights": {"transport": "torch"}})
    assert forced.weights.transport == "torch"


@pytest.mark.parametrize(
    "raw, needle",
    [
        ({"name": "x1", "algoritm": {}}, "algoritm: unknown key"),
        ({"name": "x1", "algorithm": {"group_size": 1}}, "algorithm.group_size"),
        ({"name": "x1", "algorithm": {"steps": "many"}}, "algorithm.steps"),
        ({"name": "x1", "provider": "azure-ml"}, "provider: invalid value 'azure-ml'"),
        ({"name": "x1", "rollout": {"engine": "tgi"}}, "'torch', 'vllm' or 'synthetic'"),
        ({"name": "Bad_Name"}, "not a valid job name"),
        ({"name": "x1", "task": {"min_len": 5, "max_len": 2}}, "min_len (5) must be <= max_len (2)"),
        ({"name": "x1", "model": {"n_embd": 30, "n_head": 4}}, "multiple of n_head"),
        ({"name": "x1", "algorithm": {"max_new_tokens": 500}}, "raise model.block_size"),
        (
            {"name": "x1", "rollout": {"candidates": [{"accelerator": "A100", "clouds": ["aws"]}]}},
            "provider is 'local'",
        ),
        ({"name": "x1", "rollout": {"max_workers": 2}}, "rollout.candidates is empty"),
        (
            {"name": "x1", "rollout": {"candidates": [{"accelerator": "A100", "clouds": ["ibm"]}]}},
            "rollout.candidates[0].clouds: unknown cloud 'ibm'",
        ),
        ({"name": "x1", "rollout": {"candidates": [{"accelerator": "A100:x"}]}}, "NAME:COUNT"),
        ({"name": "x1", "rollout": {"max_workers": 0, "trainer_engine": False}}, "nothing would generate"),
        ({}, "name: Field required"),
        (
            {"name": "x1", "rollout": {"max_workers": 0}, "weights": {"transport": "nccl"}},
            "weights.transport: invalid value 'nccl'; input should be 'auto', 'http' or 'torch'",
        ),
        (
            {"name": "x1", "rollout": {"max_workers": 0}, "weights": {"transprt": "http"}},
            "weights.transprt: unknown key",
        ),
    ],
)
def test_bad_specs_name_the_field(raw, needle):
    with pytest.raises(SpecError) as e:
        parse_spec(raw)
    assert needle in str(e.value), str(e.value)


def test_yaml_syntax_error_names_the_line(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text("name: x1\nalgorithm: [unclosed\n")
    with pytest.raises(SpecError, match=r"not valid YAML at line \d+"):
        load_spec(p)


def test_missing_trace_file_is_named(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text("name: x1\nrollout: {max_workers: 0}\nlocal: {trace: nope.csv}\n")
    with pytest.raises(SpecError, match=r"local.trace: file nope.csv not found"):
        load_spec(p)


def test_missing_job_file():
    with pytest.raises(SpecError, match="job file not found"):
        load_spec("/nonexistent/job.yaml")


def test_non_mapping_file(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="must be a YAML mapping"):
        load_spec(p)


# ---- strict job files: no duplicate keys, no silent coercion (issue 16) ----
def _load_text(tmp_path: Path, text: str):
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return load_spec(p)


def test_duplicate_key_names_key_and_line(tmp_path):
    with pytest.raises(SpecError, match=r"line 4: duplicate key 'steps' \(first at line 3\)"):
        _load_text(tmp_path, "name: dup\nalgorithm:\n  steps: 3\n  steps: 4\nrollout: {max_workers: 0}\n")


@pytest.mark.parametrize(
    "line, needle",
    [
        ("algorithm: {steps: true}", "algorithm.steps: Input should be a valid integer (got True, a bool"),
        ('algorithm: {steps: "10"}', "algorithm.steps: Input should be a valid integer (got '10', a str"),
        ('algorithm: {learning_rate: "3e-3"}', "algorithm.learning_rate: Input should be a valid number"),
        ("rollout: {max_workers: 2.5}", "rollout.max_workers: Input should be a valid integer (got 2.5"),
        ('rollout: {trainer_engine: "yes"}', "rollout.trainer_engine: Input should be a valid boolean"),
        ("algorithm: {checkpoint_every: 5}", "checkpoint_every moved to trainer.checkpoint_every"),
    ],
)
def test_no_silent_coercion(tmp_path, line, needle):
    with pytest.raises(SpecError) as e:
        _load_text(tmp_path, f"name: strict\n{line}\n")
    assert needle in str(e.value)


def test_unquoted_exponent_floats_are_numbers(tmp_path):
    # YAML 1.1 reads `1e-6` (no dot) as a string; job files read it as YAML 1.2 does
    text = "name: lr\nalgorithm: {learning_rate: 1e-6, temperature: 5E-1}\nrollout: {max_workers: 0}\n"
    spec = _load_text(tmp_path, text)
    assert spec.algorithm.learning_rate == 1e-6 and spec.algorithm.temperature == 0.5


@pytest.mark.parametrize(
    "path", sorted((ROOT / "examples").glob("*.yaml")) + sorted((ROOT / "examples" / "simulate").glob("*.yaml"))
)
def test_every_example_loads_and_round_trips(path):
    from contracts.spec import load_yaml, spec_to_yaml

    spec = load_spec(path)
    assert parse_spec(load_yaml(spec_to_yaml(spec))) == spec  # the saved spec.yaml validates too


@pytest.mark.parametrize(
    "raw, needle",
    [
        (
            {"name": "x1", "rollout": {"max_workers": 0}, "trainer": {"accelerators": "B200:8"}},
            "trainer.accelerators: no performance model for 'B200'",
        ),
        (
            {
                "name": "x1",
                "model": {"kind": "synthetic"},
                "rollout": {"engine": "synthetic", "candidates": [{"accelerator": "T4"}, {"accelerator": "X9"}]},
            },
            "rollout.candidates[1].accelerator: no performance model for 'X9'",
        ),
    ],
)
def test_accelerators_without_a_performance_model(raw, needle):
    # the trainer's training rate sizes the offload on every job: without a model it failed mid-job
    with pytest.raises(SpecError) as e:
        parse_spec(raw)
    assert needle in str(e.value) and "add perf." in str(e.value)
    raw = {**raw, "perf": {needle.split("'")[1]: {"tokens_per_s": 9, "seq_tokens_per_s": 1,
                                                   "prefill_tokens_per_s": 9, "train_tokens_per_s": 9}}}
    parse_spec(raw)  # a perf entry fixes it


def test_jsonl_only_task_settings_on_a_string_task():
    with pytest.raises(SpecError) as e:
        parse_spec({"name": "x1", "rollout": {"max_workers": 0}, "task": {"name": "reverse", "system_prompt": "hi"}})
    assert "task: system_prompt: apply to name: jsonl only" in str(e.value)
