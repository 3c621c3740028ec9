"""`GET /v1/status?since=N&evals_since=M`: the controller polls the trainer 4 times a second, and a job's
step records grow by one a step, so it asks only for what it has not recorded yet."""

from __future__ import annotations

import asyncio

import httpx
from aiohttp import web

from rlboost.contracts.spec import parse_spec
from rlboost.contracts.status import TrainerStatus
from rlboost.contracts.step_record import StepRecord
from rlboost.trainer.runtime import TrainerRuntime
from rlboost.trainer.server import build_app
from rlboost.weights.publisher import WeightPublisher
from tests.route_coordinator import idle_coordinator

TOKEN = "tok"


def step_record(step: int, **changes) -> StepRecord:
    figures = dict(version=step, reward=0.0, loss=0.0, responses=4, tokens=40, len_max=12, engines=1, migrated=0)
    timing = dict(reward_errors=0, step_s=1.0, gen_s=0.5, train_s=0.5, tail_train_s=0.0)
    return StepRecord(step=step, **{**figures, **timing, **changes})


def runtime(tmp_path, steps: int, evals: int) -> TrainerRuntime:
    raw = {"name": "since", "model": {"kind": "synthetic"}, "rollout": {"engine": "synthetic", "max_workers": 0}}
    rt = TrainerRuntime(parse_spec(raw), TOKEN, tmp_path)
    rt.history = [step_record(i, reward=i / 10) for i in range(steps)]
    rt.evals = [{"version": v, "step": v} for v in range(evals)]
    return rt


def test_the_document_holds_only_the_records_after_since(tmp_path):
    rt = runtime(tmp_path, steps=5, evals=2)
    whole = rt.status()
    assert [h["step"] for h in whole["history"]] == [0, 1, 2, 3, 4] and whole["history_from"] == 0
    part = rt.status(3, 1)
    assert [h["step"] for h in part["history"]] == [3, 4] and part["history_from"] == 3
    assert [e["version"] for e in part["evals"]] == [1] and part["evals_from"] == 1
    assert part["eval"] == {"version": 1, "step": 1}  # the last evaluation, whatever the caller has
    ahead = rt.status(9, 9)  # a caller ahead of a trainer restarted from an older checkpoint
    assert ahead["history"] == [] and ahead["history_from"] == 5 and ahead["evals_from"] == 2
    for doc in (whole, part, ahead):
        TrainerStatus.model_validate(doc)


def test_the_route_takes_counts_and_refuses_anything_else(tmp_path):
    rt = runtime(tmp_path, steps=4, evals=0)

    async def scenario() -> dict[str, tuple[int, dict]]:
        coord = idle_coordinator()
        runner = web.AppRunner(build_app(TOKEN, coord, WeightPublisher(), rt.status))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/status"
        out = {}
        try:
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as c:
                for q in ("", "?since=2", "?since=2&evals_since=0", "?since=-1", "?since=x", "?since=%C2%B2",
                          "?evals_since=1.5", "?since=" + "9" * 40):
                    r = await c.get(url + q)
                    out[q] = (r.status_code, r.json())
        finally:
            await runner.cleanup()
        return out

    got = asyncio.run(scenario())
    assert [h["step"] for h in got[""][1]["history"]] == [0, 1, 2, 3]
    assert [h["step"] for h in got["?since=2"][1]["history"]] == [2, 3] == [
        h["step"] for h in got["?since=2&evals_since=0"][1]["history"]
    ]
    for q in ("?since=-1", "?since=x", "?since=%C2%B2", "?evals_since=1.5", "?since=" + "9" * 40):
        status, body = got[q]
        assert status == 400 and "a count of records" in body["error"], (q, body)
