"""Baseline cost models: known values on meshes, rings, relaying contention."""

from __future__ import annotations

import pytest

from testbed.planning.baselines import (
    baselines,
    best_ring_cost,
    hierarchical_cost,
    ring_cost,
    star_cost,
)
from traffic_control.errors import ValidationError

from .graphs import GBIT, MBIT, build, chain, mesh, triangle

S = 100_000_000
B = GBIT / 8  # bytes/s


@pytest.mark.parametrize("n", [3, 4, 6])
def test_ring_on_mesh_is_2_n_minus_1_over_n(n):
    g = mesh(n, delay=0.01)
    c = hierarchical_cost(g, S)
    assert c.bandwidth_time_s == pytest.approx(2 * (n - 1) / n * S / B)
    assert c.latency_time_s == pytest.approx(2 * (n - 1) * 0.01)


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
    assert flat.latency_time_s == pytest.approx(6 * 0.02)
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
    all4 = baselines(g, S)
    assert set(all4) == {"ring", "ring_best", "hierarchical", "star"}


def test_triangle_numbers():
    all4 = baselines(triangle(delay=0.01), S)
    # leader ring over the 100 Mbit/s link: 4/3 S at 12.5 MB/s
    assert all4["hierarchical"].bandwidth_time_s == pytest.approx(4 / 3 * S / (100 * MBIT / 8))


def test_bad_input():
    with pytest.raises(ValidationError):
        ring_cost(triangle(), 0)
    with pytest.raises(ValidationError):
        star_cost(build([("a", "b", GBIT, 0.0), ("c", "d", GBIT, 0.0)]), S)
