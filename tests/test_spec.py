"""Job-file validation: every error names the field path and how to fix it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlboost.contracts.spec import SpecError, load_spec, parse_spec

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
    from rlboost.contracts.spec import load_yaml, spec_to_yaml

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
    raw = {
        **raw,
        "perf": {
            needle.split("'")[1]: {
                "tokens_per_s": 9,
                "seq_tokens_per_s": 1,
                "prefill_tokens_per_s": 9,
                "train_tokens_per_s": 9,
            }
        },
    }
    parse_spec(raw)  # a perf entry fixes it


def test_jsonl_only_task_settings_on_a_string_task():
    with pytest.raises(SpecError) as e:
        parse_spec({"name": "x1", "rollout": {"max_workers": 0}, "task": {"name": "reverse", "system_prompt": "hi"}})
    assert "task: system_prompt: apply to name: jsonl only" in str(e.value)


# ---- hints in errors: close matches, the NAME:COUNT form, sections in the user's terms ----
@pytest.mark.parametrize(
    "raw, needle",
    [
        ({"rollout": {"max_worker": 3}}, "rollout.max_worker: unknown key; did you mean max_workers?"),
        ({"algoritm": {}}, "algoritm: unknown key; did you mean algorithm?"),
        (
            {"perf": {"A100": {"tokens_per_sec": 9}}},
            "perf.A100.tokens_per_sec: unknown key; did you mean tokens_per_s?",
        ),
        ({"rollout": {"candidates": [{"accelerator": "A100", "cloud": ["local"]}]}}, "did you mean clouds?"),
        (
            {"logging": {"wandb": {"project": "p", "entty": "me"}}},
            "logging.wandb.entty: unknown key; did you mean entity?",
        ),
        ({"zzzz": 1}, "zzzz: unknown key (remove it, or check its spelling"),
    ],
)
def test_unknown_key_names_its_close_match(raw, needle):
    with pytest.raises(SpecError) as e:
        parse_spec({"name": "x1", **raw})
    assert needle in str(e.value), str(e.value)


@pytest.mark.parametrize("acc", ["A100x8", "A100-8", "8xA100", "A100 8", "8 x A100", "a100*8"])
def test_accelerator_count_in_another_form_gets_the_name_count_form(acc):
    with pytest.raises(SpecError) as e:
        parse_spec({"name": "x1", "rollout": {"max_workers": 0}, "trainer": {"accelerators": acc}})
    msg = str(e.value)
    assert f"trainer.accelerators: {acc!r} is not NAME" in msg and "did you mean 'A100:8'?" in msg, msg
    assert "perf." not in msg or msg.index("did you mean") < msg.index("perf."), msg


def test_mistyped_accelerator_gets_its_close_match():
    with pytest.raises(SpecError) as e:
        parse_spec({"name": "x1", "rollout": {"max_workers": 0}, "trainer": {"accelerators": "A10O:8"}})
    assert "trainer.accelerators: no performance model for 'A10O' (did you mean 'A100'?" in str(e.value)


@pytest.mark.parametrize(
    "raw, needle",
    [
        ({"model": 5}, "model: expected a mapping such as {kind: tiny-gpt}, got 5"),
        ({"model": None}, "model: empty; give a mapping such as {kind: tiny-gpt}"),
        ({"rollout": 5}, "rollout: expected a mapping such as {engine: torch}, got 5"),
        ({"trainer": [1]}, 'trainer: expected a mapping such as {accelerators: "A100:8"}, got [1]'),
        ({"rollout": {"candidates": [5]}}, "rollout.candidates[0]: expected a mapping such as {accelerator: A100"),
        ({"perf": {"A100": 5}}, "perf.A100: expected a mapping such as {tokens_per_s: 3926}, got 5"),
        ({"logging": {"wandb": "p"}}, "logging.wandb: expected a mapping such as {project: my-project}, got 'p'"),
        ({"rollout": {"synthetic": {"lengths": 1}}}, "rollout.synthetic.lengths: expected a mapping such as"),
        ({"rollout": {"candidates": 5}}, "rollout.candidates: Input should be a valid list (got 5"),
    ],
)
def test_a_section_that_is_not_a_mapping_is_named_in_the_users_terms(raw, needle):
    with pytest.raises(SpecError) as e:
        parse_spec({"name": "x1", **raw})
    assert needle in str(e.value), str(e.value)
    assert "instance of" not in str(e.value) and "Spec" not in str(e.value)


def test_model_example_in_the_error_is_a_real_model_kind():
    from rlboost.contracts.spec import load_yaml

    with pytest.raises(SpecError) as e:
        parse_spec({"name": "x1", "model": 5})
    example = str(e.value).split("such as ", 1)[1].split(", got")[0]
    parse_spec({"name": "x1", "rollout": {"max_workers": 0}, "model": load_yaml(example)})


def test_a_directory_is_not_a_job_file(tmp_path):
    with pytest.raises(SpecError, match=r"is a directory; pass a job YAML file"):
        load_spec(tmp_path)


def test_local_spot_candidate_accelerator_is_checked_like_the_trainers(tmp_path):
    # on the local provider the candidate's accelerator is a label priced by its spot_price: no catalog
    # catches a typo (letter O for a zero), which dropped every candidate's performance priors
    text = (ROOT / "examples" / "local.yaml").read_text().replace("accelerator: A100\n", "accelerator: A10O\n")
    with pytest.raises(SpecError) as e:
        _load_text(tmp_path, text)
    assert "rollout.candidates[0].accelerator: no performance model for 'A10O' (did you mean 'A100'?" in str(e.value)
    # a cloud's candidates stay free of the rule: the price catalog checks them, and explicit prices
    # bid for one it lacks
    cand = {"accelerator": "K80", "clouds": ["aws"], "spot_price": 0.2, "on_demand_price": 0.9}
    parse_spec(
        {
            "name": "x1",
            "provider": "aws",
            "trainer": {"cloud": "aws", "accelerators": "A100:8"},
            "rollout": {"candidates": [cand]},
        }
    )
