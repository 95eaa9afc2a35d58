"""Spanning trees of the DC graph: counting, enumeration, minimum trees, rooting.

A BLP tree's link load does not depend on its root (every tree edge carries
the tree's share once up and once down), so candidate trees are *undirected*
spanning trees of the links usable in both directions; the root (a DC, or a
link whose two ends exchange their sides' partial sums) is chosen afterwards
to minimise the tree's pipeline-fill latency.  Small graphs
(up to a few thousand spanning trees: 6-8 DCs that are not a full mesh) are
enumerated exhaustively, which makes the planner exact there; larger ones
fall back to column generation (:mod:`.solver`), whose pricing step is
:func:`min_spanning_tree`.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

#: An undirected spanning tree, as sorted indices into the list of links.
TreeKey = tuple[int, ...]


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: int, b: int) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        self.parent[ra] = rb
        return True


def count_spanning_trees(nodes: Sequence[str], links: Sequence[tuple[str, str]]) -> int:
    """Number of spanning trees (Kirchhoff's matrix-tree theorem)."""
    n = len(nodes)
    if n <= 1:
        return 1
    idx = {v: i for i, v in enumerate(nodes)}
    import numpy as np  # here, not at import: every `testbed` command loads this module (numpy is slow under TCG)
    lap = np.zeros((n, n))
    for u, v in links:
        a, b = idx[u], idx[v]
        lap[a, a] += 1
        lap[b, b] += 1
        lap[a, b] -= 1
        lap[b, a] -= 1
    return max(0, int(round(float(np.linalg.det(lap[1:, 1:])))))


def enumerate_spanning_trees(nodes: Sequence[str], links: Sequence[tuple[str, str]]) -> list[TreeKey]:
    """Every spanning tree, by include/exclude backtracking over the links.

    Callers bound the work with :func:`count_spanning_trees` first.
    """
    n = len(nodes)
    if n <= 1:
        return [()]
    idx = {v: i for i, v in enumerate(nodes)}
    ends = [(idx[u], idx[v]) for u, v in links]
    m = len(ends)
    out: list[TreeKey] = []

    def connected(chosen: list[int], start: int) -> bool:
        uf = _UnionFind(n)
        comps = n
        for j in chosen:
            comps -= uf.union(*ends[j])
        for j in range(start, m):
            comps -= uf.union(*ends[j])
        return comps == 1

    def rec(i: int, chosen: list[int]) -> None:
        if len(chosen) == n - 1:
            out.append(tuple(chosen))
            return
        if m - i < n - 1 - len(chosen):
            return
        uf = _UnionFind(n)
        for j in chosen:
            uf.union(*ends[j])
        if uf.find(ends[i][0]) != uf.find(ends[i][1]):
            chosen.append(i)
            rec(i + 1, chosen)
            chosen.pop()
        if connected(chosen, i + 1):
            rec(i + 1, chosen)

    if connected([], 0):
        rec(0, [])
    return out


def min_spanning_tree(nodes: Sequence[str], links: Sequence[tuple[str, str]],
                      weights: Sequence[float]) -> TreeKey:
    """Kruskal's minimum spanning tree (ties broken by link order, so results are deterministic)."""
    idx = {v: i for i, v in enumerate(nodes)}
    uf = _UnionFind(len(nodes))
    chosen = []
    for j in sorted(range(len(links)), key=lambda j: (weights[j], j)):
        u, v = links[j]
        if uf.union(idx[u], idx[v]):
            chosen.append(j)
    return tuple(sorted(chosen))


def shortest_path_tree(graph: nx.DiGraph, links: Sequence[tuple[str, str]], root: str) -> TreeKey:
    """Tree of least-delay paths from ``root`` (a low-latency candidate for the pool)."""
    und = nx.Graph()
    und.add_nodes_from(graph.nodes)
    pos = {}
    for j, (u, v) in enumerate(links):
        w = graph.edges[u, v].get("delay_s", 0.0) + graph.edges[v, u].get("delay_s", 0.0) + 1e-9
        und.add_edge(u, v, weight=w)
        pos[frozenset((u, v))] = j
    paths = nx.single_source_dijkstra_path(und, root, weight="weight")
    chosen = set()
    for p in paths.values():
        for a, b in zip(p, p[1:]):
            chosen.add(pos[frozenset((a, b))])
    return tuple(sorted(chosen))


def orient(nodes: Sequence[str], links: Sequence[tuple[str, str]], key: TreeKey, root: str) -> dict[str, str]:
    """Parents (child -> parent) of the undirected tree ``key`` hung from ``root``."""
    adj: dict[str, list[str]] = {v: [] for v in nodes}
    for j in key:
        u, v = links[j]
        adj[u].append(v)
        adj[v].append(u)
    parents: dict[str, str] = {}
    stack = [root]
    seen = {root}
    while stack:
        cur = stack.pop()
        for nb in adj[cur]:
            if nb not in seen:
                seen.add(nb)
                parents[nb] = cur
                stack.append(nb)
    return parents


def _climb(adj: dict[str, list[str]], start: str, hop: dict[tuple[str, str], float],
           blocked: str | None = None) -> tuple[float, float]:
    """Deepest climb to ``start`` and deepest descent from it, over the tree without ``blocked``'s side."""
    up = {start: 0.0}
    down = {start: 0.0}
    stack = [start]
    while stack:
        cur = stack.pop()
        for nb in adj[cur]:
            if nb not in up and nb != blocked:
                up[nb] = up[cur] + hop[(nb, cur)]
                down[nb] = down[cur] + hop[(cur, nb)]
                stack.append(nb)
    return max(up.values()), max(down.values())


def rooted_latency(adj: dict[str, list[str]], root: str, hop: dict[tuple[str, str], float],
                   pair: str | None = None) -> float:
    """Latency term of a tree hung from ``root`` (or from the link ``root``-``pair``).

    Rooted at a DC: deepest climb + deepest descent.  Rooted at a link (see
    :class:`testbed.planning.model.Tree`, ``pair``): each side climbs to its
    end of the link, the two ends exchange their sides' partial sums over it,
    and each descends its own side; the slower side's total counts.
    ``hop[(a, b)]`` is the time one chunk needs from ``a`` to ``b`` (delays and
    per-hop chunk transmission along the route); same quantity as
    :func:`testbed.planning.model.tree_latency`, precomputed for speed.
    """
    if pair is None:
        up, down = _climb(adj, root, hop)
        return up + down
    up_a, down_a = _climb(adj, root, hop, blocked=pair)
    up_b, down_b = _climb(adj, pair, hop, blocked=root)
    at_root = max(up_a, up_b + hop[(pair, root)])
    at_pair = max(up_b, up_a + hop[(root, pair)])
    return max(at_root + down_a, at_pair + down_b)


def best_root(nodes: Sequence[str], links: Sequence[tuple[str, str]], key: TreeKey,
              hop: dict[tuple[str, str], float]) -> tuple[str, str | None, float]:
    """The root (a DC, or a link: ``(root, pair)``) minimising the tree's latency term.

    DCs are tried first, in ``nodes`` order, then the tree's links in link
    order; ties keep the earlier candidate, so a DC root wins a tie with a link.
    """
    adj: dict[str, list[str]] = {v: [] for v in nodes}
    for j in key:
        u, v = links[j]
        adj[u].append(v)
        adj[v].append(u)
    best: tuple[str, str | None, float] = (nodes[0], None, float("inf"))
    candidates: list[tuple[str, str | None]] = [(r, None) for r in nodes]
    candidates += [links[j] for j in key]
    for root, pair in candidates:
        lat = rooted_latency(adj, root, hop, pair)
        if lat < best[2] - 1e-12:
            best = (root, pair, lat)
    return best
