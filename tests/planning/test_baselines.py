"""Baseline cost models: known values on meshes, rings, relaying contention; BLP against the strong baselines."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from testbed.planning.baselines import (
    baselines,
    best_ring_cost,
    blink_cost,
    hierarchical_cost,
    ring_cost,
    ring_relay_cost,
    star_cost,
    tree_best_cost,
    widest_paths,
)
from testbed.planning.model import PAYLOAD_FRACTION, auto_chunks, evaluate, validate_plan
from testbed.planning.solver import plan_blp
from traffic_control.errors import ValidationError

from .graphs import GBIT, MBIT, Bps, build, chain, mesh, triangle

S = 100_000_000
B = Bps(GBIT)  # payload bytes/s


def gloo_ring_time(size: float, n: int, delay: float, rate_Bps: float) -> float:
    """gloo's ring (gloo/allreduce.cc) on n ranks over equal hops, by hand: segments of <= 1 MiB, >= 2 per
    rank, a count divisible by n; 2 (m - m/n) iterations, each at least a segment's send and, with the
    receiver's ready notice to wait for, a one-way delay plus half a segment's send; then the last trip."""
    m = max(math.ceil(size / 2**20), 2 * n)
    m = -(-m // n) * n
    seg = size / m
    iters = 2 * (m - m // n)
    return iters * max(seg / rate_Bps, delay + seg / (2 * rate_Bps)) + delay + seg / rate_Bps


@pytest.mark.parametrize("n", [3, 4, 6])
def test_ring_on_mesh_is_2_n_minus_1_over_n(n):
    g = mesh(n, delay=0.01)
    c = hierarchical_cost(g, S)
    assert c.bandwidth_time_s == pytest.approx(2 * (n - 1) / n * S / B)
    assert c.time_s == pytest.approx(gloo_ring_time(S, n, 0.01, B))
    # on a long hop every iteration waits a one-way delay for the receiver's ready notice
    far = hierarchical_cost(mesh(n, delay=0.1), S)
    assert far.time_s - c.time_s == pytest.approx(gloo_ring_time(S, n, 0.1, B) - gloo_ring_time(S, n, 0.01, B))
    assert far.time_s > c.time_s + 2 * (n - 1) * 0.09


@pytest.mark.parametrize("n", [3, 5])
def test_star_on_mesh_meets_bound(n):
    c = star_cost(mesh(n), S)
    assert c.bandwidth_time_s == pytest.approx(2 * S / (n * B))


def test_flat_ring_counts_hosts():
    g = build([("x", "y", GBIT, 0.02)])
    g.nodes["x"]["hosts"] = 2
    g.nodes["y"]["hosts"] = 2
    flat = ring_cost(g, S)
    assert flat.bandwidth_time_s == pytest.approx(2 * 3 / 4 * S / B)  # N = 4 ranks
    assert flat.time_s == pytest.approx(gloo_ring_time(S, 4, 0.02, B))  # the two LAN hops taken as free
    assert hierarchical_cost(g, S).bandwidth_time_s == pytest.approx(S / B)


def test_ring_relaying_contention_on_a_chain():
    # ring d0>d1>d2>d3 on a chain: the closing hop d3->d0 relays over every link
    g = chain(4, rate=GBIT)
    c = hierarchical_cost(g, S)
    per_hop = 2 * 3 / 4 * S
    loads = {(ll.src, ll.dst): ll.bytes for ll in c.links}
    assert loads[("d1", "d0")] == pytest.approx(per_hop)
    assert loads[("d0", "d1")] == pytest.approx(per_hop)
    assert c.bandwidth_time_s == pytest.approx(per_hop / B)


def test_star_relays_collide_on_a_chain():
    c = star_cost(chain(3, rate=GBIT), S)
    # d0->d1 carries d0's pushes to d1 and d2 plus d0's pulls... 2 shards out, 1 pull back from d1, 1 from d2 relayed
    loads = {(ll.src, ll.dst): ll.bytes for ll in c.links}
    assert loads[("d0", "d1")] == pytest.approx(4 * S / 3)


def test_best_ring_not_worse_than_graph_order():
    g = triangle()
    assert best_ring_cost(g, S).time_s <= hierarchical_cost(g, S).time_s + 1e-12
    every = baselines(g, S)
    assert set(every) == {"ring_relay", "tree_best", "blink", "hierarchical", "star", "ring_best", "ring"}
    assert all(c.detail for c in every.values())


def test_triangle_numbers():
    all4 = baselines(triangle(delay=0.01), S)
    # leader ring over the 100 Mbit/s link: 4/3 S at 12.5 MB/s
    assert all4["hierarchical"].bandwidth_time_s == pytest.approx(4 / 3 * S / Bps(100 * MBIT))


def test_bad_input():
    with pytest.raises(ValidationError):
        ring_cost(triangle(), 0)
    with pytest.raises(ValidationError):
        star_cost(build([("a", "b", GBIT, 0.0), ("c", "d", GBIT, 0.0)]), S)


# ------------------------------------------------------------------ strong baselines
topologies = pytest.importorskip("topologies")
BUNDLED = sorted(p.stem for p in Path(topologies.__file__).parent.glob("*.yaml"))
SIZES = [1_000_000, 8_000_000, 64_000_000]


def test_payload_fraction_is_the_measured_one():
    from testbed.network.measure import TCP_PAYLOAD_FRACTION

    assert PAYLOAD_FRACTION == TCP_PAYLOAD_FRACTION
    g = build([("x", "y", 100 * MBIT, 0.0)])
    # 1 MB over 100 Mbit/s takes 80 ms on the wire, 80 / 0.956 ms of payload: BLP and every baseline agree
    want = 1e6 * 8 / (100 * MBIT * PAYLOAD_FRACTION)
    assert plan_blp(g, 1_000_000, chunks=1).cost.bandwidth_time_s == pytest.approx(want)
    for c in baselines(g, 1_000_000, chunks=1).values():
        assert c.bandwidth_time_s == pytest.approx(want), c.name


def test_bundled_topologies_are_all_covered():
    assert {"two_dc", "three_dc_triangle", "geo_wan", "star"} <= set(BUNDLED)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", BUNDLED)
def test_blp_prediction_not_above_the_best_baseline(name, size):
    """BLP <= every baseline on every bundled topology, two_dc included.

    On two_dc there is nothing to route around: BLP's tree is rooted at the
    link (the direct exchange, one crossing), which ties the relayed leader
    ring and beats gloo's two-rank ring (two crossings) by one delay.
    """
    topo = topologies.load(name)
    g = topo.dc_graph()
    plan = plan_blp(g, size, path=topo.path)
    base = baselines(g, size, path=topo.path)
    for c in base.values():
        assert plan.predicted_time_s <= c.time_s * (1 + 1e-9), (c.name, c.time_s, plan.predicted_time_s)
    if len(g) == 2:
        (t,) = plan.trees
        assert t.pair is not None
        (rate,) = {d["rate_bps"] for _, _, d in g.edges(data=True)}  # one symmetric link
        (delay,) = {d["delay_s"] for _, _, d in g.edges(data=True)}
        assert plan.predicted_time_s == pytest.approx(size / Bps(rate) + delay)
        # gloo's two-rank ring crosses the link twice and waits for ready notices
        assert base["hierarchical"].time_s == pytest.approx(gloo_ring_time(size, 2, delay, Bps(rate)))
        assert base["hierarchical"].time_s >= plan.predicted_time_s + delay
        assert base["ring_relay"].time_s == pytest.approx(plan.predicted_time_s)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", BUNDLED)
def test_blink_packs_at_least_as_well_by_bandwidth(name, size):
    topo = topologies.load(name)
    g = topo.dc_graph()
    plan = plan_blp(g, size, path=topo.path)
    blink = blink_cost(g, size, path=topo.path)
    assert blink.bandwidth_time_s <= plan.cost.bandwidth_time_s * (1 + 1e-9)
    assert blink.time_s >= plan.predicted_time_s * (1 - 1e-9)
    assert blink.plan is not None and blink.plan.cost.time_s == pytest.approx(blink.time_s)


def _triangle():
    topo = topologies.load("three_dc_triangle")
    return topo, topo.dc_graph()


def test_widest_paths_relay_around_the_slow_link():
    topo, g = _triangle()
    wide = widest_paths(g)
    assert topo.path("east", "west") == ["east", "west"]  # the routers take the direct (least-delay) link
    assert wide("east", "west") == ["east", "central", "west"] and wide("west", "east") == ["west", "central", "east"]
    assert wide("east", "central") == ["east", "central"]
    assert widest_paths(triangle())("a", "c") == ["a", "b", "c"]


@pytest.mark.parametrize("size", SIZES)
def test_ring_relay_on_the_triangle_relays_around_the_slow_link(size):
    topo, g = _triangle()
    c = ring_relay_cost(g, size, path=topo.path)
    loads = {(ll.src, ll.dst): ll.bytes for ll in c.links}
    assert loads[("east", "west")] == 0 and loads[("west", "east")] == 0
    relayed = [r for r in c.routes.values() if len(r) == 3]
    assert relayed and all(r[1] == "central" for r in relayed)
    n = 3
    per_hop = 2 * (n - 1) / n * size
    assert c.bandwidth_time_s == pytest.approx(per_hop / Bps(200 * MBIT))  # one ring hop per link direction
    assert c.time_s < best_ring_cost(g, size, path=topo.path).time_s  # the least-delay ring crosses 40 Mbit/s
    assert "via central" in c.detail and c.executor == "RingRelayAllReduce"


def test_ring_relay_latency_two_dcs_by_hand():
    rate, d, size, k = 100 * MBIT, 0.02, 8_000_000, 32
    g = build([("x", "y", rate, d)])
    c = ring_relay_cost(g, size, chunks=k)
    chunk = size / 2 / (k // 2)
    # both directions stream from the start; the last chunk arrives one delay after the stream ends
    # (its transmission is the stream's last: the pipeline credit takes the chunk time back)
    assert chunk == 250_000
    assert c.time_s == pytest.approx(size / Bps(rate) + d)
    small = ring_relay_cost(g, 10_000, chunks=1)  # one chunk per segment: 2 (n-1) = 2 hops of latency
    assert small.time_s == pytest.approx(2 * (d + 5_000 / Bps(rate)))


def test_tree_best_on_the_triangle_is_the_tree_through_the_hub():
    topo, g = _triangle()
    c = tree_best_cost(g, 8_000_000, path=topo.path)
    (t,) = c.plan.trees
    assert t.root == "central" and dict(t.parents) == {"east": "central", "west": "central"}
    validate_plan(c.plan, g)
    assert c.time_s == pytest.approx(evaluate(g, c.plan.trees, 8_000_000, topo.path).time_s)
    assert "all 3 spanning trees x every root (DC or link)" in c.detail


def test_tree_best_is_the_best_single_tree_and_has_a_fallback():
    g = mesh(5, delay=0.01)
    g.edges["d0", "d1"]["rate_bps"] = g.edges["d1", "d0"]["rate_bps"] = 100 * MBIT
    exact = tree_best_cost(g, S)
    assert "all 125 spanning trees" in exact.detail
    fallback = tree_best_cost(g, S, enum_limit=10)
    assert "exceed the limit 10" in fallback.detail
    assert fallback.time_s >= exact.time_s - 1e-12
    assert plan_blp(g, S).predicted_time_s <= exact.time_s * (1 + 1e-9)
    assert exact.plan.chunks == auto_chunks(S) == exact.plan.trees[0].chunks


def test_star_is_a_plan_of_one_star_tree_per_dc():
    topo, g = _triangle()
    c = star_cost(g, 8_000_000, path=topo.path)
    assert c.executor == "BlpAllReduce" and len(c.plan.trees) == 3
    assert all(set(t.parents.values()) == {t.root} for t in c.plan.trees)
    assert sum(t.share for t in c.plan.trees) == pytest.approx(1.0)
