"""The simulator's model of a local job: engines that batch statically (torch), the dispatch round trip,
and processes sharing this machine's cores (simulate.cpu_cores). Deterministic replays, exact timings."""

from __future__ import annotations

import numpy as np
import pytest

from rlboost.contracts.lengths import LengthModel
from rlboost.contracts.spec import parse_spec
from rlboost.providers.pricing import spot_offers, trainer_offer
from rlboost.providers.spot_market import constant_trace
from rlboost.rollout import scheduling
from rlboost.simulator import PRESETS, simulate_job

BATCH = 32
PULL = 0.5


def torch_job(workers: int = 0, **simulate) -> dict:
    return {
        "name": "simtorch",
        "model": {"kind": "tiny-gpt"},
        "algorithm": {"prompts_per_step": 8, "group_size": 8, "max_new_tokens": 40, "steps": 4, "seed": 1},
        "task": {"name": "reverse", "reward": "exact_match"},
        "trainer": {"accelerators": "A100:1", "hourly_price": 4.0},
        "rollout": {
            "engine": "torch",
            "engine_batch": BATCH,
            "max_workers": workers,
            "min_workers": workers,
            "candidates": [{"accelerator": "A100", "clouds": ["local"], "spot_price": 1.2, "on_demand_price": 3.6}],
        },
        "perf": {
            "A100": {
                "tokens_per_s": 3200,
                "seq_tokens_per_s": 400,
                "prefill_tokens_per_s": 50_000,
                "train_tokens_per_s": 10_000,
                "ref_batch": BATCH,
            }
        },
        "local": {"time_scale": 1.0, "capacity_scale": 1.0},
        "simulate": {"boot_s": 1.0, "pull_s": PULL, "reserved_pull_s": PULL, "step_overhead_s": 0.1, **simulate},
    }


def replay(raw: dict, lengths: tuple[int, ...]):
    spec = parse_spec(raw)
    policy = PRESETS["rlboost-fixed"] if raw["rollout"]["max_workers"] else PRESETS["on-demand"]
    trace = constant_trace(raw["rollout"]["max_workers"])
    lm = LengthModel(recorded=lengths)
    res = simulate_job(spec, trace, [policy], trainer_offer(spec), spot_offers(spec), lengths=lm)
    return spec, res[0]


def gen_s(res) -> list[float]:  # rounded to ms
    return [s["gen_s"] for s in res.step_log[1:]]  # step 0 waits for the engines to start


def test_a_static_engine_runs_each_batch_to_its_longest_response():
    # 64 responses on the reserved engine alone: two batches of 32, each as long as its longest member
    spec, long_only = replay(torch_job(), (20,))
    _, mixed = replay(torch_job(), (2, 20))  # most batches mix short and long responses
    model = scheduling.engine_model_for(spec, "A100")
    decode = 20 * model.step_time(BATCH)
    for g in gen_s(long_only):
        prefill = g - PULL - 2 * decode  # the two batches' prefills, whatever the prompts
        assert 0 < prefill < 2 * model.prefill_time(BATCH * 40)
    # a finished row keeps its slot: the short responses free nothing, so the step takes as long
    assert gen_s(mixed) == pytest.approx(gen_s(long_only), rel=1e-9)


def test_a_continuous_engine_refills_what_a_static_one_holds():
    _, static = replay(torch_job(), (2, 20))
    raw = torch_job()
    raw["rollout"]["engine"] = "synthetic"  # continuous batching: a finished row's slot takes the next request
    raw["model"] = {"kind": "synthetic", "train_tokens_per_s": 10_000}
    raw["rollout"]["synthetic"] = {"prompt_tokens": 8}
    _, continuous = replay(raw, (2, 20))
    assert max(gen_s(continuous)) < min(gen_s(static))


def test_the_dispatch_round_trip_delays_every_batch_of_a_static_engine():
    _, base = replay(torch_job(), (20,))
    _, slow = replay(torch_job(dispatch_s=0.05), (20,))
    # two batches a step, each waits one round trip before its prefill
    assert np.subtract(gen_s(slow), gen_s(base)) == pytest.approx([2 * 0.05] * len(gen_s(base)), rel=1e-9)


def test_processes_share_the_cores():
    # the reserved engine and one worker generate side by side (a batch each); the trainer trains alone
    lengths = (20,)
    _, own = replay(torch_job(workers=1), lengths)  # a node each (the cloud)
    _, two = replay(torch_job(workers=1, cpu_cores=2), lengths)  # a core each
    _, one = replay(torch_job(workers=1, cpu_cores=1), lengths)  # both engines on one core
    assert gen_s(two) == pytest.approx(gen_s(own), rel=1e-9)
    decode_own = np.subtract(gen_s(own), PULL)  # pulls are measured timings: not stretched
    decode_one = np.subtract(gen_s(one), PULL)
    assert decode_one == pytest.approx(2 * decode_own, abs=2e-3)  # the step log rounds to ms
    train_own = [s["step_s"] - s["gen_s"] for s in own.step_log[1:]]
    train_one = [s["step_s"] - s["gen_s"] for s in one.step_log[1:]]
    assert train_one == pytest.approx(train_own, rel=1e-9)  # nothing else is busy while it trains


def test_serving_responses_makes_the_trainer_a_busy_process_while_engines_generate():
    # the reserved engine and one worker take a batch of 32 each; the trainer serves each response
    # (its dispatch, streamed tokens and end) with 1 ms of CPU
    lengths = (20,)
    _, base = replay(torch_job(workers=1, cpu_cores=2), lengths)
    _, served = replay(torch_job(workers=1, cpu_cores=2, serve_s=0.001), lengths)
    # three busy processes on two cores: the coordinator's 64 ms of CPU take 96 ms at 2/3 of a core,
    # and the engines, at 2/3 of theirs meanwhile, lose a third of those 96 ms
    assert np.subtract(gen_s(served), gen_s(base)) == pytest.approx([0.032] * len(gen_s(base)), abs=2e-3)
    train_base = [s["step_s"] - s["gen_s"] for s in base.step_log[1:]]
    train_served = [s["step_s"] - s["gen_s"] for s in served.step_log[1:]]
    assert train_served == pytest.approx(train_base, rel=1e-9)  # served before the training starts
    # a core each (three cores), or a node each (a cloud job): serving slows no engine
    _, roomy = replay(torch_job(workers=1, cpu_cores=3, serve_s=0.001), lengths)
    _, cloud = replay(torch_job(workers=1, serve_s=0.001), lengths)
    assert gen_s(roomy) == gen_s(base) == gen_s(cloud)


def test_the_warm_start_shares_the_cores_with_starting_processes():
    _, own = replay(torch_job(warm_start_s=2.0, reserved_boot_s=10.0), (20,))
    _, one = replay(torch_job(warm_start_s=2.0, reserved_boot_s=10.0, cpu_cores=1), (20,))
    up = 1.0  # trainer_boot_s defaults to boot_s
    assert own.step_log[0]["t0"] == pytest.approx(up + 2.0)
    # the reserved engine starts up (importing torch) all along: the trainer gets half the core
    assert one.step_log[0]["t0"] == pytest.approx(up + 4.0)


def test_work_that_speeds_up_ends_once():
    """A start-up re-timed to end earlier leaves its later end event behind: that stale end must not
    run the start-up's continuation a second time (a worker would pull its weights twice)."""
    import heapq

    from rlboost.simulator.cores import CoreShare
    from rlboost.simulator.engines import Fleet
    from rlboost.simulator.events import EventQueue

    q = EventQueue()
    fleet = Fleet(static=True)
    cores = CoreShare(1.0, q, fleet)
    model = scheduling.engine_model_for(parse_spec(torch_job()), "A100")
    others = [fleet.add(f"w{i}", "spot", model, None, 0.0) for i in range(2)]  # booting: busy too
    done: list[float] = []
    cores.start_work(("boot", 9), 1.0, lambda: done.append(q.now))

    def others_ready(_) -> None:
        for e in others:
            e.state = "ready"  # started up, holding nothing: no longer busy

    q.on("others_ready", others_ready)
    q.push(0.5, "others_ready")
    cores.reshare()  # two others busy on one core (the work's own process is not in the fleet): half speed
    while q.heap:
        q.now, _, kind, payload = heapq.heappop(q.heap)
        q.handlers[kind](payload)
        cores.reshare()  # alone from 0.5 on: the 0.25 s done leaves 0.75 s, so it ends at 1.25 s
    assert done == [pytest.approx(1.25)]


def test_the_platform_is_measured_with_the_real_parts():
    from rlboost.models.torch_engine import TorchEngine
    from rlboost.simulator.round_trip import PlatformProbe, measure_platform, measure_serving
    from rlboost.trainer.learner import Learner
    from rlboost.trainer.tasks import make_task

    spec = parse_spec(torch_job())
    task = make_task(spec.task, spec.model)
    prompt = task.sample(np.random.default_rng(0), 1)[0].prompt_ids
    learner = Learner(spec.model, spec.algorithm, spec.task, seed=0)

    def train_step() -> dict:
        learner.warm_start(1)
        return learner.state_dict()

    engine = TorchEngine(spec.model, dtype="float32", max_batch=BATCH, eos_id=-1)
    probe = PlatformProbe(learner.state_dict(), train_step, engine, prompt, task.eos_id)
    p = measure_platform(spec, probe)
    # the round trip is what a step takes beyond its compute: a few ms, which a busy machine can hide
    # entirely (then 0); the pull always takes time
    assert 0 <= p.dispatch_s < 1.0 and 0 < p.pull_s < 5.0
    # a worker in its own process generates a step of the job's size: its tokens and ends cost this
    # process some CPU per response (tens of microseconds here), never nothing
    assert 0 < measure_serving(spec, probe) < 0.01
