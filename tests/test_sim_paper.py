"""`rlboost simulate` of the paper's setting: an hf job with no weights or tokenizer, the `sync` and
`spot-restart` baselines, constant spot capacity, and one offload decision path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlboost.contracts.perf import DEFAULT_PERF, SYNC_COSTS, EngineModel
from rlboost.contracts.spec import JobSpec, load_spec
from rlboost.rollout.policies.lengths import LengthStats
from rlboost.rollout.policies.offload import NoOffload, PredictiveOffload, offload_tick, step_progress
from rlboost.rollout.policies.views import EngineView
from rlboost.simulator import cli as sim_cli

PAPER = Path(__file__).resolve().parents[1] / "examples/simulate/paper-h100.yaml"


def paper_job(tmp_path: Path, records: int = 512, **over) -> Path:
    """The shipped paper job, with a prompt file of `records` distinct prompts, written beside it."""
    doc = yaml.safe_load(PAPER.read_text())
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"question": f"q{i}", "answer": "1"}) + "\n" for i in range(records)))
    doc["task"]["path"] = str(data)
    doc["algorithm"]["prompts_per_step"] = 32  # a quarter of the paper's batch keeps the test quick
    for k, v in over.items():
        doc[k] = v
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    return job


def by_policy(results):
    return {r.policy.name: r for r in results}


def test_hf_job_simulates_without_weights_or_tokenizer(tmp_path, monkeypatch):
    from rlboost.models import hf

    def refuse(*a, **k):
        raise AssertionError("the simulator must not load a model or a tokenizer")

    monkeypatch.setattr(hf, "load_tokenizer", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = load_spec(paper_job(tmp_path))
    assert spec.model.kind == "hf" and spec.model.path == "Qwen/Qwen3-8B"
    _, results = sim_cli.run(spec, None, ["sync", "rlboost"], steps=2, constant_workers=1)
    res = by_policy(results)
    assert set(res) == {"on-demand", "sync", "rlboost"}
    assert all(r.steps == 2 and r.trained_tokens > 0 for r in results)


def test_jsonl_prompt_lengths_estimated_from_text_without_prompt_tokens(tmp_path):
    from rlboost.simulator.workload import CHARS_PER_TOKEN, replay_task

    spec = load_spec(paper_job(tmp_path))
    doc = spec.model_dump(mode="json")
    doc["rollout"]["synthetic"]["prompt_tokens"] = None
    task = replay_task(JobSpec.model_validate(doc))
    [p] = task.sample(np.random.default_rng(0), 1)
    text = f"q{p.index}"
    assert len(p.prompt_ids) == max(1, round(len(text) / CHARS_PER_TOKEN))


def test_sync_pays_its_costs_and_spot_restart_uses_its_workers(tmp_path):
    spec = load_spec(paper_job(tmp_path))
    _, results = sim_cli.run(spec, None, ["sync", "spot-restart"], steps=3, constant_workers=2)
    res = by_policy(results)
    od, sync, restart = res["on-demand"], res["sync"], res["spot-restart"]
    assert od.trained_tokens == sync.trained_tokens == restart.trained_tokens  # the same responses
    # sync generates like the trainer alone, then adds forward passes and a weight reshard per step
    extra = SYNC_COSTS.forward_s(od.trained_tokens, 8 * DEFAULT_PERF["H100"].train_tokens_per_s)
    assert sync.run_s - od.run_s == pytest.approx(extra, rel=0.05)
    # spot-restart's workers generate their share once booted: that step's generation is shorter than
    # the trainer alone's (the baseline no longer gives exactly 1.00x)
    last_r, last_od = restart.step_log[-1], od.step_log[-1]
    assert last_r["n_remote"] == 2
    assert last_r["gen_s"] < last_od["gen_s"]
    assert restart.tokens_per_s > od.tokens_per_s
    assert restart.spot_dollars > 0


def test_model_kinds_agree(tmp_path):
    spec = load_spec(paper_job(tmp_path, records=4096))
    doc = spec.model_dump(mode="json")
    doc["task"] = {"name": "add"}
    doc["model"] = {"kind": "synthetic"}
    doc["rollout"]["engine"] = "synthetic"
    synth = JobSpec.model_validate(doc)
    a = by_policy(sim_cli.run(spec, None, ["rlboost"], steps=4, constant_workers=2)[1])
    b = by_policy(sim_cli.run(synth, None, ["rlboost"], steps=4, constant_workers=2)[1])
    for name in ("on-demand", "rlboost"):
        assert a[name].tokens_per_s == pytest.approx(b[name].tokens_per_s, rel=0.05)


def test_constant_workers_and_trace_exclude_each_other(tmp_path):
    spec = load_spec(paper_job(tmp_path))
    with pytest.raises(ValueError, match="pick one"):
        sim_cli.run(spec, PAPER, ["rlboost"], steps=1, constant_workers=1)


def test_constant_workers_last_as_long_as_the_jobs_market(tmp_path):
    """A job whose steps are a bound (`steps: 100000`) replayed on a constant market ends with the job's
    own trace, as without --constant-workers, not after the constant market's 1,000 h (minutes of replay)."""
    doc = yaml.safe_load(paper_job(tmp_path).read_text())
    doc["algorithm"]["steps"] = 100_000
    spec = JobSpec.model_validate(doc)
    market_h = sim_cli.prepare(spec, None, calibrated=False).trace.duration / 3600
    rp = sim_cli.prepare(spec, None, constant_workers=2, calibrated=False)
    assert rp.trace.duration / 3600 == pytest.approx(market_h)
    assert rp.outlasts_h is not None and rp.outlasts_h > 2 * market_h
    assert rp.spec.simulate.hours == pytest.approx(market_h)
    # a job that fits runs all its steps, as before
    small = sim_cli.prepare(load_spec(paper_job(tmp_path)), None, constant_workers=2, calibrated=False)
    assert small.outlasts_h is None and small.spec.simulate.hours is None


# ---- one decision path: offload_tick / step_progress (the coordinator and the simulator call these) ----
def _progress(remote: int = 1, unfinished: int = 4):
    m = EngineModel(8088, 133, 22000, max_batch=128, replicas=2)
    gen = np.full(unfinished, 100.0)
    return step_progress(
        elapsed=10.0,
        remote=[EngineView(f"w{i}", "spot", m.capacity, 0, 0.0, m) for i in range(remote)],
        generated=gen,
        budget_left=1000 - gen,
        held_tokens=float(gen.sum()),
        reserved_context=1000.0,
        reserved_rate=500.0,
        stats=LengthStats(1000),
    )


def test_step_progress_sums_what_the_policy_needs():
    p = _progress(remote=2)
    assert p.remote_engines == 2 and p.unfinished == 4
    assert p.total_tokens == pytest.approx(400 + p.remaining_tokens)
    assert p.handoff_prefill_s == pytest.approx(1000 / (2 * 2 * 22000))
    empty = _progress(unfinished=0)
    assert empty.remaining_sample is None and empty.remaining_tokens == 0


def test_offload_tick_decides_offload_wait_and_resume():
    calls = []

    def prog():
        calls.append(1)
        return _progress()

    eager = PredictiveOffload(train_tokens_per_s=1e-9)  # training would take forever: offload at once
    d = offload_tick(eager, 5.0, offload_at=None, next_check=0.0, has_reserved=True, remote_ready=True, progress=prog)
    assert d.action == "offload" and calls == [1]
    never = NoOffload()
    d = offload_tick(never, 5.0, offload_at=None, next_check=0.0, has_reserved=True, remote_ready=True, progress=prog)
    assert d.action == "none" and d.next_check == float("inf")
    # not due yet: the policy is not asked
    d = offload_tick(eager, 5.0, offload_at=None, next_check=9.0, has_reserved=True, remote_ready=True, progress=prog)
    assert d.action == "none" and d.next_check == 9.0 and calls == [1, 1]
    # offloaded, and every remote engine is gone: the reserved engine generates again
    d = offload_tick(eager, 5.0, offload_at=1.0, next_check=0.0, has_reserved=True, remote_ready=False, progress=prog)
    assert d.action == "resume"
    d = offload_tick(eager, 5.0, offload_at=None, next_check=0.0, has_reserved=False, remote_ready=True, progress=prog)
    assert d.action == "none"


def test_cli_simulates_the_shipped_paper_job_at_constant_capacity():
    from typer.testing import CliRunner

    from rlboost.cli.main import app

    args = ["simulate", str(PAPER), "--policy", "sync", "--policy", "rlboost", "--constant-workers", "2"]
    r = CliRunner().invoke(app, [*args, "--steps", "1", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)  # (progress lines go to stderr)
    assert doc["title"].startswith("paper-h100: constant 2")
    assert [x["policy"] for x in doc["results"]] == ["on-demand", "sync", "rlboost"]
