"""Tables and plots of simulation results."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.table import Table

from rlboost.cli.tables import add_columns, narrow_table
from rlboost.simulator.result import SimResult


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


def results_table(results: list[SimResult], title: str) -> Table:
    base = next((r for r in results if r.policy.name == "on-demand"), None)
    t = narrow_table(title)
    cols: tuple[str, ...] = ("steps/h", "trained tok/s", "$", "tokens/$", "thr vs OD", "tok/$ vs OD", "preempt")
    cols = (*cols, "migrated", "busy")  # busy: the trainer's share of its billed time spent training
    # speculative decoding's columns only where a replay speculated (rollout.speculative.method)
    spec = any(r.speculation is not None for r in results)
    if spec:
        cols = (*cols, "tok/pass", "accepted")
    add_columns(t, "policy", *cols, numbers=cols)
    for r in results:
        row = [
            r.policy.name,
            f"{r.steps_per_hour:.1f}",
            f"{r.tokens_per_s:,.0f}",
            f"{r.dollars:,.2f}",
            f"{r.tokens_per_dollar:,.0f}",
            ratio(r.tokens_per_s, base.tokens_per_s) if base else "-",
            ratio(r.tokens_per_dollar, base.tokens_per_dollar) if base else "-",
            str(r.preemptions),
            str(r.migrations),
            f"{r.trainer_busy_share:.0%}",
        ]
        if spec:
            sp = r.speculation
            row += [f"{sp['tokens_per_pass']:.2f}", f"{sp['acceptance']:.0%}"] if sp else ["1.00", "-"]
        t.add_row(*row)
    t.caption = "; ".join(f"{r.policy.name}: {r.policy.label}" for r in results)
    t.caption += "; busy: the trainer's billed seconds spent training (100%: never waiting)"
    return t


@dataclass(frozen=True)
class Choice:
    """A setting the recommendation can name: a policy row, or a sweep point."""

    label: str
    result: SimResult


SLOWER = 0.99  # a spot setting under this share of on-demand's speed is slower, not "no faster"


def hours_to_steps(r: SimResult, steps: int | None) -> float | None:
    """The replay's hours to `steps` steps (None: it did not train them); `steps` None: the replay's hours."""
    return r.job_s * r.time_scale / 3600 if steps is None or r.steps >= steps else None


@dataclass(frozen=True)
class Recommendation:
    cheapest: Choice | None  # most tokens/$ (None: on-demand alone beats every spot setting)
    fastest: Choice | None  # most tokens/s (None: on-demand alone is faster than every spot setting)
    best_spot: Choice  # the spot setting with the most tokens/$, even when on-demand beats it
    fastest_spot: Choice  # the spot setting with the most tokens/s, even when on-demand beats it
    base: SimResult
    spot_price_now: float  # cheapest spot offer's $/h

    def vs(self, r: SimResult) -> tuple[float, float]:
        """(speed, tokens/$), each against on-demand."""
        return r.tokens_per_s / self.base.tokens_per_s, r.tokens_per_dollar / self.base.tokens_per_dollar

    def breakeven_fraction(self) -> float | None:
        """The share of today's spot prices at which best_spot's tokens/$ would equal on-demand's."""
        r = self.best_spot.result
        if r.spot_dollars <= 0:
            return None
        spot_be = r.trained_tokens / self.base.tokens_per_dollar - r.trainer_dollars
        return max(0.0, spot_be / r.spot_dollars)

    def lines(self) -> list[str]:
        def said(c: Choice) -> str:
            sp, td = self.vs(c.result)
            return f"{c.label}: {td:.2f}x on-demand's tokens/$ at {sp:.2f}x its speed"

        def speed(c: Choice) -> str:
            sp, td = self.vs(c.result)
            return f"{c.label}: {sp:.2f}x on-demand's speed at {td:.2f}x its tokens/$"

        out = []
        if self.cheapest is not None:
            out.append(f"Cheapest per token: {said(self.cheapest)}.")
        else:
            out.append(f"Cheapest per token: on-demand alone (no spot). The best spot setting, {said(self.best_spot)}.")
        if self.fastest is not None:
            out.append(f"Fastest: {speed(self.fastest)}.")
        else:
            quickest = speed(self.fastest_spot)
            out.append(f"Fastest: on-demand alone (no spot). The fastest spot setting, {quickest}.")
        if self.cheapest is None:
            out.append(self.why_spot_costs_more())
        return out

    def why_spot_costs_more(self) -> str:
        r, b = self.best_spot.result, self.base
        sp, _ = self.vs(r)
        rate = (r.dollars / r.job_s) / (b.dollars / b.job_s) if r.job_s > 0 and b.job_s > 0 else float("nan")
        share = f"({r.spot_dollars / r.dollars:.0%} of the bill is spot)"
        if sp < SLOWER:
            # slower than the trainer alone: "the trainer is the bottleneck" would not explain that
            msg = f"Why: with spot workers it trains {1 - sp:.0%} fewer tokens/s at {rate - 1:+.0%} dollars per hour"
            msg += f" {share}"
        else:
            msg = f"Why: spot workers add {sp - 1:+.0%} tokens/s but {rate - 1:+.0%} dollars per hour {share}"
        if SLOWER <= sp < 1.15:
            msg += (
                "; the trainer is the bottleneck, so more rollout capacity barely shortens a step"
                " (spot helps once generation is: more trainer GPUs, longer responses)"
            )
        be = self.breakeven_fraction()
        if be is not None and be > 0:
            msg += (
                f". Spot pays once it costs under {be:.0%} of today's price (about ${self.spot_price_now * be:.2f}/h"
                f" a worker, now ${self.spot_price_now:.2f}); until then keep max_workers: 0 on this trace and"
                " these prices."
            )
        else:
            msg += ". No spot price pays here: keep max_workers: 0 on this trace and these prices."
        return msg

    def as_json(self) -> dict:
        def one(c: Choice | None) -> dict | None:
            if c is None:
                return None
            sp, td = self.vs(c.result)
            return {
                "setting": c.label,
                "throughput_vs_on_demand": round(sp, 4),
                "tokens_per_dollar_vs_on_demand": round(td, 4),
            }

        be = self.breakeven_fraction()
        return {
            "cheapest": one(self.cheapest),
            "fastest": one(self.fastest),
            "best_spot": one(self.best_spot),
            "fastest_spot": one(self.fastest_spot),
            "spot_breakeven_price_fraction": round(be, 4) if be is not None else None,
            "text": " ".join(self.lines()),
        }


def recommend(base: SimResult, choices: list[Choice], spot_price_now: float) -> Recommendation | None:
    """The setting with the most tokens/$ and the fastest one, against on-demand (None: nothing to compare)."""
    spot = [c for c in choices if c.result.policy.spot and c.result.steps > 0]
    if not spot or base.tokens_per_s <= 0 or base.tokens_per_dollar <= 0:
        return None
    best = max(spot, key=lambda c: c.result.tokens_per_dollar)

    def pace(r: SimResult) -> tuple[float, float]:  # a tie in speed (to 0.1 %) goes to the cheaper setting
        return round(r.tokens_per_s / base.tokens_per_s, 3), r.tokens_per_dollar

    quickest = max(spot, key=lambda c: pace(c.result))
    cheapest = best if best.result.tokens_per_dollar >= base.tokens_per_dollar else None
    # on-demand races too: a spot setting no faster than it (or as fast and dearer) is not the fastest
    fastest = quickest if pace(quickest.result) > pace(base) else None
    return Recommendation(cheapest, fastest, best, quickest, base, spot_price_now)


def plot_path_error(path: Path) -> str | None:
    """What stops `--plot` writing `path`, checked before anything replays (None: nothing)."""
    where = path.parent
    if path.is_dir():
        return f"--plot {path}: is a directory; give a file in it, e.g. --plot {path / 'simulate.png'}"
    if not where.is_dir():
        return f"--plot {path}: no directory {where}; create it first, or give a path in an existing directory"
    if not os.access(where, os.W_OK | os.X_OK):
        return f"--plot {path}: cannot write in {where}; give a path in a directory you can write"
    if path.exists() and not os.access(path, os.W_OK):
        return f"--plot {path}: cannot overwrite it; give another path"
    return None


def sweep_table(base: SimResult, points: list, title: str, job_trainer: str | None = None) -> Table:
    """One row per max_workers x objective (simulator.cli.SweepPoint), ratios against on-demand; with
    `job_trainer` (--sweep-trainer: the job's own trainer, the baseline's) a trainer column first."""
    t = narrow_table(title)
    cols = ("max_workers", "objective", "held", "steps/h", "trained tok/s", "$", "tokens/$", "thr vs OD", "tok/$ vs OD")
    cols = (*cols, "busy")
    shape = ("trainer",) if job_trainer is not None else ()
    add_columns(t, *shape, *cols, numbers=tuple(c for c in cols if c != "objective"))
    t.add_row(
        *((job_trainer,) if job_trainer is not None else ()),
        "0",
        "on-demand",
        "0.0",
        f"{base.steps_per_hour:.1f}",
        f"{base.tokens_per_s:,.0f}",
        f"{base.dollars:,.2f}",
        f"{base.tokens_per_dollar:,.0f}",
        "1.00x",
        "1.00x",
        f"{base.trainer_busy_share:.0%}",
    )
    for p in points:
        r = p.result
        t.add_row(
            *((p.trainer or job_trainer,) if job_trainer is not None else ()),
            str(p.max_workers),
            p.objective,
            f"{p.mean_workers:.1f}",
            f"{r.steps_per_hour:.1f}",
            f"{r.tokens_per_s:,.0f}",
            f"{r.dollars:,.2f}",
            f"{r.tokens_per_dollar:,.0f}",
            ratio(r.tokens_per_s, base.tokens_per_s),
            ratio(r.tokens_per_dollar, base.tokens_per_dollar),
            f"{r.trainer_busy_share:.0%}",
        )
    t.caption = "held: spot workers held on average (the objective may hold fewer than max_workers)"
    t.caption += "; busy: the trainer's billed seconds spent training"
    return t


def sweep_json(base: SimResult, points: list, job_trainer: str | None = None) -> list[dict]:
    """With `job_trainer` (--sweep-trainer), each row's `trainer`: its accelerators."""
    rows = results_json([base])
    if job_trainer is not None:
        rows[0]["trainer"] = job_trainer
    for p in points:
        row = results_json([base, p.result])[1]
        row.update(max_workers=p.max_workers, objective=p.objective, mean_spot_workers=round(p.mean_workers, 3))
        if job_trainer is not None:
            row["trainer"] = p.trainer or job_trainer
        rows.append(row)
    return rows


def plot_sweep(base: SimResult, points: list, path: Path, title: str) -> None:
    """`simulate --sweep --plot`: sweep_figure, written as a PNG."""
    _save(sweep_figure(base, points, title), path)


def sweep_figure(base: SimResult, points: list, title: str):
    """Speed and tokens/$ against on-demand, and $ per 1M trained tokens, by max_workers, one line per
    objective; every y axis from 0 (a ratio of 0.9 drawn from 0.88 looks like a collapse)."""
    plt = _pyplot()
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    # one line per objective (and trainer shape, --sweep-trainer); a shape alone is no line
    points = [p for p in points if p.objective != "on-demand"]
    for shape, obj in dict.fromkeys((p.trainer, p.objective) for p in points):
        pts = [p for p in points if (p.trainer, p.objective) == (shape, obj)]
        xs = [p.max_workers for p in pts]
        name = f"objective {obj}" if shape is None else f"trainer {shape}, objective {obj}"
        ax1.plot(xs, [p.result.tokens_per_s / base.tokens_per_s for p in pts], marker="o", label=name)
        ax2.plot(xs, [p.result.tokens_per_dollar / base.tokens_per_dollar for p in pts], marker="o", label=name)
        ax3.plot(xs, [per_million(p.result) for p in pts], marker="o", label=name)
    for ax, what, on_demand in (
        (ax1, "speed vs on-demand", 1.0),
        (ax2, "tokens/$ vs on-demand", 1.0),
        (ax3, "$ per 1M tokens", per_million(base)),
    ):
        ax.axhline(on_demand, color="grey", lw=0.8, ls="--", label="on-demand")
        ax.set_ylabel(what)
        ax.legend(fontsize=8)
        ax.set_ylim(bottom=0)
    ax3.set_xlabel("max_workers")
    ax3.set_xticks(sorted({p.max_workers for p in points}))
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def per_million(r: SimResult) -> float:
    """Dollars per million trained tokens (0 where it trained none)."""
    return float(r.dollars) / r.trained_tokens * 1e6 if r.trained_tokens else 0.0


def _pyplot():
    """matplotlib's pyplot on the Agg backend: files only, never a window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    plt = _pyplot()
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def staleness_lines(k: int, stale: list[SimResult], on_policy: list[SimResult]) -> list[str]:
    """What algorithm.max_staleness k buys each policy over the same replay strictly on-policy."""
    by_name = {r.policy.name: r for r in on_policy}
    parts = []
    for r in stale:
        r0 = by_name.get(r.policy.name)
        if r0 is None or not r0.tokens_per_s or not r0.tokens_per_dollar:
            continue
        parts.append(
            f"{r.policy.name} {r.tokens_per_s / r0.tokens_per_s:.2f}x throughput, "
            f"{r.tokens_per_dollar / r0.tokens_per_dollar:.2f}x tokens/$, busy "
            f"{r0.trainer_busy_share:.0%} -> {r.trainer_busy_share:.0%}"
        )
    return [f"max_staleness {k} against strictly on-policy (k=0) on the same trace: " + "; ".join(parts) + "."]


def results_json(results: list[SimResult]) -> list[dict]:
    base = next((r for r in results if r.policy.name == "on-demand"), None)
    out = []
    for r in results:
        out.append(
            {
                "policy": r.policy.name,
                "steps": r.steps,
                "run_s": round(r.run_s, 3),
                "steps_per_hour": round(r.steps_per_hour, 3),
                "trained_tokens": r.trained_tokens,
                "tokens_per_s": round(r.tokens_per_s, 2),
                # money as floats always (a policy without spot adds up an int 0)
                "dollars": round(float(r.dollars), 4),
                "spot_dollars": round(float(r.spot_dollars), 4),
                "trainer_dollars": round(float(r.trainer_dollars), 4),
                "tokens_per_dollar": round(float(r.tokens_per_dollar), 2),
                "throughput_vs_on_demand": round(r.tokens_per_s / base.tokens_per_s, 4)
                if base and base.tokens_per_s
                else None,
                "tokens_per_dollar_vs_on_demand": (
                    round(r.tokens_per_dollar / base.tokens_per_dollar, 4) if base and base.tokens_per_dollar else None
                ),
                "preemptions": r.preemptions,
                "migrations": r.migrations,
                "discarded_tokens": r.restarted_tokens,
                "trainer_busy_share": round(r.trainer_busy_share, 4),
                "time_scale": r.time_scale,
            }
        )
        sp = r.speculation
        if sp is not None:  # only where the replay speculated: other outputs stay as they were
            out[-1]["speculation"] = {
                "tokens_per_pass": round(sp["tokens_per_pass"], 4),
                "acceptance": round(sp["acceptance"], 4),
                "drafted_per_pass": round(sp["drafted_per_pass"], 4),
            }
    return out


PLOT_POINTS = 200  # samples of the throughput line
PLOT_WINDOWS = 40  # the window is at least this fraction of the replay, and at least two steps' time


def windowed_rate(r: SimResult) -> tuple[list[float], list[float]]:
    """Trained tokens/s (the job's seconds) over a sliding window of trace time, sampled evenly: (trace
    hours, rate). The timeline records every change of the fleet as well as each step's tokens, often a
    moment apart: a window counted in records, not time, divided a step's tokens by that moment. Tokens
    are counted as trained evenly over the time from one step's end to the next (linear between them),
    so that a window does not swing with how many step ends it happens to hold."""
    ts = [t * r.time_scale / 3600 for t, _, _ in r.timeline]
    tok = [k for _, _, k in r.timeline]
    if not ts:
        return [], []
    keep = [0, *(i for i in range(1, len(ts)) if tok[i] != tok[i - 1])]  # the start, then each step's end
    xp, fp = [ts[i] for i in keep], [float(tok[i]) for i in keep]
    span = xp[-1] - xp[0]
    if span <= 0:
        return [], []
    window = min(span, max(span / PLOT_WINDOWS, 2 * span / max(1, len(keep) - 1)))
    xs = [xp[0] + window + (span - window) * i / (PLOT_POINTS - 1) for i in range(PLOT_POINTS)]
    done = np.interp(xs, xp, fp) - np.interp([x - window for x in xs], xp, fp)
    return xs, (done / (window * 3600 / r.time_scale)).tolist()


def plot(results: list[SimResult], path: Path, title: str) -> None:
    """`simulate --plot`: figure, written as a PNG."""
    _save(figure(results, title), path)


def figure(results: list[SimResult], title: str):
    """Throughput (trained tokens/s over a sliding window) and live spot workers over time, and each
    policy's dollars (trainer and spot, labelled with $ per 1M trained tokens); every y axis from 0."""
    plt = _pyplot()
    fig = plt.figure(figsize=(10, 9))
    grid = fig.add_gridspec(3, 1, height_ratios=(3, 2, 2))
    ax1 = fig.add_subplot(grid[0])
    ax2 = fig.add_subplot(grid[1], sharex=ax1)
    ax3 = fig.add_subplot(grid[2])
    styles = ("-", "--", "-.", ":")  # policies often hold the same fleet: a line over another stays seen
    for n, r in enumerate(results):
        if not r.timeline:
            continue
        ts = [t * r.time_scale / 3600 for t, _, _ in r.timeline]  # trace hours, as the title counts
        ls = styles[n % len(styles)]
        ax1.plot(*windowed_rate(r), label=r.policy.name, lw=1, ls=ls)
        ax2.step(ts, [w for _, w, _ in r.timeline], where="post", label=r.policy.name, lw=1, ls=ls)
    ax1.set_ylabel("trained tokens/s")
    ax1.legend(fontsize=8)
    ax2.set_ylabel("spot workers held")
    ax2.legend(fontsize=8)
    ax2.set_xlabel("hours of trace replayed")
    names = [r.policy.name for r in results]
    trainer = [float(r.trainer_dollars) for r in results]
    spot = [float(r.spot_dollars) for r in results]
    ax3.bar(names, trainer, label="trainer (on-demand)")
    bars = ax3.bar(names, spot, bottom=trainer, label="spot workers")
    ax3.bar_label(bars, labels=[f"${per_million(r):,.2f}/1M tok" for r in results], fontsize=8, padding=2)
    ax3.set_ylabel("dollars")
    ax3.legend(fontsize=8)
    for ax in (ax1, ax2, ax3):
        ax.set_ylim(bottom=0)
    ax3.margins(y=0.15)  # room for the labels above the tallest bar
    ax3.set_ylim(bottom=0)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class DeadlineVerdict:
    """Whether each replayed setting finished the job's steps by its `deadline_hours`, and at what cost."""

    deadline_h: float
    steps: int
    rows: list[tuple[Choice, float | None]]  # (setting, hours to finish; None: not finished in the replay)

    @classmethod
    def of(cls, deadline_h: float, steps: int, choices: list[Choice]) -> DeadlineVerdict:
        return cls(deadline_h, steps, [(c, hours_to_steps(c.result, steps)) for c in choices])

    def meeting(self) -> list[tuple[Choice, float]]:
        return [(c, h) for c, h in self.rows if h is not None and h <= self.deadline_h]

    def lines(self) -> list[str]:
        head = f"Deadline {self.deadline_h:g} h for {self.steps} steps:"
        ok = self.meeting()
        if not ok:
            done = [(c, h) for c, h in self.rows if h is not None]
            if done:
                c, h = min(done, key=lambda x: x[1])
                return [f"{head} cannot be met on this trace; the fastest, {c.label}, needs {h:.2f} h."]
            return [f"{head} no setting finished them in the replay: cannot be met on this trace."]
        best, best_h = min(ok, key=lambda x: x[0].result.dollars)
        out = [
            f"{head} met by {len(ok)} of {len(self.rows)} settings; the cheapest, {best.label}, finishes in "
            f"{best_h:.2f} h for ${best.result.dollars:,.2f}."
        ]
        for c, h in self.rows:
            if not c.result.policy.spot:
                verdict = "meets" if h is not None and h <= self.deadline_h else "misses"
                when = f"{h:.2f} h ({verdict} it)" if h is not None else "does not finish"
                who = c.label if c.label.startswith("trainer ") else f"The trainer alone ({c.label})"  # --sweep-trainer
                out.append(f"{who} {when} for ${c.result.dollars:,.2f}.")
        return out

    def as_json(self) -> dict:
        return {
            "deadline_hours": self.deadline_h,
            "steps": self.steps,
            "settings": [
                {
                    "setting": c.label,
                    "hours": None if h is None else round(float(h), 3),
                    "dollars": round(float(c.result.dollars), 2),
                    "meets": bool(h is not None and h <= self.deadline_h),
                }
                for c, h in self.rows
            ],
        }
