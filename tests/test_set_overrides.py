"""`rlboost launch --set key.path=value` (issue 16): applied before validation, recorded in the saved spec."""

from __future__ import annotations

import pytest
import yaml

from rlboost.cli.state import StateStore
from rlboost.contracts.spec import SpecError, apply_overrides, load_spec
from tests.conftest import ROOT, run_cli

RAW = {"name": "ov", "rollout": {"max_workers": 1, "candidates": [{"accelerator": "A100"}]}}


def test_values_are_yaml_scalars_on_dotted_and_indexed_paths():
    out = apply_overrides(
        RAW,
        ["algorithm.learning_rate=1e-6", "rollout.candidates[0].accelerator=H100:2", "rollout.trainer_engine=false"],
    )
    assert out["algorithm"] == {"learning_rate": 1e-6}
    assert out["rollout"]["candidates"][0]["accelerator"] == "H100:2" and out["rollout"]["trainer_engine"] is False
    assert RAW["rollout"]["candidates"][0]["accelerator"] == "A100"  # the parsed file is left as it was


@pytest.mark.parametrize(
    "item, needle",
    [
        ("steps", "expected KEY.PATH=VALUE"),
        ("rollout.candidates[3].accelerator=H100", "rollout.candidates[3] is not in the job file"),
        ("name.first=x", "name is not a mapping"),
    ],
)
def test_bad_overrides_say_what_is_wrong(item, needle):
    with pytest.raises(SpecError) as e:
        apply_overrides(RAW, [item])
    assert needle in str(e.value)


def test_a_bad_value_is_blamed_on_its_field(tmp_path):
    with pytest.raises(SpecError) as e:
        load_spec(ROOT / "examples" / "local.yaml", ["algorithm.steps=ten"])
    assert "algorithm.steps: Input should be a valid integer (got 'ten'" in str(e.value)


def test_launch_records_the_overrides(tmp_path, home):
    job = tmp_path / "job.yaml"
    steps = {"steps": 5, "prompts_per_step": 2, "group_size": 2, "warm_start_steps": 0}
    job.write_text(yaml.safe_dump({"name": "setrec", "rollout": {"max_workers": 0}, "algorithm": steps}))
    proc = run_cli("launch", str(job), "--set", "algorithm.steps=1", "--set", "algorithm.seed=7", home=home)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    saved = next((home / "jobs").glob("setrec-*/spec.yaml")).read_text()
    assert saved.startswith("# --set algorithm.steps=1\n# --set algorithm.seed=7\n")
    algo = yaml.safe_load(saved)["algorithm"]
    assert algo["steps"] == 1 and algo["seed"] == 7
    assert StateStore(home / "state.db").get_job("setrec").spec_yaml == saved
