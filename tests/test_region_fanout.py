"""Region-aware fan-out: the policy, the tracker's grouping by region, and real pullers in two regions."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rlboost.providers.base import InstanceKind, LaunchRequest, Owner, Role
from rlboost.providers.bootstrap import node_env
from rlboost.weights.peer_server import ServeOptions, WeightNode
from rlboost.weights.publisher import PublishOptions, WeightPublisher
from rlboost.weights.pull import PullOptions
from rlboost.weights.region_fanout import RegionView, origin_grants, region_key
from rlboost.weights.tracker import Announce, SwarmTracker, decode_bits, encode_bits
from tests.test_weight_swarm import TOKEN, assert_same, model, serve

# ---- the pure policy -------------------------------------------------------------------------


@st.composite
def region_views(draw: st.DrawFn) -> tuple[RegionView, str, int]:
    n = draw(st.integers(0, 40))
    chunks = st.integers(0, max(0, n - 1))
    held = frozenset(draw(st.sets(chunks))) if n else frozenset()
    owners = st.sampled_from(["me", "p1", "p2"])
    leased = draw(st.dictionaries(chunks, owners)) if n else {}
    leased = {c: p for c, p in leased.items() if c not in held or p == "me"}
    return RegionView(n, held, leased, draw(st.integers(0, 6))), "me", draw(st.integers(0, 50))


@given(region_views())
def test_origin_grants_keep_the_callers_leases_and_take_only_open_chunks(case: tuple[RegionView, str, int]) -> None:
    view, me, want = case
    got = origin_grants(view, me, want)
    mine = {c for c, p in view.leased.items() if p == me}
    assert got == sorted(set(got))
    assert mine <= set(got)  # a live lease is never taken back
    new = set(got) - mine
    assert not new & view.held and not new & set(view.leased)  # nothing another holds or fetches
    open_chunks = [c for c in range(view.n_chunks) if c not in view.held and c not in view.leased]
    share = -(-(len(open_chunks) + len(view.leased)) // max(1, view.pullers))
    assert len(new) == max(0, min(want, share, len(mine) + len(open_chunks)) - len(mine))
    assert sorted(new) == open_chunks[: len(new)]  # lowest open chunks first: deterministic


def test_region_key_names_cloud_and_region_and_refuses_what_the_tracker_would() -> None:
    assert region_key("aws", "us-east-1") == "aws/us-east-1"
    assert region_key("local", None) == "local/unknown"
    assert region_key(None, None) is None and region_key("", "") is None
    assert region_key("aws", "us east 1") is None  # a name the announce pattern refuses
    with pytest.raises(ValidationError, match="region"):
        Announce(peer_id="a", n_chunks=1, region="us east 1")


# ---- the tracker, announce by announce on a virtual clock ----------------------------------------


def swarm_run(tracker: SwarmTracker, regions: dict[str, int], n: int, want: int, kill: dict[str, int] | None = None):
    """Pullers (`regions`: pullers per region) announce in turn; each fetches its origin grants, then
    one chunk from a listed peer. `kill`: puller -> round after which it vanishes (it stops
    announcing; its peers report it). Returns origin fetches per (region, chunk) and peer fetches as
    (puller region, peer region)."""
    now = [0.0]
    tracker.clock = lambda: now[0]
    have = {f"{r}-{i}": set() for r, k in regions.items() for i in range(k)}
    region = {p: p.rsplit("-", 1)[0] for p in have}
    url = {p: f"http://{p}" for p in have}
    dead: set[str] = set()
    origin: Counter[tuple[str, int]] = Counter()
    peer_trades: list[tuple[str, str]] = []
    for rnd in range(10 * n + 10):
        live = [p for p in have if p not in dead and len(have[p]) < n]
        if not live:
            break
        for p in live:
            bad = [url[d] for d in dead if d in (kill or {})]
            view = tracker.announce(
                1,
                Announce(
                    peer_id=p,
                    url=url[p],
                    n_chunks=n,
                    have=encode_bits(have[p], n),
                    want=want,
                    region=region[p],
                    bad=bad,
                ),
            )
            for c in view["origin"]:
                if c not in have[p]:
                    origin[(region[p], c)] += 1
                    have[p].add(c)
            for q in view["peers"]:
                src = q["url"].removeprefix("http://")
                assert src not in dead
                extra = decode_bits(q["have"], n) & have[src] - have[p]
                if extra:
                    have[p].add(min(extra))
                    peer_trades.append((region[p], q["region"]))
                    break
            if len(have[p]) == n:  # as a finished pull does: it says so, and seeds from then on
                tracker.announce(
                    1,
                    Announce(
                        peer_id=p, url=url[p], n_chunks=n, have=encode_bits(range(n), n), done=True, region=region[p]
                    ),
                )
        for p, at in (kill or {}).items():
            if rnd == at:
                dead.add(p)
        now[0] += 0.1
    assert all(len(have[p]) == n for p in have if p not in dead), "every live puller completes"
    return origin, peer_trades


@settings(max_examples=25, deadline=None)
@given(
    regions=st.dictionaries(
        st.sampled_from(["aws/us-east-1", "gcp/us-central1", "aws/eu-west-1"]), st.integers(1, 4), min_size=1
    ),
    n=st.integers(1, 24),
    want=st.integers(1, 8),
)
def test_each_chunk_enters_each_region_once_and_peers_trade_only_within_it(
    regions: dict[str, int], n: int, want: int
) -> None:
    origin, trades = swarm_run(SwarmTracker(lease_s=1e9, peer_ttl_s=1e9), regions, n, want)
    assert origin == Counter({(r, c): 1 for r in regions for c in range(n)})
    assert all(mine == theirs for mine, theirs in trades)
    if any(k > 1 for k in regions.values()) and n > 4:
        assert trades  # the region's other pullers fetched from its peers


def test_region_blind_tracker_sends_each_chunk_once_and_trades_across_regions() -> None:
    """The baseline the benchmark measures against: one swarm for all regions."""
    origin, trades = swarm_run(SwarmTracker(lease_s=1e9, peer_ttl_s=1e9, by_region=False), {"a/x": 3, "b/y": 3}, 24, 2)
    assert sum(origin.values()) == 24 and {c for _, c in origin} == set(range(24))
    assert any(mine != theirs for mine, theirs in trades)


def test_a_region_whose_seed_dies_falls_back_to_the_trainer_not_to_another_region() -> None:
    # a-0 takes grants first and dies after round 1 holding part of the model; region b holds it all
    origin, trades = swarm_run(
        SwarmTracker(lease_s=1e9, peer_ttl_s=1e9), {"a/x": 2, "b/y": 2}, 16, 8, kill={"a/x-0": 1}
    )
    assert all(mine == theirs for mine, theirs in trades)
    lost = [c for c in range(16) if origin[("a/x", c)] == 2]
    assert lost, "chunks that died with a/x-0 came again from the trainer"
    assert all(origin[("a/x", c)] in (1, 2) for c in range(16)) and all(origin[("b/y", c)] == 1 for c in range(16))


def test_a_dead_seeds_leases_lapse_and_go_to_its_region_mate() -> None:
    now = [0.0]
    tr = SwarmTracker(lease_s=3.0, peer_ttl_s=8.0, clock=lambda: now[0])

    def ann(pid: str, region: str, have: set[int] = set(), want: int = 8) -> dict:  # noqa: B006
        return tr.announce(
            1,
            Announce(peer_id=pid, url=f"http://{pid}", n_chunks=8, have=encode_bits(have, 8), want=want, region=region),
        )

    assert ann("a0", "a/x")["origin"] == list(range(8))
    assert ann("b0", "b/y")["origin"] == list(range(8))  # the same chunks again: another region
    assert ann("a1", "a/x")["origin"] == []  # a0 is fetching all of them
    assert [p["url"] for p in ann("a1", "a/x")["peers"]] == []  # a0 holds nothing yet; b0 is not offered
    ann("a0", "a/x", {0, 1})
    ann("b0", "b/y", set(range(8)))  # region b holds it all: still not offered to region a
    assert [(p["url"], p["region"]) for p in ann("a1", "a/x")["peers"]] == [("http://a0", "a/x")]
    now[0] = 5.0  # a0 stops announcing: its leases lapse; a1 gets them from the trainer
    assert ann("a1", "a/x", {0, 1})["origin"] == list(range(2, 8))
    assert tr.stats()["1"]["origin_grants_by_region"] == {"a/x": 14, "b/y": 8}


# ---- the worker learns its region from the controller ------------------------------------------


def test_node_env_and_worker_carry_the_region(monkeypatch: pytest.MonkeyPatch) -> None:
    req = LaunchRequest("j-1-w001", Owner("j", 1), Role.WORKER, InstanceKind.SPOT, "gcp", "us-central1", "L4", 0.5)
    env = node_env(req, port=1, from_workdir=True)
    assert (env["RLBOOST_CLOUD"], env["RLBOOST_REGION"]) == ("gcp", "us-central1")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert WeightNode.from_env(TOKEN, "w1", "spot").opts.region == "gcp/us-central1"


# ---- real pullers in two regions -------------------------------------------------------------------


def test_pullers_in_two_regions_get_one_copy_each_from_the_trainer_and_trade_within_their_region() -> None:
    # Leases that never lapse: no chunk is granted twice in a region, whatever the machine's load.
    pub = WeightPublisher(PublishOptions(chunk_bytes=16 * 1024, egress_bps=4e6), tracker=SwarmTracker(lease_s=1e9))
    want = model()
    m = pub.publish(1, want)
    regions = ["aws/us-east-1", "aws/us-east-1", "gcp/europe-west4", "gcp/europe-west4"]

    async def go() -> list[WeightNode]:
        async with serve(pub) as (url, _), aiohttp.ClientSession() as s:
            link = ServeOptions(egress_bps=4e6)
            nodes = [
                WeightNode(PullOptions(token=TOKEN, peer_id=f"w{i}", parallel=2, region=r), link)
                for i, r in enumerate(regions)
            ]
            for n in nodes:
                await n.start()
            try:
                got = await asyncio.gather(*(n.pull(url, 1, s) for n in nodes))
                for g in got:
                    assert_same(want, g)
                return nodes
            finally:
                for n in nodes:
                    await n.close()

    nodes = asyncio.run(asyncio.wait_for(go(), 90))
    # every chunk left the trainer once per region: no peer bytes crossed a region boundary
    assert pub.counters.full_bytes == 2 * m.total_bytes, (pub.counters.full_bytes, m.total_bytes)
    for r in set(regions):
        mine = [n for n in nodes if n.opts.region == r]
        assert sum(n.last.from_peers for n in mine) == sum(n.server.counters.total for n in mine)  # type: ignore[union-attr]
    assert pub.stats()["swarm"]["1"]["origin_grants_by_region"] == {r: len(m.chunks) for r in set(regions)}
