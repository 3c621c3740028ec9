"""The fleet-size policy (rlboost/rollout/policies/fleet.py): pure decisions from measured steps."""

from __future__ import annotations

import dataclasses
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from rlboost.rollout.policies.fleet import FleetGoal, FleetPolicy, StepSample, fit_steps, surplus

# a step measured with 2 workers: 300 s to generate, 120 s of training, 20 s after the last response
GEN_BOUND = StepSample(n_remote=2, step_s=320.0, gen_s=300.0, train_s=120.0, tokens=1_000_000)


def world(n: int) -> StepSample:
    """A job whose step is generation-bound with few workers and meets the trainer's 120 s at 8."""
    gen = 300.0 * 3 / (1 + n)
    return StepSample(n_remote=n, step_s=max(gen + 20.0, 120.0), gen_s=gen, train_s=120.0, tokens=1_000_000)


def run(objective="cost", worker=1.0, trainer=10.0, steps=300, start=16, max_workers=16, step_of=world):
    policy, n, sizes = FleetPolicy(reserved_workers=1.0), start, []
    goal = FleetGoal(objective=objective, max_workers=max_workers)
    for _ in range(steps):
        n = policy.decide(step_of(n), goal, trainer_per_h=trainer, worker_per_h=worker, current=n).workers
        sizes.append(n)
    return sizes


def held(sizes: list[int]) -> int:
    """The size the policy settled on: the one it held most over the second half (probes are brief)."""
    half = sizes[len(sizes) // 2 :]
    return max(set(half), key=half.count)


def tokens_per_dollar(n: int, worker: float, trainer: float = 10.0) -> float:
    s = world(n)
    return s.tokens / s.step_s / (trainer + n * worker)


def test_the_step_model_stops_at_the_trainer():
    p = FleetPolicy(reserved_workers=1.0)
    assert p.predict_step_s(GEN_BOUND, 2) == 320.0
    assert p.predict_step_s(GEN_BOUND, 5) == 300.0 * 3 / 6 + 20.0
    assert p.predict_step_s(GEN_BOUND, 16) == 120.0


def test_throughput_stops_at_the_trainer_bottleneck():
    sizes = run("throughput")
    final = sizes[-1]
    assert world(final).step_s <= 120.0 * 1.02  # as fast as it gets...
    assert final <= 10  # ...without the 6+ workers that would only wait on the trainer
    assert run("throughput", max_workers=4, start=4)[-1] == 4  # still generation-bound at 4: keep all


def test_cost_finds_the_most_tokens_per_dollar():
    for worker in (0.5, 2.0, 30.0):
        final = held(run("cost", worker=worker))
        best = max(tokens_per_dollar(n, worker) for n in range(17))
        assert tokens_per_dollar(final, worker) >= 0.9 * best, (worker, final)
    assert held(run("cost", worker=30.0)) == 0  # a worker dearer than the trainer never pays


@settings(max_examples=25, deadline=None)
@given(p1=st.floats(0.05, 40.0), p2=st.floats(0.05, 40.0))
def test_monotone_in_price(p1, p2):
    lo, hi = sorted((p1, p2))
    assert held(run("cost", worker=hi, steps=150)) <= held(run("cost", worker=lo, steps=150))


def test_holds_a_size_between_probes():
    sizes = run("cost", worker=2.0)
    changes = sum(1 for a, b in itertools.pairwise(sizes) if a != b)
    assert changes <= 2 * len(sizes) / 8  # at most a trial and its return per probe period


def test_deadline_buys_speed_only_when_needed():
    def sized(pace: float | None, worker: float = 30.0) -> tuple[list[int], list[bool]]:
        policy, n, out, risk = FleetPolicy(reserved_workers=1.0), 16, [], []
        goal = FleetGoal("cost", 16, **({} if pace is None else {"steps_left": 10, "time_left_s": 10 * pace}))
        for _ in range(200):
            d = policy.decide(world(n), goal, trainer_per_h=10.0, worker_per_h=worker, current=n)
            n = d.workers
            out.append(n)
            risk.append(d.deadline_at_risk)
        return out, risk

    # time enough: the objective decides (workers dearer than the trainer: none)
    assert sized(1000.0) == sized(None) and held(sized(1000.0)[0]) == 0
    # 400 s a step needs workers (none: 920 s a step): the cheapest size that makes it, dear as they are
    tight, risk = sized(400.0)
    assert held(tight) > 0 and all(world(n).step_s <= 400.0 for n in tight[20:]) and not any(risk)
    # 60 s a step cannot be met: as fast as it gets (the trainer's 120 s floor at 8 workers), and says so
    hopeless, risk = sized(60.0)
    assert all(risk) and held(hopeless) == 8


def test_a_deadline_is_planned_on_the_fit_with_its_error_as_margin():
    exact = fit_steps([(1 + n, world(n).step_s / 1e6) for n in (1, 2, 3)], floor=0.0)
    assert exact.rel_err < 1e-9  # world() is exactly base + par / pool
    noisy = fit_steps([(1 + n, world(n).step_s / 1e6 * f) for n in (1, 2, 3) for f in (0.9, 1.1)], floor=0.0)
    assert 0.08 < noisy.rel_err < 0.12

    def slow_or_fast(n: int, i: int) -> StepSample:  # steps 10% either side of the model, in turn
        s, f = world(n), (0.9, 1.1)[i % 2]
        return dataclasses.replace(s, step_s=s.step_s * f, gen_s=s.gen_s * f)

    policy, n, out = FleetPolicy(reserved_workers=1.0), 16, []
    goal = FleetGoal("cost", 16, steps_left=10, time_left_s=10 * 330.0)
    for i in range(200):
        n = policy.decide(slow_or_fast(n, i), goal, trainer_per_h=10.0, worker_per_h=30.0, current=n).workers
        out.append(n)
    # the mean model says 2 workers make 330 s a step (320 s); planned on it with its error, the slow
    # steps keep the pace too
    assert world(held(out)).step_s * 1.1 <= 330.0, held(out)


def test_budget_caps_the_fleet():
    # $8/h workers next to a $10/h trainer, 100 steps to go: 8 workers (120 s a step, $74/h) cost $247 to
    # finish, 6 workers (149 s, $58/h) $239, 2 workers (320 s, $26/h) $231, none (920 s, $10/h) $256.
    def size(budget: float | None) -> int:
        goal = FleetGoal("throughput", 16, steps_left=100, budget_left=budget)
        return FleetPolicy(reserved_workers=1.0).decide(GEN_BOUND, goal, 10.0, 8.0, current=8).workers

    assert size(1000.0) == 8
    assert size(240.0) == 6  # the fastest that fits
    assert size(200.0) == 2  # nothing fits: the cheapest way per token


def test_min_workers_is_a_floor_and_min_equal_to_max_a_fixed_fleet():
    def sized(objective: str, worker: float, lo: int, hi: int) -> list[int]:
        policy, n, out = FleetPolicy(reserved_workers=1.0), hi, []
        goal = FleetGoal(objective=objective, max_workers=hi, min_workers=lo)
        for _ in range(120):
            n = policy.decide(world(n), goal, trainer_per_h=10.0, worker_per_h=worker, current=n).workers
            out.append(n)
        return out

    # a worker dearer than the trainer never pays: cost goes to the floor, and no lower
    assert held(run("cost", worker=30.0)) == 0 and min(sized("cost", 30.0, 3, 16)) == 3
    assert set(sized("cost", 30.0, 4, 4)) == {4} and set(sized("throughput", 1.0, 16, 16)) == {16}


def test_a_shrinking_fleet_releases_the_newest_workers():
    started = {"w1": 10.0, "w2": 30.0, "w3": 20.0, "w4": 40.0}
    assert surplus(list(started), started.get, keep=2) == ["w4", "w2"]
    assert surplus(list(started), started.get, keep=4) == []
    assert surplus(list(started), started.get, keep=9) == []


def test_the_controller_and_the_simulator_size_the_fleet_through_one_sizer():
    """FleetSizer: the fleet policy on placement's best candidate, and a deadline's reserve is one boot
    as placement measured it (not a simulate: setting)."""
    from rlboost.contracts.spec import parse_spec
    from rlboost.providers.pricing import spot_offers, trainer_offer
    from rlboost.rollout.scheduling import FleetClock, fleet_sizer, placement_tracker
    from tests.test_simulator import job

    spec = parse_spec(job(deadline_hours=1.0))
    offers = spot_offers(spec)
    placement = placement_tracker(spec, offers)
    sizer = fleet_sizer(spec, "cost", trainer_offer(spec).hourly_price, offers, placement, None)
    sample = StepSample(2, 100.0, 80.0, 30.0, 10_000)
    seen: list[FleetGoal] = []
    real = sizer.policy.decide

    def spy(s, goal, *a, **k):
        seen.append(goal)
        return real(s, goal, *a, **k)

    sizer.policy.decide = spy  # type: ignore[method-assign]
    placement.launched("w1", offers[0].key, 0.0)
    placement.joined("w1", 300.0)
    d = sizer.decide(sample, FleetClock(1, 600.0, 5.0), 600.0, current=2)
    assert 0 <= d.workers <= spec.rollout.max_workers
    # the prior: a local process's start (the job's trace runs at time_scale 1 here)
    assert seen[0].switch_s == placement.boot_estimate_s() == (2.0 + 300.0) / 2
    assert seen[0].time_left_s == 3600.0 - 600.0


def test_no_probe_when_a_boot_spans_more_steps_than_a_probe_measures():
    """With one size in the window, `cost` probes a neighbour every `probe_every` steps, unless a
    worker's boot (the goal's switch_s) takes longer than the probe's steps: then a probe down costs
    the boot again on the way back, and a probe up pays workers before it measures a step."""

    def sizes(switch_s: float, slow_every: int = 0) -> list[int]:
        policy, n, out = FleetPolicy(reserved_workers=1.0), 4, []
        goal = FleetGoal("cost", 8, switch_s=switch_s)
        for i in range(60):
            s = dataclasses.replace(world(4), n_remote=n)  # every size measures alike: no spread to fit
            if slow_every and i % slow_every == 0:
                s = dataclasses.replace(s, step_s=3 * s.step_s, gen_s=3 * s.gen_s)
            n = policy.decide(s, goal, trainer_per_h=10.0, worker_per_h=1.0, current=n).workers
            out.append(n)
        return out

    step = world(4).step_s
    assert set(sizes(switch_s=step)) != {4}  # a boot of one step: it probes
    assert set(sizes(switch_s=FleetPolicy(1.0).probe_steps * step * 1.5)) == {4}  # longer than a probe: held
    # in steps as the window measures them: one slow step does not make the boot look short
    assert set(sizes(switch_s=FleetPolicy(1.0).probe_steps * step * 1.5, slow_every=5)) == {4}
    # steps on the trainer's floor say fewer workers would do: down at once after a short boot, and
    # not across a long one (a loaded machine puts a small fleet's step there too)
    floor = StepSample(n_remote=8, step_s=120.0, gen_s=60.0, train_s=120.0, tokens=1_000_000)

    def on_floor(switch_s: float) -> list[int]:
        policy, goal = FleetPolicy(reserved_workers=1.0), FleetGoal("cost", 8, switch_s=switch_s)
        return [policy.decide(floor, goal, trainer_per_h=10.0, worker_per_h=1.0, current=8).workers for _ in range(4)]

    assert min(on_floor(120.0)) < 8
    assert on_floor(100 * 120.0) == [8] * 4


def test_shared_cores_bound_the_fleet():
    """On a machine the trainer and the workers share, the fleet holds at most the cores the trainer
    leaves free; min_workers, asked outright, still wins; clouds and synthetic engines are unbounded."""
    from rlboost.contracts.spec import load_spec, parse_spec
    from rlboost.rollout.scheduling import most_workers, shared_cores
    from tests.conftest import ROOT
    from tests.test_simulator import job

    def spec(**rollout):
        return parse_spec(job(rollout=rollout))

    assert most_workers(spec(max_workers=4), None) == 4
    assert most_workers(spec(max_workers=4), 2.0) == 1
    assert most_workers(spec(max_workers=4), 1.5) == 1  # a worker still has the trainer's idle time
    assert most_workers(spec(max_workers=4), 3.0) == 2
    assert most_workers(spec(max_workers=2), 16.0) == 2
    assert most_workers(spec(max_workers=4, min_workers=3), 2.0) == 3
    assert shared_cores(spec()) is None  # synthetic engines only follow the perf table
    tiny = load_spec(ROOT / "examples" / "local.yaml")  # tiny-gpt: its engines compute on this machine
    assert shared_cores(tiny) is not None and shared_cores(tiny) >= 1


def test_the_fleet_goal_is_on_the_jobs_own_clock():
    """A local job bills on its trace clock (time_scale x wall); its steps are measured in wall seconds,
    so the goal's deadline and boot reach the policy in those."""
    from rlboost.contracts.spec import parse_spec
    from rlboost.rollout.scheduling import FleetClock, fleet_goal, placement_tracker
    from tests.test_simulator import job

    spec = parse_spec(job(deadline_hours=2.0, local={"time_scale": 360.0}))
    goal = fleet_goal(spec, "cost", FleetClock(5, 3600.0, 1.0), boot_s=720.0, max_workers=4)
    assert (goal.time_left_s, goal.switch_s, goal.steps_left) == (10.0, 2.0, 15)
    real_time = fleet_goal(parse_spec(job()), "cost", FleetClock(5, 600.0, 1.0), boot_s=120.0, max_workers=4)
    assert (real_time.time_left_s, real_time.switch_s, real_time.steps_left) == (None, 120.0, 15)
    # placement's boot prior (before a boot is seen) is the provider's, on its billing clock: a local
    # process's 2 s is 720 trace seconds at 360x, not a cloud VM's 120
    assert placement_tracker(spec, []).boot_estimate_s() == 2.0 * 360.0


def test_one_step_at_a_size_does_not_move_the_fit():
    """Where a boot spans more steps than a probe (no probes), `cost` moves only to a size measured
    `probe_steps` times: one step without the worker (the market took it for a step) among many noisy
    ones with it must not release the worker for good (a clean-clone README run did, BENCHMARKS.md).
    Steps enough at the new size, and it moves."""
    probe = FleetPolicy(1.0).probe_steps

    def decisions(without: int) -> list[int]:
        # one worker halves generation; steps vary +-35 % around that (a busy 2-core machine)
        policy, goal, out = FleetPolicy(reserved_workers=1.0), FleetGoal("cost", 1, switch_s=1e6), []
        noise = [1.0, 1.35, 0.7, 1.2, 0.8, 1.3, 0.65, 1.1, 0.9, 1.25, 0.75, 1.05] * 3
        mean = sum(noise) / len(noise)
        for i, k in enumerate(noise):
            s = StepSample(n_remote=1, step_s=10.0 * k, gen_s=9.0 * k, train_s=1.0, tokens=1000)
            out.append(policy.decide(s, goal, trainer_per_h=1.0, worker_per_h=1.0, current=1).workers)
            if i == 20:  # then `without` steps at 0 workers as fast as the noisy mean with one
                for _ in range(without):
                    s0 = StepSample(n_remote=0, step_s=10.0 * mean, gen_s=9.0 * mean, train_s=1.0, tokens=1000)
                    out.append(policy.decide(s0, goal, trainer_per_h=1.0, worker_per_h=1.0, current=1).workers)
        return out

    assert set(decisions(without=1)) == {1}  # one step: not evidence enough, the worker stays
    assert decisions(without=probe)[-1] == 0  # a worker that measurably adds nothing is released
