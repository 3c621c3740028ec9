"""algorithm.max_staleness on a live local job (rlboost/trainer/runtime.py): with k = 1 the next step
generates on the last published weights while the trainer trains, each step on one version at most one
behind, the loss weighed by rollout correction; it learns as the on-policy job does, and `status`,
`cost-report` and metrics.jsonl say how stale the steps were. Without a spot worker nothing can run
ahead (the trainer's own engine shares its accelerators), so k = 1 trains exactly as k = 0."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import run_cli, run_json

# whole jobs over a minute: .ci/run's slow tier; one xdist group, so the heavy tiers'
# --dist loadgroup builds the module's whole-job fixture once
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("test_staleness_live")]

LOCAL = Path(__file__).resolve().parents[1] / "examples" / "local.yaml"
CORRECTED = "algorithm.rollout_correction.level=token"


def launch(home: Path, *sets: str, env: dict[str, str] | None = None) -> None:
    args = [x for s in sets for x in ("--set", s)]
    proc = run_cli("launch", str(LOCAL), "--record-rollouts", *args, home=home, timeout=540, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def records(home: Path) -> Path:
    [d] = list((home / "jobs").glob("*/records"))
    return d


def metrics(home: Path) -> list[dict]:
    [path] = list(home.rglob("metrics.jsonl"))
    return [r for r in map(json.loads, path.read_text().splitlines()) if "step_s" in r]


def rollouts(home: Path) -> list[dict]:
    return [json.loads(line) for line in (records(home) / "rollouts.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def homes(tmp_path_factory) -> dict[int | str, Path]:
    """The shipped local job, seed 0, strictly on-policy and one step off-policy, both corrected (and one
    step off-policy with weights swapped in flight: "in_flight"). Each step begins once a spot worker holds
    the weights (RLBOOST_WAIT_ENGINES), so that whether the next step runs ahead does not hinge on where the
    trace's preemptions land or how fast a busy machine boots one. The fleet holds that worker
    (min_workers 1): the cost objective sizes the fleet from measured step times, and on a busy machine it
    chose none, leaving every step to wait RLBOOST_WAIT_ENGINES_S (300 s) for a worker never bid for."""
    out: dict[int | str, Path] = {}
    fleet = "rollout.min_workers=1"
    for k in (0, 1):
        out[k] = tmp_path_factory.mktemp(f"k{k}") / "home"
        launch(out[k], f"algorithm.max_staleness={k}", CORRECTED, fleet, env={"RLBOOST_WAIT_ENGINES": "1"})
    out["in_flight"] = tmp_path_factory.mktemp("in_flight") / "home"
    launch(
        out["in_flight"], "algorithm.max_staleness=1", "algorithm.weight_swap=in_flight", CORRECTED, fleet,
        env={"RLBOOST_WAIT_ENGINES": "1"},
    )
    return out


def test_one_step_off_policy_learns_as_the_on_policy_job(homes):
    last5 = {k: sum(r["reward"] for r in metrics(h)[-5:]) / 5 for k, h in homes.items()}
    assert len(metrics(homes[1])) == 40
    assert last5[1] >= 0.9 * last5[0], last5
    assert last5[0] > metrics(homes[0])[0]["reward"] + 0.1  # the on-policy job itself learned


def test_weights_swapped_in_flight_learn_and_keep_each_tokens_version(homes):
    """algorithm.weight_swap in_flight: a response in flight when a version lands continues on it; the
    record keeps the version that began it (at most one behind its step) and each swap's token offset."""
    h = homes["in_flight"]
    rows = metrics(h)
    assert len(rows) == 40 and {r["staleness"] for r in rows} <= {0, 1}
    last5 = {k: sum(r["reward"] for r in metrics(homes[k])[-5:]) / 5 for k in (0, "in_flight")}
    assert last5["in_flight"] >= 0.9 * last5[0], last5
    rs = rollouts(h)
    assert sorted({r["step"] for r in rs}) == list(range(40))
    for r in rs:
        assert r["step"] - r["version"] in (0, 1), r
        offsets = [o for o, _ in r.get("swaps", [])]
        versions = [r["version"], *(v for _, v in r.get("swaps", []))]
        # tokens from each offset on come from a newer version, never one its step's update publishes
        assert offsets == sorted(set(offsets)) and all(0 < o < len(r["tokens"]) for o in offsets), r["rid"]
        assert versions == sorted(set(versions)) and versions[-1] <= r["step"], r["rid"]


def test_each_step_has_one_version_at_most_one_behind(homes):
    versions: dict[int, set[int]] = defaultdict(set)
    for r in rollouts(homes[1]):
        versions[r["step"]].add(r["version"])
    assert sorted(versions) == list(range(40))
    assert all(len(v) == 1 for v in versions.values()), "a step mixed weight versions"
    lag = {step: step - v.pop() for step, v in versions.items()}
    assert set(lag.values()) <= {0, 1} and lag[0] == 0
    # a spot worker is up at each step's start, so the next step runs ahead while the trainer trains
    # (unless the trace preempts that worker first)
    assert sum(lag.values()) >= 20, lag
    rows = metrics(homes[1])
    assert [r["staleness"] for r in rows] == [lag[r["step"] - 1] for r in rows]
    assert {r["staleness"] for r in metrics(homes[0])} == {0}
    assert {r["step"] - r["version"] for r in rollouts(homes[0])} == {0}


def test_status_and_cost_report_say_how_stale_the_steps_were(homes):
    rows = metrics(homes[1])
    stale = sum(1 for r in rows if r["staleness"])
    out = run_cli("cost-report", "1", home=homes[1], check=True).stdout
    assert f"off-policy: {stale} of 40 step(s) trained responses from weights up to 1 version(s) older" in out
    out = run_cli("status", "1", home=homes[1], check=True).stdout
    assert " stale " in out and "off-policy: " in out
    recent = run_json("status", "1", home=homes[1])["jobs"][0]["recent_steps"]
    assert [s["staleness"] for s in recent] == [r["staleness"] for r in rows[-len(recent):]]
    for cmd in (("cost-report", "1"), ("status", "1")):
        assert "off-policy" not in run_cli(*cmd, home=homes[0], check=True).stdout
    # the trainer waited less for rollouts: a larger share of its seconds trained
    busy = {k: sum(r["train_s"] for r in metrics(h)) / sum(r["step_s"] for r in metrics(h)) for k, h in homes.items()}
    assert busy[1] > busy[0], busy


def test_without_a_spot_worker_k1_trains_exactly_as_k0(tmp_path):
    """The trainer's own engine shares its accelerators: the next step waits for the update, on-policy."""
    got = {}
    for k in (0, 1):
        home = tmp_path / f"k{k}"
        launch(home, f"algorithm.max_staleness={k}", "rollout.max_workers=0", "algorithm.steps=6")
        weights = load_file(str(records(home) / "final.safetensors"))
        got[k] = ({r["rid"]: r["tokens"] for r in rollouts(home)}, weights)
    assert got[0][0] == got[1][0]
    assert got[0][1].keys() == got[1][1].keys() and all(torch.equal(got[0][1][n], got[1][1][n]) for n in got[0][1])


@pytest.mark.faults
def test_a_trainer_killed_while_the_next_step_generates_resumes_on_the_same_prompts(tmp_path):
    """kill -9 of the trainer at k = 1, when the step after the one it trains has already drawn its
    prompts: the checkpoint keeps the sampler as it was before that draw, so the resumed job trains every
    step on the prompts a run without the kill draws, each response once, at most one version behind."""
    import threading

    import numpy as np
    import yaml

    from rlboost.cli.state import StateStore
    from rlboost.contracts.spec import JobSpec
    from rlboost.trainer.tasks import make_task
    from tests.chaos import job_step, kill_instance, wait_until_step
    from tests.test_faults_recovery import job_yaml

    home, name = tmp_path / "home", "stale-kill"
    path = job_yaml(tmp_path, name, 3)
    raw = yaml.safe_load(path.read_text())
    raw["algorithm"].update(max_staleness=1, rollout_correction={"level": "token"})
    path.write_text(yaml.safe_dump(raw))
    killed: list[str] = []

    def kill_later() -> None:
        wait_until_step(home, name, 9)  # checkpoints at 4 and 8: steps 9.. are redone
        with StateStore(home / "state.db") as store:
            victim = [i.id for i in store.instances(store.get_job(name).id) if i.role == "trainer"][-1]
        if job_step(home, name) < 14 and kill_instance(victim) > 0:
            killed.append(victim)

    t = threading.Thread(target=kill_later, daemon=True)
    t.start()
    proc = run_cli("launch", str(path), "--record-rollouts", home=home, timeout=540)
    t.join(5)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert killed, "the kill did not happen"
    store = StateStore(home / "state.db")
    job = store.get_job(name)
    assert any(e.type == "trainer-lost" for e in store.events(job.id))
    spec = JobSpec.model_validate(yaml.safe_load(job.spec_yaml))
    algo = spec.algorithm
    rows = rollouts(home)
    assert len({r["rid"] for r in rows}) == len(rows) == algo.steps * algo.prompts_per_step * algo.group_size
    assert {r["step"] - r["version"] for r in rows} <= {0, 1}
    task, rng = make_task(spec.task, spec.model), np.random.default_rng(algo.seed)
    drawn = {step: [list(p.prompt_ids) for p in task.sample(rng, algo.prompts_per_step)] for step in range(algo.steps)}
    for r in rows:  # s3-p4-g10: step 3, prompt 4
        step, prompt = (int(x[1:]) for x in r["rid"].split("-")[:2])
        assert r["prompt"] == drawn[step][prompt], r["rid"]
