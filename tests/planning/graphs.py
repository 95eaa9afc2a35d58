"""Graph builders shared by the planning tests (DiGraphs like ``Topology.dc_graph()``)."""

from __future__ import annotations

import itertools
import random

import networkx as nx

from testbed.planning.model import PAYLOAD_FRACTION

GBIT = 1e9
MBIT = 1e6


def Bps(rate_bps: float) -> float:
    """Payload bytes/s of a link shaped to ``rate_bps``: what every cost model divides by."""
    return rate_bps / 8 * PAYLOAD_FRACTION


def build(links: list[tuple[str, str, float, float]], nodes: list[str] | None = None) -> nx.DiGraph:
    """Symmetric links (a, b, rate bit/s, one-way delay s)."""
    g = nx.DiGraph()
    g.add_nodes_from(nodes or [])
    for a, b, rate, delay in links:
        g.add_edge(a, b, rate_bps=rate, delay_s=delay)
        g.add_edge(b, a, rate_bps=rate, delay_s=delay)
    return g


def mesh(n: int, rate: float = GBIT, delay: float = 0.0) -> nx.DiGraph:
    return build([(f"d{i}", f"d{j}", rate, delay) for i, j in itertools.combinations(range(n), 2)])


def chain(n: int, rate: float = GBIT, delay: float = 0.0) -> nx.DiGraph:
    return build([(f"d{i}", f"d{i + 1}", rate, delay) for i in range(n - 1)])


def triangle(delay: float = 0.01) -> nx.DiGraph:
    """1 Gbit/s, 1 Gbit/s and one slow 100 Mbit/s link (a-c)."""
    return build([("a", "b", GBIT, delay), ("b", "c", GBIT, delay), ("a", "c", 100 * MBIT, delay)])


def random_wan(n: int, extra: int, seed: int) -> nx.DiGraph:
    """Connected random graph: a random spanning tree plus ``extra`` chords, geo-like rates/delays."""
    rng = random.Random(seed)
    names = [f"r{i}" for i in range(n)]
    links = []
    for i in range(1, n):
        links.append((names[i], names[rng.randrange(i)]))
    pairs = [p for p in itertools.combinations(names, 2) if p not in links and p[::-1] not in links]
    links += rng.sample(pairs, min(extra, len(pairs)))
    return build([(a, b, rng.choice([0.1, 0.36, 0.8, 1.1]) * GBIT, rng.uniform(0.005, 0.115)) for a, b in links])
