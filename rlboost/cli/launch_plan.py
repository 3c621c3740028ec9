"""`launch --dryrun`: the plan (the trainer's offer, the spot candidates in bidding order, the expected
fleet, prices' sources, credentials, budget and deadline), printed before anything is launched."""

from __future__ import annotations

from rich.markup import escape

from rlboost.cli.output import console
from rlboost.cli.state import StateStore, rlboost_home
from rlboost.cli.tables import add_columns, narrow_table
from rlboost.contracts.provider_kinds import provider_kind
from rlboost.contracts.spec import JobSpec
from rlboost.contracts.wording import spot_workers


def print_plan(spec: JobSpec, t_offer, s_offers, prices=None) -> None:
    from rlboost.rollout.scheduling import cores_note, most_workers, shared_cores

    console.print(f"[bold]plan for job {spec.name}[/] (provider {spec.provider}; nothing launched)")
    n = spec.trainer.nodes
    where = t_offer.cloud + (f"/{t_offer.region}" if t_offer.region else "")
    console.print(
        f"trainer: {n} × {t_offer.accelerator or 'cpu'} on {where} (on-demand): "
        f"${t_offer.hourly_price / n:.3f}/h per node, ${t_offer.hourly_price:.2f}/h in all"
    )
    table = narrow_table("spot candidates, in bidding order (cheapest $ per unit of throughput first)")
    # thr: throughput per node, relative to the job's reference accelerator
    nums = ("spot $/h", "on-demand $/h", "thr", "$/h ÷ thr")
    add_columns(table, "cloud", "region", "zone", "instance", "accel", *nums, numbers=nums)
    for o in s_offers:
        zone, instance = _placement(o) if prices is not None else ("-", "-")
        table.add_row(
            o.cloud,
            o.region or "any",
            zone,
            instance,
            o.accelerator or "-",
            f"{o.hourly_price:.3f}",
            f"{o.on_demand_price:.3f}" if o.on_demand_price is not None else "-",
            f"{o.throughput:g}",
            f"{o.dollars_per_unit_throughput:.3f}",
        )
    console.print(table)
    r, cores = spec.rollout, shared_cores(spec)
    mw = most_workers(spec, cores)
    console.print(
        f"expected fleet: {r.min_workers}–{spot_workers(mw)}, sized after each step by objective "
        f"[cyan]{r.objective}[/]" + (f" (deadline {spec.deadline_hours:g} h)" if spec.deadline_hours else "")
    )
    if note := cores_note(spec, cores):
        console.print(note, markup=False, highlight=False)
    if s_offers:
        worst = t_offer.hourly_price + mw * max(o.hourly_price for o in s_offers)
        console.print(f"at most {spot_workers(mw)}: up to ${worst:.2f}/h with the trainer")
    for cloud, source in sorted(getattr(prices, "sources", {}).items()):
        console.print(f"prices for {cloud}: {source}", markup=False)
    for line in getattr(prices, "skipped", []):  # a candidate's cloud or region with no spot offer
        console.print(line, markup=False, highlight=False)
    console.print(
        "controller: on the trainer node (it bids for spot workers itself; this machine may sleep)"
        if spec.controller == "trainer"
        else "controller: on this machine (`launch -d` runs it in the background; keep this machine up)",
        markup=False,
        highlight=False,
    )
    if not provider_kind(spec.provider).runs_here:
        from rlboost.contracts.cloud_kinds import cloud_kind
        from rlboost.providers import credentials, job_clouds

        for cloud, found in credentials(job_clouds(spec)).items():
            state = (
                f"found ({escape(str(found))})"
                if found
                else (f"[red]missing[/]: {escape(cloud_kind(cloud).credential_hint)}; launch will refuse")
            )
            console.print(f"credentials for {cloud}: {state}")
    if spec.budget_usd is not None:
        spent = spent_before(spec.name)
        before = f" (${spent:.2f} spent by earlier runs)" if spent else ""
        console.print(f"budget cap: ${spec.budget_usd:.2f}{before}")
    if spec.deadline_hours is not None:
        from rlboost.simulator.cli import estimate_deadline

        est = estimate_deadline(spec)
        for line in est.lines() if est else []:
            console.print(line, markup=False, highlight=False)


def _placement(offer) -> tuple[str, str]:
    """(zone, instance type) of the offer's cheapest spot placement in the bundled catalog ('-' unknown)."""
    from rlboost.providers.prices import placements

    found = placements(offer.accelerator, offer.cloud, offer.region, spot=True)
    return (found[0].zone or found[0].region, found[0].instance_type) if found else ("-", "-")


def spent_before(name: str) -> float:
    """Dollars already spent by earlier runs of this job name (0 without a state file)."""
    if not (rlboost_home() / "state.db").exists():
        return 0.0
    from rlboost.cli.ledger import summarize

    store = StateStore()
    return sum(summarize(store, j.id).total_dollars for j in store.list_jobs() if j.name == name)
