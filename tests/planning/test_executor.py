"""BLP's executor and the baselines' on loopback gloo: every result equals dist.all_reduce.

One world of 6 processes runs every scenario (spawning is the expensive
part): 3 DCs x 2 ranks with a planned 3-tree plan (point-to-point and
collective intra-DC phases), 6 DCs x 1 rank with deep relayed trees, 2 DCs
x 3 ranks with averaging and non-default leaders, uneven DCs, and a tensor
smaller than the chunk count; the same for the relayed leader ring
(``RingRelayAllReduce``: deep relays, empty chunks, window 1), hierarchical
all-reduce on collectives, the star parameter server as a plan, and trees
rooted at a link (deep sides at both ends, beside DC-rooted trees).  Every
rank's result is checked bit for bit against every other rank's.  Byte
accounting is checked exactly where every DC has one rank.  The benchmark
helper then times BLP and every executable baseline of the triangle and
checks each one's sum.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import time

import networkx as nx
import pytest

torch = pytest.importorskip("torch")
import torch.multiprocessing as mp  # noqa: E402

from testbed.planning.baselines import baselines, ring_relay_cost, star_cost  # noqa: E402
from testbed.planning.bench import executable_specs  # noqa: E402
from testbed.planning.executor import ring_chunk_bounds, split_bounds  # noqa: E402
from testbed.planning.model import Plan, Tree, evaluate  # noqa: E402
from testbed.planning.solver import plan_blp  # noqa: E402
from testbed.training.local import free_port  # noqa: E402

from ._gloo_worker import WORLD, run_scenarios  # noqa: E402

pytestmark = pytest.mark.torch


def _graph(links: list[tuple[str, str, float]], delay: float = 0.01) -> nx.DiGraph:
    g = nx.DiGraph()
    for a, b, r in links:
        g.add_edge(a, b, rate_bps=r, delay_s=delay)
        g.add_edge(b, a, rate_bps=r, delay_s=delay)
    return g


def _hand_plan(graph: nx.DiGraph, trees: list[Tree], size: int = 4000) -> Plan:
    return Plan(tuple(graph.nodes), size, tuple(trees), max(t.chunks for t in trees), "hand",
                evaluate(graph, trees, size))


def _rechunk(plan: Plan, chunks: int) -> Plan:
    return dataclasses.replace(plan, trees=tuple(dataclasses.replace(t, chunks=chunks) for t in plan.trees))


def _scenarios() -> list[tuple[str, Plan, dict[int, str], dict[str, int] | None, dict]]:
    tri = _graph([("a", "b", 1e9), ("b", "c", 1e9), ("a", "c", 1e8)], delay=0.0)
    tri_plan = _rechunk(plan_blp(tri, 100_000_000), 7)
    assert len(tri_plan.trees) == 3
    three = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
    names = ["d0", "d1", "d2", "d3", "d4", "d5"]
    chain = _graph([(names[i], names[i + 1], 1e8) for i in range(5)])
    chain_plan = plan_blp(chain, 4000, chunks=5)
    ring6 = _graph([(names[i], names[(i + 1) % 6], 1e8) for i in range(6)] + [("d0", "d3", 5e7)])
    six_hand = _hand_plan(ring6, [
        Tree("d2", {"d3": "d2", "d4": "d3", "d5": "d4", "d0": "d5", "d1": "d0"}, 0.5, 3),   # depth-5 relay
        Tree("d0", {"d1": "d0", "d5": "d0", "d3": "d0", "d2": "d3", "d4": "d3"}, 0.3, 4),
        Tree("d4", {"d5": "d4", "d3": "d4", "d2": "d3", "d1": "d2", "d0": "d1"}, 0.2, 2),
    ])
    one_each = {i: names[i] for i in range(6)}
    two = _graph([("x", "y", 1e8)])
    two_plan = plan_blp(two, 4000, chunks=3)
    tiny = _hand_plan(tri, [Tree("a", {"b": "a", "c": "b"}, 0.6, 8), Tree("c", {"a": "c", "b": "a"}, 0.4, 8)])
    tri_ring = ring_relay_cost(tri, 100_000_000, chunks=12)
    assert tri_ring.routes[("c", "a")] == ("c", "b", "a")  # the slow a-c link is relayed around
    tri_ring_spec = {"kind": "ring_relay", "ring": list(tri_ring.ring), "routes": tri_ring.routes, "chunks": 4}
    deep = {"kind": "ring_relay", "ring": ["d0", "d2", "d1", "d3", "d5", "d4"], "chunks": 3,
            "routes": {("d0", "d2"): ("d0", "d1", "d2"), ("d4", "d0"): ("d4", "d3", "d2", "d1", "d0")}}
    deep["routes"].update({h: h for h in zip(deep["ring"], deep["ring"][1:]) if h not in deep["routes"]})
    two_ring = {"kind": "ring_relay", "ring": ["y", "x"], "routes": {}, "chunks": 5}
    chain_star = star_cost(chain, 4000, chunks=6).plan  # tree edges between DCs with no link: routed
    assert two_plan.trees[0].pair is not None  # two DCs: the direct exchange over the link
    # link roots with deep sides on both ends, beside a DC-rooted tree
    chain_link = _hand_plan(chain, [
        Tree("d2", {"d1": "d2", "d0": "d1", "d3": "d2", "d4": "d3", "d5": "d4"}, 0.7, 4, pair="d3"),
        Tree("d0", {"d1": "d0", "d2": "d1", "d3": "d2", "d4": "d3", "d5": "d4"}, 0.3, 3)])
    tri_link = _hand_plan(tri, [Tree("b", {"a": "b", "c": "b"}, 0.5, 5, pair="c"),
                                Tree("a", {"b": "a", "c": "b"}, 0.5, 5, pair="b")])
    hier = {"kind": "hierarchical"}
    return [
        ("triangle-p2p", tri_plan, three, None, {"numel": 1001}),
        ("triangle-window1", tri_plan, three, None, {"numel": 1001, "window": 1}),
        ("chain-window2", chain_plan, one_each, None, {"numel": 777, "window": 2, "bytes": True}),
        ("triangle-f64", tri_plan, three, None, {"numel": 999, "dtype": torch.float64}),
        ("triangle-groups", tri_plan, three, None, {"numel": 1001, "groups": True}),
        ("chain-relay", chain_plan, one_each, None, {"numel": 777, "bytes": True}),
        ("ring6-hand", six_hand, one_each, None, {"numel": 1500, "bytes": True}),
        ("two-dc-average", two_plan, {0: "x", 1: "x", 2: "x", 3: "y", 4: "y", 5: "y"}, {"x": 2, "y": 3},
         {"numel": 640, "average": True}),
        ("uneven", tri_plan, {0: "c", 1: "a", 2: "a", 3: "b", 4: "b", 5: "b"}, {"a": 2, "b": 5, "c": 0},
         {"numel": 333}),
        ("tiny", tiny, {i: "abc"[i % 3] for i in range(6)}, None, {"numel": 5}),
        ("ring-relay-triangle-groups", None, three, None, {"numel": 1001, "groups": True, "scheme": tri_ring_spec}),
        ("ring-relay-deep", None, one_each, None, {"numel": 1001, "bytes": True, "scheme": deep}),
        ("ring-relay-deep-window1", None, one_each, None, {"numel": 500, "window": 1, "bytes": True,
                                                           "scheme": deep}),
        ("ring-relay-two-dc-average", None, {0: "x", 1: "x", 2: "x", 3: "y", 4: "y", 5: "y"}, {"x": 2, "y": 3},
         {"numel": 640, "average": True, "scheme": two_ring}),
        ("ring-relay-tiny", None, {i: "abc"[i % 3] for i in range(6)}, None,
         {"numel": 5, "scheme": dict(tri_ring_spec, chunks=4)}),
        ("hierarchical-groups", None, three, None, {"numel": 1001, "groups": True, "scheme": hier}),
        ("hierarchical-p2p-uneven", None, {0: "c", 1: "a", 2: "a", 3: "b", 4: "b", 5: "b"}, {"a": 2, "b": 5, "c": 0},
         {"numel": 333, "scheme": hier}),
        ("star-chain", chain_star, one_each, None, {"numel": 777, "bytes": True}),
        ("link-root-chain", chain_link, one_each, None, {"numel": 1001, "bytes": True}),
        ("link-root-chain-window1", chain_link, one_each, None, {"numel": 501, "window": 1, "bytes": True}),
        ("link-root-triangle-groups", tri_link, three, None, {"numel": 1001, "groups": True}),
        ("link-root-uneven", tri_link, {0: "c", 1: "a", 2: "a", 3: "b", 4: "b", 5: "b"}, {"a": 2, "b": 5, "c": 0},
         {"numel": 333}),
    ]


def test_executor_matches_all_reduce(tmp_path):
    scenarios = _scenarios()
    errfile = str(tmp_path / "err")
    # forkserver: one clean server process imports torch once and forks the ranks from it
    # (spawn would import torch in each of 6 ranks; plain fork would copy pytest's state)
    multiprocessing.get_context("forkserver").set_forkserver_preload(["tests.planning._gloo_worker"])
    tri = scenarios[0][1]
    graph = _graph([("a", "b", 1e9), ("b", "c", 1e9), ("a", "c", 1e8)], delay=0.0)
    specs = executable_specs(baselines(graph, tri.size_bytes, chunks=7))
    assert set(specs) == {"ring_relay", "tree_best", "blink", "hierarchical", "star", "ring"}
    ctx = mp.start_processes(run_scenarios, args=(free_port(), scenarios, errfile, specs), nprocs=WORLD,
                             join=False, start_method="forkserver")
    deadline = time.monotonic() + 120
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail("executor test timed out (deadlock?)")
    except (mp.ProcessRaisedException, mp.ProcessExitedException):
        errs = "\n".join(p.read_text() for p in sorted(tmp_path.glob("err.*")))
        pytest.fail(f"a rank failed:\n{errs}")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    bench = json.loads((tmp_path / "err.bench.json").read_text().splitlines()[0])
    assert bench["numel"] == 3000 and len(bench["blp"]["times_s"]) == 2
    assert bench["blp"]["median_s"] > 0 and bench["ring"]["median_s"] > 0 and bench["blp_over_ring"] > 0
    assert bench["blp"]["predicted_s"] > 0
    assert bench["schemes"][0] == "blp" and set(bench["schemes"]) == {"blp", *specs}
    for name in bench["schemes"]:
        r = bench[name]
        assert r["max_abs_diff"] == 0, f"{name} did not produce the exact sum"
        assert r["median_s"] > 0 and r["predicted_s"] > 0 and r["over_blp"] > 0, name
    # rank 0 leads DC a: it sends on the relayed ring and on the trees
    assert bench["ring_relay"]["bytes_sent"] and bench["tree_best"]["bytes_sent"]


def test_ring_chunk_bounds_cover_tensor_in_order():
    for numel, n, c in ((1, 3, 4), (5, 3, 4), (1001, 6, 3), (10, 2, 1)):
        flat = [r for seg in ring_chunk_bounds(numel, n, c) for r in seg]
        assert len(flat) == n * c and flat[0][0] == 0 and flat[-1][1] == numel
        assert all(flat[i][1] == flat[i + 1][0] for i in range(len(flat) - 1))


def test_split_bounds_cover_tensor_in_order():
    g = _graph([("a", "b", 1e9), ("b", "c", 1e9), ("a", "c", 1e8)])
    plan = plan_blp(g, 10_000, chunks=16)
    for numel in (1, 5, 16, 1001, 10_000):
        flat = [r for tree in split_bounds(numel, plan) for r in tree]
        assert flat[0][0] == 0 and flat[-1][1] == numel
        assert all(a < b for a, b in flat)
        assert all(flat[i][1] == flat[i + 1][0] for i in range(len(flat) - 1))
