"""`simulate --sweep --sweep-trainer`: the sweep once per trainer shape, each shape the job file with its
trainer's accelerators replaced (priced and rated by the code that prices and rates the job's own), and
the cheapest trainer + fleet that meets the job's objective (and deadline)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlboost.cli.main import app
from rlboost.cli.sim_report import Choice
from rlboost.cli.sim_trainer import pick_trainer
from rlboost.contracts.perf import split_accelerator
from rlboost.contracts.spec import load_spec, parse_spec
from rlboost.rollout import scheduling
from rlboost.simulator import PRESETS, trainer_sweep
from rlboost.simulator import cli as sim_cli
from tests.test_simulate_answers import result
from tests.test_simulator import job

EXAMPLES = sorted((Path(__file__).parent.parent / "examples" / "simulate").glob("*.yaml"))


def simulate(*args: str, out: bool = False) -> tuple[int, str]:
    """(exit code, the output; `out`: stdout alone)."""
    r = CliRunner().invoke(app, ["simulate", *args], catch_exceptions=False)
    return r.exit_code, r.stdout if out else r.output


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_shipped_example_sweeps_its_trainer(path, home):
    """Half the job's GPUs and the job's own, two steps, one fleet size: every shipped example replays
    both, each shape at its own price, and names the trainer it recommends."""
    name, count = split_accelerator(load_spec(path).trainer.accelerators)
    half, own = f"{name}:{max(1, count // 2)}", f"{name}:{count}"
    args = [str(path), "--sweep", "--sweep-trainer", f"{half},{own}", "--sweep-workers", "1", "--steps", "2"]
    code, out = simulate(*args, "--jobs", "1", "--json", out=True)
    assert code == 0, out
    doc = json.loads(out)
    rows = doc["results"]
    assert rows[0]["trainer"] == own and rows[0]["policy"] == "on-demand"  # the baseline: the job's trainer
    assert {r["trainer"] for r in rows} == {half, own} and all(r["steps"] == 2 for r in rows)
    alone = {r["trainer"]: r for r in rows if r["policy"] == "on-demand"}
    assert alone[half]["tokens_per_s"] < alone[own]["tokens_per_s"]  # fewer GPUs train slower
    assert alone[half]["trainer_dollars"] < alone[own]["trainer_dollars"]
    if load_spec(path).deadline_hours is None:
        assert doc["trainer"]["setting"].startswith("trainer ")
    else:  # two of its 200 steps meet no deadline, and it says so
        assert doc["trainer"]["setting"] is None and "none of 6 settings meets it" in doc["trainer"]["text"]
    code, text = simulate(*args, "--jobs", "1")
    assert code == 0 and "Trainer + fleet (objective " in text and "trainer $/h: " in text, text


def fixed_job(**over) -> dict:
    """Trainer A100:1 at $4/h (the table's A100: 2,000 training tokens/s a GPU), no engine of its own, so
    generation is the spot fleet's alone and the same whatever the trainer."""
    base = job(
        model={"kind": "synthetic", "train_tokens_per_s": None},
        rollout={"trainer_engine": False},
        perf={"A100": {"tokens_per_s": 800, "seq_tokens_per_s": 40, "ref_batch": 64, "train_tokens_per_s": 2000}},
        algorithm={"steps": 6},
    )
    return merged(base, over)


def merged(a: dict, b: dict) -> dict:
    deep = {k: merged(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v for k, v in b.items()}
    return {**a, **deep}


def test_twice_the_gpus_train_a_step_faster_and_cost_twice_per_hour():
    # training-bound: 4 workers generate ~7,500 tokens/s, the trainer trains 500 (one GPU) or 1,000
    rp = sim_cli.prepare(parse_spec(fixed_job(perf={"A100": {"train_tokens_per_s": 500}})), None, constant_workers=4)
    one, two = (trainer_sweep.with_trainer(rp, t) for t in ("A100:1", "A100:2"))
    assert scheduling.trainer_tokens_per_s(two.spec) == 2 * scheduling.trainer_tokens_per_s(one.spec) == 1000
    assert (one.trainer.hourly_price, two.trainer.hourly_price) == (4.0, 8.0)  # trainer.hourly_price, per GPU
    r1, r2 = (x.replay(PRESETS["rlboost-fixed"]) for x in (one, two))
    assert r1.trained_tokens == r2.trained_tokens > 0  # the same prompts and lengths
    s1, s2 = ([x["step_s"] for x in r.step_log[1:]] for r in (r1, r2))
    assert all(b < 0.8 * a for a, b in zip(s1, s2)), (s1, s2)  # each step's tokens trained faster
    assert r2.tokens_per_s > 1.35 * r1.tokens_per_s
    # billed from when the trainer serves (boot_s in) to the end, at its $/h
    for r, price in ((r1, 4.0), (r2, 8.0)):
        assert r.trainer_dollars == pytest.approx((r.job_s - 5.0) / 3600 * price)


def test_the_cheaper_trainer_wins_when_both_meet_the_objective():
    """Generation-bound (2 workers; the trainer trains 100k tokens/s a GPU): twice the GPUs make no step
    faster, so under `objective: throughput` both meet it and the one at half the price is picked. When
    training bounds the step, the bigger trainer is the only one within 1 % of the fastest."""
    fast = {"A100": {"train_tokens_per_s": 100_000}}
    for train, want in ((fast, "A100:1"), ({"A100": {"train_tokens_per_s": 300}}, "A100:2")):
        spec = parse_spec(fixed_job(rollout={"objective": "throughput"}, perf=train))
        rp = sim_cli.prepare(spec, None, constant_workers=2)
        base, swept = trainer_sweep.sweep_trainers(rp, ["A100:1", "A100:2"], [2], jobs=1)
        fleets = {p.trainer: p.result for p in swept if p.objective == "throughput"}
        pick = pick_trainer([Choice("alone", base), *(Choice(p.label, p.result) for p in swept)], "throughput")
        assert pick is not None and pick.best is not None
        assert pick.best.label.startswith(f"trainer {want}, "), (pick.lines(), fleets)
        if want == "A100:1":  # honest: the two really are as fast, and the small one really is cheaper
            assert fleets["A100:1"].tokens_per_s >= 0.99 * fleets["A100:2"].tokens_per_s
            assert fleets["A100:1"].dollars < fleets["A100:2"].dollars
            assert pick.met >= 2 and "within 1% of the fastest" in pick.lines()[0]


def test_pick_trainer_follows_the_objective_and_the_deadline():
    slow = Choice("trainer A100:4, objective cost, max_workers 2", result("rlboost-cost", tokens=1000, run_s=200,
                                                                             trainer=2, spot=1))  # 333 tok/$
    quick = Choice("trainer A100:8, objective cost, max_workers 2", result("rlboost-cost", tokens=1000, run_s=100,
                                                                              trainer=4, spot=1))  # 200 tok/$
    assert pick_trainer([slow, quick], "cost").best is slow
    assert pick_trainer([slow, quick], "throughput").best is quick  # slow is half as fast: it does not meet
    # 10 steps in 200 s or 100 s: a deadline of 150 s leaves the quick one alone
    met = pick_trainer([slow, quick], "cost", deadline_h=150 / 3600, steps=10)
    assert met.best is quick and met.met == 1 and "done within" in met.lines()[0]
    none = pick_trainer([slow, quick], "cost", deadline_h=50 / 3600, steps=10)
    assert none.best is None and none.lines()[0].endswith(f"the fastest, {quick.label}, needs 0.03 h.")


def test_a_shape_of_another_kind_or_count_is_priced_as_the_job_file_would_be():
    """trainer.hourly_price is the job's node of its accelerators: per GPU for the same kind; another kind
    is priced as the job file would price it without one (here the built-in table)."""
    rp = sim_cli.prepare(parse_spec(fixed_job()), None, constant_workers=1)
    assert trainer_sweep.with_trainer(rp, "A100:8").trainer.hourly_price == 32.0
    other = trainer_sweep.with_trainer(rp, "H100:2")
    assert other.spec.trainer.hourly_price is None and other.trainer.hourly_price == pytest.approx(2 * 11.06125)
    # a synthetic model's own training rate scales as the perf table scales the trainer
    given = replace(rp, spec=parse_spec(fixed_job(model={"train_tokens_per_s": 3000})))
    assert scheduling.trainer_tokens_per_s(trainer_sweep.with_trainer(given, "A100:4").spec) == 12_000
    # AWS sells A100 in eights: four of them at the catalog's A100:8 price per GPU, not the built-in table's
    aws = sim_cli.prepare(load_spec(EXAMPLES[0].parent / "aws-p3-v100.yaml"), None, steps=1)
    assert aws.spec.trainer.accelerators == "A100:8"
    four = trainer_sweep.with_trainer(aws, "A100:4")
    assert four.trainer.hourly_price == pytest.approx(aws.trainer.hourly_price / 2)
    assert "it sells no A100:4 there" in trainer_sweep.price_note(aws, ["A100:4", "A100:8"])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("H100", "--sweep-trainer 'H100': 'H100' is not ACCELERATOR:GPUS; give the GPUs of each shape, e.g. H100:4"),
        ("H100:0", "--sweep-trainer 'H100:0': 'H100:0' has no GPUs; give 1 or more per shape"),
        ("H100:x", "--sweep-trainer 'H100:x': 'H100:x' is not ACCELERATOR:GPUS"),
        ("FOO:4", "--sweep-trainer 'FOO:4': no performance model for 'FOO'; pick one of A100, "),
        (" , ", "--sweep-trainer ' , ': give at least one trainer shape, e.g. H100:4,H100:8"),
    ],
)
def test_a_malformed_shape_names_the_flag_and_the_fix(value, message):
    with pytest.raises(ValueError) as e:
        trainer_sweep.parse_trainers(value, parse_spec(job()))
    assert str(e.value).startswith(message), e.value


def test_shapes_parse_in_order_once_each():
    assert trainer_sweep.parse_trainers("H100:8, h100:8,A100:4", parse_spec(job())) == ["H100:8", "A100:4"]


def test_cli_refuses_before_replaying(tmp_path, home, monkeypatch):
    def replayed(*a, **k):
        raise AssertionError("a usage error replayed the job")

    monkeypatch.setattr(sim_cli, "prepare", replayed)
    jf = tmp_path / "job.yaml"
    jf.write_text(yaml.safe_dump(job()))
    local = EXAMPLES[0].parent.parent / "local.yaml"  # a tiny-gpt job on this machine
    for args, message in [
        ([str(jf), "--sweep-trainer", "A100:2"], "error: --sweep-trainer needs --sweep: add --sweep, or leave"),
        ([str(jf), "--sweep", "--sweep-trainer", "A100"], "error: --sweep-trainer 'A100': 'A100' is not"),
        ([str(local), "--sweep", "--sweep-trainer", "A100:2"], "error: --sweep-trainer: a local tiny-gpt job's"),
    ]:
        code, out = simulate(*args)
        assert code == 2 and out.startswith(message) and len(out.strip().splitlines()) == 1, out
