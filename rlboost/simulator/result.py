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
    # the trainer's seconds training (its finished steps) and billed (from serving to teardown, as
    # trainer_dollars), both in sim seconds; kept apart from step_log, which a sweep drops
    trainer_train_s: float = 0.0
    trainer_billed_s: float = 0.0

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
    def trainer_busy_share(self) -> float:
        """The share of its billed seconds the trainer spent training: 1.0 is the physical limit (it
        never waits for rollouts, boots or warms up on the bill)."""
        return self.trainer_train_s / self.trainer_billed_s if self.trainer_billed_s > 0 else 0.0

    @property
    def speculation(self) -> dict[str, float] | None:
        """Speculative decoding over the replay's steps (None: it did not speculate): tokens per response
        per verification pass (1.0 = plain decoding), the share of drafted tokens accepted, and the
        counts (response-passes, drafted, accepted)."""
        per_step = [x["speculation"] for x in self.step_log if "speculation" in x]
        if not per_step:
            return None
        passes, drafted, accepted = (sum(x[k] for x in per_step) for k in ("passes", "drafted", "accepted"))
        return {
            "tokens_per_pass": (passes + accepted) / passes if passes > 0 else 1.0,
            "acceptance": accepted / drafted if drafted > 0 else 0.0,
            "drafted_per_pass": drafted / passes if passes > 0 else 0.0,
            "passes": passes,
            "drafted": drafted,
            "accepted": accepted,
        }

    @property
    def mean_spot_workers(self) -> float:
        """Spot workers held (booting or serving), averaged over the job's time."""
        if not self.timeline or self.job_s <= 0:
            return 0.0
        area = 0.0
        for (t0, n, _), (t1, _, _) in zip(self.timeline, [*self.timeline[1:], (self.job_s, 0, 0)]):
            area += n * (min(t1, self.job_s) - t0)
        return area / self.job_s
