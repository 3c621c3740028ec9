"""Tables and plots of simulation results."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from simulator.core import SimResult


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


def results_table(results: list[SimResult], title: str) -> Table:
    base = next((r for r in results if r.policy.name == "on-demand"), None)
    t = Table(title=title)
    for col in (
        "policy",
        "steps/h",
        "trained tok/s",
        "$",
        "tokens/$",
        "thr vs OD",
        "tok/$ vs OD",
        "preempt",
        "migrated",
    ):
        t.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for r in results:
        t.add_row(
            r.policy.name,
            f"{r.steps_per_hour:.1f}",
            f"{r.tokens_per_s:,.0f}",
            f"{r.dollars:,.2f}",
            f"{r.tokens_per_dollar:,.0f}",
            ratio(r.tokens_per_s, base.tokens_per_s) if base else "-",
            ratio(r.tokens_per_dollar, base.tokens_per_dollar) if base else "-",
            str(r.preemptions),
            str(r.migrations),
        )
    t.caption = "; ".join(f"{r.policy.name}: {r.policy.label}" for r in results)
    return t


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
                "dollars": round(r.dollars, 4),
                "spot_dollars": round(r.spot_dollars, 4),
                "trainer_dollars": round(r.trainer_dollars, 4),
                "tokens_per_dollar": round(r.tokens_per_dollar, 2),
                "throughput_vs_on_demand": round(r.tokens_per_s / base.tokens_per_s, 4)
                if base and base.tokens_per_s
                else None,
                "tokens_per_dollar_vs_on_demand": (
                    round(r.tokens_per_dollar / base.tokens_per_dollar, 4) if base and base.tokens_per_dollar else None
                ),
                "preemptions": r.preemptions,
                "migrations": r.migrations,
                "discarded_tokens": r.restarted_tokens,
                "time_scale": r.time_scale,
            }
        )
    return out


def plot(results: list[SimResult], path: Path, title: str) -> None:
    """Throughput (trained tokens/s over a sliding window) and live spot workers over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for r in results:
        if not r.timeline:
            continue
        ts = [t / 3600 for t, _, _ in r.timeline]
        tok = [k for _, _, k in r.timeline]
        window = max(1, len(ts) // 60)
        rate_t, rate = [], []
        for i in range(window, len(ts)):
            dt = (ts[i] - ts[i - window]) * 3600
            if dt > 0:
                rate_t.append(ts[i])
                rate.append((tok[i] - tok[i - window]) / dt)
        ax1.plot(rate_t, rate, label=r.policy.name, lw=1)
        ax2.step(ts, [w for _, w, _ in r.timeline], where="post", label=r.policy.name, lw=1)
    ax1.set_ylabel("trained tokens/s")
    ax1.legend(fontsize=8)
    ax2.set_ylabel("live spot workers")
    ax2.set_xlabel("hours (simulated)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
