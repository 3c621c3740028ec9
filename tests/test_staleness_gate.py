"""The live trainer's staleness gate (rlboost/trainer/runtime.py, _may_begin): without a remote engine, a
step whose update is being staged still holds the trainer's accelerators, so the next step waits for
that version even under max_staleness 1, as the simulator pops the step and publishes in one go. The
generating side polls; the stage is held open here, so the poll meets the in-between state every time."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace

import torch

from rlboost.contracts.spec import AlgorithmSpec, JobSpec, TaskSpec


def test_without_a_remote_engine_the_next_step_waits_for_the_version_being_staged(tmp_path: Path) -> None:
    from rlboost.trainer.runtime import TrainerRuntime

    torch.set_num_threads(1)
    spec = JobSpec(
        name="gate",
        algorithm=AlgorithmSpec(max_new_tokens=8, steps=4, warm_start_steps=0, max_staleness=1),
        task=TaskSpec(name="reverse", min_len=3, max_len=4),
        rollout={"max_workers": 0},
    )
    rt = TrainerRuntime(spec, "token", tmp_path)
    # the trainer's own engine only; no announcement while a step generates (rt.generating)
    rt.coord = SimpleNamespace(pool=SimpleNamespace(n_remote=lambda: 0), cfg=SimpleNamespace(swap_in_flight=False))
    staging, release = threading.Event(), threading.Event()
    stage = rt.publisher.stage

    def held_stage(version: int, tensors: dict) -> None:
        staging.set()
        release.wait(10)
        stage(version, tensors)

    rt.publisher.stage = held_stage  # type: ignore[method-assign]

    async def scenario() -> tuple[bool, int]:
        rt.staged, rt.untrained, rt.generating = 1, 1, 1  # step 1 generated on version 1 and trains
        publishing = asyncio.create_task(rt.publish(2, trained=True))  # step 1's update
        begins = asyncio.create_task(rt._may_begin(2))
        await asyncio.to_thread(staging.wait, 10)
        await asyncio.sleep(0.5)  # five of the gate's polls, all while version 2 is staged
        early = begins.done()
        release.set()
        await publishing
        await asyncio.wait_for(begins, 5)
        return early, rt.staged

    early, staged = asyncio.run(scenario())
    assert not early, "step 2 began on version 1 while step 1's update was being staged"
    assert staged == 2 and rt.untrained == 0
