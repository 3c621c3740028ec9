"""`GET /metrics` on the trainer: Prometheus text from the status dict, behind the job token."""

from __future__ import annotations

import asyncio
import re

import httpx
from aiohttp import web

from rlboost.trainer.prometheus import exposition
from rlboost.trainer.server import build_app
from rlboost.weights.publisher import WeightPublisher
from tests.route_coordinator import idle_coordinator

STATUS = {
    "step": 3, "steps": 40, "version": 3, "reward": 0.25, "tokens_total": 1200, "responses_total": 96,
    "migrated": 2, "offloads": 1, "rejected_frames": 0,
    "weights": {"egress_bytes": 4096, "egress_delta_bytes": 1024, "last_copy_s": 0.01},
    "workers": [
        {"worker_id": "job-1-trainer-engine", "kind": "reserved", "state": "ready", "tokens_per_s": 50.0},
        {"worker_id": 'w"1\n', "kind": "spot", "state": "ready", "tokens_per_s": 120.5},
        {"worker_id": "w2", "kind": "spot", "state": "gone", "tokens_per_s": 0.0},
    ],
}
LINE = re.compile(r'^[a-z_][a-z0-9_]*(\{([a-z_]+="([^"\\\n]|\\.)*",?)+\})? -?[0-9.e+]+$')


def test_every_sample_line_parses_and_labels_are_escaped():
    text = exposition(STATUS)
    samples = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert samples and all(LINE.match(ln) for ln in samples), [ln for ln in samples if not LINE.match(ln)]
    assert "rlboost_step 3.0" in samples and "rlboost_reward 0.25" in samples
    assert "rlboost_tokens_total 1200.0" in samples and "# TYPE rlboost_tokens_total counter" in text
    assert 'rlboost_engines{kind="spot",state="gone"} 1.0' in samples
    assert 'rlboost_engine_tokens_per_second{engine="w\\"1\\n",kind="spot"} 120.5' in samples
    assert not any("w2" in ln for ln in samples if ln.startswith("rlboost_engine_tokens"))  # gone: no rate
    assert "rlboost_reward" not in exposition({**STATUS, "reward": None})  # no value, no sample
    assert "rlboost_eval" not in text and "rlboost_reward_errors" not in text  # none yet


def test_last_evaluation_and_custom_reward_failures():
    ev = {"version": 4, "pass@1": 0.75, "mean_reward": 0.8, "problems": 8}
    text = exposition({**STATUS, "eval": ev, "reward_errors": {"ValueError": 3, "non-finite": 1}})
    samples = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert all(LINE.match(ln) for ln in samples)
    assert {"rlboost_eval_version 4.0", "rlboost_eval_pass_at_1 0.75", "rlboost_eval_mean_reward 0.8"} <= set(samples)
    assert 'rlboost_reward_errors_total{kind="ValueError"} 3.0' in samples
    assert 'rlboost_reward_errors_total{kind="non-finite"} 1.0' in samples


def test_metrics_route_needs_the_job_token():
    async def scenario() -> tuple[int, int, str, str]:
        coord = idle_coordinator()
        runner = web.AppRunner(build_app("tok", coord, WeightPublisher(), lambda *_: STATUS))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
        try:
            async with httpx.AsyncClient() as c:
                bad = await c.get(url)
                good = await c.get(url, headers={"Authorization": "Bearer tok"})
            return bad.status_code, good.status_code, good.headers["content-type"], good.text
        finally:
            await runner.cleanup()

    bad, good, ctype, text = asyncio.run(scenario())
    assert (bad, good) == (401, 200)
    assert ctype.startswith("text/plain; version=0.0.4")
    assert text == exposition(STATUS)
