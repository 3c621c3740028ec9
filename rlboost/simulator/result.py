"""What one replay gives: steps, tokens, dollars, and the timeline the report plots."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.simulator.presets import SimPolicy


@dataclass
class SimResult:
    policy: SimPolicy
    steps: int
    run_s: float  # first step start -> last step end (sim seconds)
    job_s: float  # launch -> teardown
    trained_tokens: int
    dollars: float
    spot_dollars: float
    trainer_dollars: float
    preemptions: int
    migrations: int  # partial responses continued elsewhere (preemption, offload, tail)
    restarted_tokens: int  # tokens thrown away (restart policy, tail batching)
    time_scale: float
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (t, spot workers held, tokens)
    step_log: list[dict] = field(default_factory=list)

    @property
    def steps_per_hour(self) -> float:
        return self.steps / self.run_s * 3600 if self.run_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.trained_tokens / self.run_s if self.run_s > 0 else 0.0

    @property
    def tokens_per_dollar(self) -> float:
        return self.trained_tokens / self.dollars if self.dollars > 0 else 0.0

    @property
    def mean_spot_workers(self) -> float:
        """Spot workers held (booting or serving), averaged over the job's time."""
        if not self.timeline or self.job_s <= 0:
            return 0.0
        area = 0.0
        for (t0, n, _), (t1, _, _) in zip(self.timeline, [*self.timeline[1:], (self.job_s, 0, 0)]):
            area += n * (min(t1, self.job_s) - t0)
        return area / self.job_s
