"""`simulate --sweep --sweep-trainer`'s answer: the cheapest trainer + fleet that meets the job's objective
(and its `deadline_hours`, if any)."""

from __future__ import annotations

from dataclasses import dataclass

from rlboost.cli.sim_report import SLOWER, Choice, hours_to_steps


@dataclass(frozen=True)
class TrainerPick:
    """`best`: the most tokens/$ among the settings that meet: under `objective: throughput` those within
    SLOWER of the fastest setting's tokens/s; under `objective: cost` every setting (tokens/$ is the
    objective). With a deadline, only the settings that finish the job's steps in time compete; when
    none does, `best` is None and `fastest` says how near the fastest came."""

    objective: str
    deadline_h: float | None
    best: Choice | None
    fastest: Choice  # the most tokens/s of all settings
    met: int  # settings that meet the objective (and the deadline)
    of: int  # settings replayed
    hours: dict[str, float | None]  # label -> hours to the job's steps (None: not finished)

    def meets(self) -> str:
        near = f"within {1 - SLOWER:.0%} of the fastest setting's speed"
        what = near if self.objective == "throughput" else "replayed"
        if self.deadline_h is not None:
            what = f"{'' if self.objective == 'cost' else what + ' and '}done within {self.deadline_h:g} h"
        return what

    def lines(self) -> list[str]:
        head = f"Trainer + fleet (objective {self.objective}"
        head += f", deadline {self.deadline_h:g} h):" if self.deadline_h is not None else "):"
        if self.best is None:
            h = self.hours.get(self.fastest.label)
            done = f"needs {h:.2f} h" if h is not None else "does not finish the job's steps in the replay"
            return [f"{head} none of {self.of} settings meets it; the fastest, {self.fastest.label}, {done}."]
        r = self.best.result
        return [
            f"{head} {self.best.label}: the most tokens/$ ({r.tokens_per_dollar:,.0f}, ${r.dollars:,.2f}) of the "
            f"{self.met} of {self.of} settings {self.meets()}."
        ]

    def as_json(self) -> dict:
        r = None if self.best is None else self.best.result
        return {
            "objective": self.objective,
            "deadline_hours": self.deadline_h,
            "setting": None if self.best is None else self.best.label,
            "tokens_per_dollar": None if r is None else round(float(r.tokens_per_dollar), 2),
            "dollars": None if r is None else round(float(r.dollars), 4),
            "settings_meeting": self.met,
            "settings": self.of,
            "text": " ".join(self.lines()),
        }


def pick_trainer(
    choices: list[Choice], objective: str, *, deadline_h: float | None = None, steps: int | None = None
) -> TrainerPick | None:
    """None: no setting trained a step. `steps`: the job's, for the deadline."""
    ran = [c for c in choices if c.result.steps > 0]
    if not ran:
        return None
    done = {c.label: hours_to_steps(c.result, steps) for c in ran}
    fastest = max(ran, key=lambda c: c.result.tokens_per_s)
    ok = ran
    if deadline_h is not None:
        ok = [c for c in ok if (h := done[c.label]) is not None and h <= deadline_h]
    if objective == "throughput" and ok:
        top = max(c.result.tokens_per_s for c in ok)
        ok = [c for c in ok if c.result.tokens_per_s >= SLOWER * top]
    best = max(ok, key=lambda c: c.result.tokens_per_dollar) if ok else None
    return TrainerPick(objective, deadline_h, best, fastest, len(ok), len(ran), done)
