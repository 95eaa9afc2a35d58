"""Cost models of the baseline all-reduce schemes on the same DC graph as BLP.

Same fluid model as :mod:`.model` so the numbers are comparable: a scheme is
a set of flows (bytes from one DC to another, routed along ``path``, by
default the least-delay path with fewest hops on ties, as the emulated
routers do); ``T_bw = max_e load_e / cap_e`` over link directions, so
relayed flows that share a link are counted together; plus a latency term
for the scheme's sequential steps.  LAN phases are not modelled.

* ``ring``: flat ring all-reduce over *all* trainer ranks (what
  ``dist.all_reduce`` over gloo does), ranks numbered DC by DC in graph order
  (``hosts`` node attribute, default 1 per DC).  Each of the ``N`` ring hops
  carries ``2 (N-1)/N * S`` (reduce-scatter + all-gather); only hops between
  DCs load the WAN.  Latency: ``2 (N-1)`` synchronous steps, each waiting for
  the slowest hop's one-way path delay.  With one host per DC this is the
  ring over DC leaders.
* ``ring_best``: the same over DC leaders in the best ring order (exhaustive
  for up to 8 DCs, greedy beyond), to show what a topology-aware ring could do.
* ``hierarchical``: reduce inside each DC, ring all-reduce among the DC
  leaders (graph order), broadcast inside each DC: the WAN sees the leader
  ring, ``2 (n-1)`` steps.
* ``star``: a parameter-server shard in every DC ("a server in each DC"):
  each DC leader, after an intra-DC reduce, pushes ``S/n`` to every other
  DC's shard and pulls ``S/n`` of updated values back, routed over the graph;
  one round trip of latency.  (On a full mesh with equal links this meets the
  bandwidth-optimal bound ``2S/(nB)``; on sparse graphs its relayed flows
  collide.)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx

from .model import LinkLoad, PathFn, cached_path, check_graph, check_size, hop_edges

MAX_EXHAUSTIVE_RING = 8


@dataclass(frozen=True)
class SchemeCost:
    """Predicted completion time of one scheme, with the per-link loads behind it."""

    name: str
    time_s: float
    bandwidth_time_s: float
    latency_time_s: float
    links: tuple[LinkLoad, ...]
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "time_s": self.time_s, "bandwidth_time_s": self.bandwidth_time_s,
                "latency_time_s": self.latency_time_s, "detail": self.detail,
                "links": [ll.to_dict() for ll in self.links]}


def shortest_delay_paths(graph: nx.DiGraph) -> PathFn:
    """Least one-way delay routes, ties to fewer hops (the routers' default rule)."""
    table = dict(nx.all_pairs_dijkstra_path(graph, weight=lambda u, v, d: d.get("delay_s", 0.0) + 1e-9))

    def path(src: str, dst: str) -> list[str]:
        return table[src][dst]

    return path


def _hosts(graph: nx.DiGraph, dc: str) -> int:
    h = graph.nodes[dc].get("hosts", 1)
    if isinstance(h, int) and not isinstance(h, bool):
        return max(1, h)
    if isinstance(h, (list, tuple)):
        return max(1, len(h))
    return 1


def _path_delay(graph: nx.DiGraph, path: PathFn, a: str, b: str) -> float:
    return sum(graph.edges[e].get("delay_s", 0.0) for e in hop_edges(graph, path, a, b))


def flow_cost(graph: nx.DiGraph, flows: Sequence[tuple[str, str, float]],
              path: PathFn) -> tuple[float, tuple[LinkLoad, ...]]:
    """Bandwidth term and per-link loads of routed flows (src DC, dst DC, bytes)."""
    loads: dict[tuple[str, str], float] = {}
    for a, b, nbytes in flows:
        if a == b or nbytes <= 0:
            continue
        for e in hop_edges(graph, path, a, b):
            loads[e] = loads.get(e, 0.0) + nbytes
    links = []
    for u, v in graph.edges:
        nb = loads.get((u, v), 0.0)
        rate = float(graph.edges[u, v]["rate_bps"])
        links.append(LinkLoad(u, v, nb, rate, nb * 8.0 / rate if nb else 0.0))
    return max((ll.time_s for ll in links), default=0.0), tuple(links)


def _ring(graph: nx.DiGraph, size: int, ranks: Sequence[str], path: PathFn, name: str, detail: str) -> SchemeCost:
    n = len(ranks)
    if n <= 1 or len(set(ranks)) == 1:
        return SchemeCost(name, 0.0, 0.0, 0.0, flow_cost(graph, [], path)[1], detail)
    per_hop = 2.0 * (n - 1) / n * size
    hops = [(ranks[i], ranks[(i + 1) % n]) for i in range(n)]
    flows = [(a, b, per_hop) for a, b in hops if a != b]
    bw, links = flow_cost(graph, flows, path)
    step = max(_path_delay(graph, path, a, b) for a, b, _ in flows)
    lat = 2 * (n - 1) * step
    return SchemeCost(name, bw + lat, bw, lat, links, detail)


def ring_cost(graph: nx.DiGraph, size_bytes: int, *, order: Sequence[str] | None = None,
              path: PathFn | None = None) -> SchemeCost:
    """Flat ring over all ranks (``hosts`` per DC), DCs in ``order`` (default graph order)."""
    size = check_size(size_bytes)
    check_graph(graph)
    path = path or shortest_delay_paths(graph)
    order = list(order or graph.nodes)
    ranks = [dc for dc in order for _ in range(_hosts(graph, dc))]
    return _ring(graph, size, ranks, path, "ring",
                 f"flat ring over {len(ranks)} ranks, DC order {'>'.join(order)}")


def hierarchical_cost(graph: nx.DiGraph, size_bytes: int, *, order: Sequence[str] | None = None,
                      path: PathFn | None = None) -> SchemeCost:
    """Intra-DC reduce, ring among DC leaders (``order``), intra-DC broadcast (LAN not counted)."""
    size = check_size(size_bytes)
    check_graph(graph)
    path = path or shortest_delay_paths(graph)
    order = list(order or graph.nodes)
    return _ring(graph, size, order, path, "hierarchical", f"leader ring {'>'.join(order)}, LAN phases not counted")


def best_ring_cost(graph: nx.DiGraph, size_bytes: int, *, path: PathFn | None = None) -> SchemeCost:
    """Leader ring in the order with the least predicted time (exhaustive up to 8 DCs, else greedy)."""
    size = check_size(size_bytes)
    check_graph(graph)
    path = cached_path(path or shortest_delay_paths(graph))
    nodes = list(graph.nodes)
    if len(nodes) <= MAX_EXHAUSTIVE_RING:
        orders = ([nodes[0], *rest] for rest in itertools.permutations(nodes[1:]))
    else:
        orders = iter([_greedy_ring(graph, nodes, path)])
    best: SchemeCost | None = None
    for order in orders:
        how = "best order" if len(nodes) <= MAX_EXHAUSTIVE_RING else "greedy order"
        c = _ring(graph, size, order, path, "ring_best", f"leader ring {'>'.join(order)} ({how})")
        if best is None or c.time_s < best.time_s - 1e-12:
            best = c
    assert best is not None
    return best


def _greedy_ring(graph: nx.DiGraph, nodes: list[str], path: PathFn) -> list[str]:
    order = [nodes[0]]
    left = set(nodes[1:])
    while left:
        cur = order[-1]
        nxt = min(sorted(left), key=lambda d: max(8.0 / graph.edges[e]["rate_bps"]
                                                 for e in hop_edges(graph, path, cur, d)))
        order.append(nxt)
        left.remove(nxt)
    return order


def star_cost(graph: nx.DiGraph, size_bytes: int, *, path: PathFn | None = None) -> SchemeCost:
    """Sharded parameter server, one shard per DC, fed by DC leaders (see module docstring)."""
    size = check_size(size_bytes)
    check_graph(graph)
    path = path or shortest_delay_paths(graph)
    nodes = list(graph.nodes)
    n = len(nodes)
    shard = size / n
    push = [(a, b, shard) for a in nodes for b in nodes if a != b]
    flows = push + [(b, a, nb) for a, b, nb in push]  # pull: b's shard back to a
    bw, links = flow_cost(graph, flows, path)
    lat = max((_path_delay(graph, path, a, b) + _path_delay(graph, path, b, a)
               for a in nodes for b in nodes if a != b), default=0.0)
    return SchemeCost("star", bw + lat, bw, lat, links, f"parameter shard in each of {n} DCs, leaders push/pull")


def baselines(graph: nx.DiGraph, size_bytes: int, *, path: PathFn | None = None) -> dict[str, SchemeCost]:
    """All baseline predictions, keyed by scheme name."""
    path = path or shortest_delay_paths(graph)
    return {
        "ring": ring_cost(graph, size_bytes, path=path),
        "ring_best": best_ring_cost(graph, size_bytes, path=path),
        "hierarchical": hierarchical_cost(graph, size_bytes, path=path),
        "star": star_cost(graph, size_bytes, path=path),
    }


#: TCP payload per wire byte at MTU 1500 (what a shaped link carries of a tensor).
PAYLOAD_FRACTION = 1448 / 1514
#: What an unshaped veth LAN carries on the development machine (~12 Gbit/s measured).
UNSHAPED_LAN_BPS = 10e9


def intra_dc_time(graph: nx.DiGraph, size_bytes: int) -> float:
    """Time of the LAN phases around a leader-based plan: reduce to the DC leader, broadcast back.

    The leader of a DC with k hosts receives (k-1) x S on its LAN link, then
    sends (k-1) x S back (one flat reduce and broadcast, as the executor
    does); DCs run these in parallel, so the slowest DC counts.  The LAN
    rate is the node attribute ``lan_rate_bps`` (``Topology.dc_graph`` sets
    it; unshaped LANs count at :data:`UNSHAPED_LAN_BPS`).  BLP's own
    prediction covers the WAN part only; add this for a whole all-reduce.
    """
    worst = 0.0
    for _dc, data in graph.nodes(data=True):
        k = int(data.get("hosts", 1) or 1)
        if k <= 1:
            continue
        rate = float(data.get("lan_rate_bps") or UNSHAPED_LAN_BPS) * PAYLOAD_FRACTION
        worst = max(worst, 2 * (k - 1) * size_bytes * 8 / rate)
    return worst
