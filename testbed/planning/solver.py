"""The BLP planner: choose aggregation trees and their shares with HiGHS (scipy).

Problem (our reading of BLP, cost model in :mod:`.model`): minimise
``T = T_bw + T_lat`` over shares ``x_k >= 0``, ``sum x_k = 1``, of candidate
spanning trees ``k``, where ``T_bw = max_e (S * sum_k use_ke x_k) / cap_e``
and ``T_lat`` is the largest latency term among trees with ``x_k > 0``.

* LP variant (``scipy.optimize.linprog``, HiGHS).  For a latency budget
  ``L`` the bandwidth part is an LP over the trees whose latency is at most
  ``L``: ``min t  s.t.  S/cap_e * sum_k use_ke x_k <= t,  sum x_k = 1``.
  ``bw(L)`` only falls as ``L`` grows, so ``min_L bw(L) + L`` is found exactly
  over the distinct tree latencies by a branch-and-bound on the sorted
  budgets (an interval whose ends have equal ``bw`` cannot hold a better
  budget, and ``bw(right end) + L(left end)`` bounds its interior).
* MIP variant (``scipy.optimize.milp``).  Shares are integer chunk counts
  ``n_k`` with ``sum n_k = K`` (so every chunk is ``S/K`` bytes).  For the
  few latency budgets with the best LP totals, ``min T_bw`` over integer
  ``n_k`` is solved on a reduced pool (the LP's trees plus the columns of
  least reduced cost); the best total wins.  (A single MIP with a binary
  on/off per tree and ``T_lat >= lat_k y_k`` is the textbook form; its
  relaxation is weak and HiGHS needed the full time limit on 8-DC graphs.)
* Candidate trees.  Graphs with at most ``enum_limit`` spanning trees are
  enumerated (exact).  Bigger ones use column generation on the bandwidth LP:
  the LP duals price each link and the best new tree is a minimum spanning
  tree under those prices (the classic fractional tree-packing pricing used
  by Blink-style planners); latency-aware variants (prices plus a multiple of
  the link delay, shortest-delay trees from every root) are added so the
  budget search has low-latency trees to choose from.  That part is a
  heuristic: the bandwidth optimum is exact, the latency trade-off is over
  the pool.
* ``bandwidth_only=True`` drops the latency term from the objective (no
  budget search: one LP over every candidate tree), which is Blink-style
  tree packing (:func:`testbed.planning.baselines.blink_cost` plans with it);
  the returned plan is still costed with the full model, so what ignoring
  latency costs shows in its ``latency_time_s``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import networkx as nx
import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from traffic_control.errors import ValidationError

from .model import (
    DEFAULT_CHUNK_BYTES,  # noqa: F401 - re-exported (solver.DEFAULT_CHUNK_BYTES)
    PathFn,
    Plan,
    Tree,
    auto_chunks,
    bidirectional_links,
    cached_path,
    capacity_Bps,
    check_graph,
    check_size,
    direct_path,
    evaluate,
    hop_edges,
    pipeline_credit,
)
from .trees import (
    TreeKey,
    best_root,
    count_spanning_trees,
    enumerate_spanning_trees,
    min_spanning_tree,
    orient,
    shortest_path_tree,
)

ENUM_LIMIT = 3000
MAX_CG_ITERATIONS = 400
MIP_POOL = 40
MIP_BUDGETS = 3
MIP_GAP = 5e-3  # 0.5 %: well below the model's own accuracy


@dataclass
class _Problem:
    """Everything the LPs need, precomputed once per planning call."""

    graph: nx.DiGraph
    nodes: list[str]
    links: list[tuple[str, str]]
    rows: list[tuple[str, str]]          # link directions with finite capacity
    link_rows: np.ndarray                # (links, rows): seconds per unit share a tree edge adds
    hop: dict[tuple[str, str], float]    # one chunk's time from a to b (adjacent DCs)
    send: np.ndarray                     # per link: the least time to send one chunk over any of its routes' links
    keys: list[TreeKey]
    roots: list[str]
    pairs: list[str | None]
    lats: list[float]
    cols: list[np.ndarray]

    def add(self, key: TreeKey) -> int | None:
        if key in self._index:
            return None
        root, pair, lat = best_root(self.nodes, self.links, key, self.hop)
        lat -= pipeline_credit(float(self.send[list(key)].min(initial=math.inf)))
        self._index[key] = len(self.keys)
        self.keys.append(key)
        self.roots.append(root)
        self.pairs.append(pair)
        self.lats.append(lat)
        self.cols.append(self.link_rows[list(key)].sum(axis=0) if key else np.zeros(len(self.rows)))
        return self._index[key]

    def __post_init__(self) -> None:
        self._index: dict[TreeKey, int] = {}


@dataclass
class _LPResult:
    t: float
    x: np.ndarray          # over the column subset given
    cols: list[int]
    y: np.ndarray          # row duals (<= 0)
    mu: float


def _build(graph: nx.DiGraph, size: int, chunk_bytes: float, path: PathFn) -> _Problem:
    nodes = list(graph.nodes)
    links = bidirectional_links(graph)
    rows = [(u, v) for u, v in graph.edges if math.isfinite(capacity_Bps(graph, u, v))]
    row_index = {e: i for i, e in enumerate(rows)}
    link_rows = np.zeros((len(links), len(rows)))
    hop: dict[tuple[str, str], float] = {}
    send = np.full(len(links), math.inf)
    for j, (u, v) in enumerate(links):
        for a, b in ((u, v), (v, u)):
            t = 0.0
            for e in hop_edges(graph, path, a, b, "path"):
                cap = capacity_Bps(graph, *e)
                t += graph.edges[e].get("delay_s", 0.0) + chunk_bytes / cap
                send[j] = min(send[j], chunk_bytes / cap)
                if e in row_index:
                    link_rows[j, row_index[e]] += size / cap
            hop[(a, b)] = t
    return _Problem(graph, nodes, links, rows, link_rows, hop, send, [], [], [], [], [])


def _solve_lp(prob: _Problem, cols: list[int]) -> _LPResult:
    """min t s.t. A x - t <= 0, sum x = 1 over the given columns."""
    k = len(cols)
    if not prob.rows:
        x = np.zeros(k)
        x[0] = 1.0
        return _LPResult(0.0, x, cols, np.zeros(0), 0.0)
    a = np.column_stack([prob.cols[c] for c in cols]) if k else np.zeros((len(prob.rows), 0))
    a_ub = np.hstack([a, -np.ones((len(prob.rows), 1))])
    a_eq = np.hstack([np.ones((1, k)), np.zeros((1, 1))])
    c = np.zeros(k + 1)
    c[-1] = 1.0
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(len(prob.rows)), A_eq=a_eq, b_eq=[1.0],
                  bounds=[(0, None)] * (k + 1), method="highs")
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed on the BLP LP: {res.message}")
    x = np.clip(res.x[:k], 0.0, None)
    return _LPResult(float(res.x[-1]), x, cols, np.asarray(res.ineqlin.marginals), float(res.eqlin.marginals[0]))


def _link_prices(prob: _Problem, lp: _LPResult) -> np.ndarray:
    """Each link's reduced-cost weight: sum over the rows it loads of -dual * coefficient."""
    return prob.link_rows @ (-lp.y) if len(lp.y) else np.zeros(len(prob.links))


def _column_generation(prob: _Problem, deadline: float) -> None:
    """Grow the pool until no spanning tree has negative reduced cost (bandwidth LP)."""
    delay = np.array([prob.hop[(u, v)] + prob.hop[(v, u)] for u, v in prob.links])
    caps = np.array([min(capacity_Bps(prob.graph, u, v), capacity_Bps(prob.graph, v, u)) for u, v in prob.links])
    prob.add(min_spanning_tree(prob.nodes, prob.links, list(1.0 / caps)))
    prob.add(min_spanning_tree(prob.nodes, prob.links, list(delay)))
    for r in prob.nodes:
        prob.add(shortest_path_tree(prob.graph, prob.links, r))
    prices = np.zeros(len(prob.links))
    for _ in range(MAX_CG_ITERATIONS):
        lp = _solve_lp(prob, list(range(len(prob.keys))))
        prices = _link_prices(prob, lp)
        key = min_spanning_tree(prob.nodes, prob.links, list(prices))
        reduced = prices[list(key)].sum() - lp.mu
        if reduced >= -1e-9 * max(1.0, lp.t) or prob.add(key) is None or time.monotonic() > deadline:
            break
    # latency-aware trees for the budget search: prices traded against delay
    scale = float(prices.mean() / delay.mean()) if delay.mean() > 0 and prices.mean() > 0 else 1.0
    for lam in (0.03, 0.1, 0.3, 1.0, 3.0, 10.0):
        prob.add(min_spanning_tree(prob.nodes, prob.links, list(prices + lam * scale * delay)))


def _budget_search(prob: _Problem) -> tuple[_LPResult, list[float], dict[int, _LPResult]]:
    """Exact ``min_L bw(L) + L`` over the distinct latencies of the pool (see module doc)."""
    levels = sorted(set(round(v, 12) for v in prob.lats))
    order = sorted(range(len(prob.keys)), key=lambda c: prob.lats[c])
    memo: dict[int, _LPResult] = {}

    def f(i: int) -> _LPResult:
        if i not in memo:
            cols = [c for c in order if round(prob.lats[c], 12) <= levels[i]]
            memo[i] = _solve_lp(prob, cols)
        return memo[i]

    def total(i: int) -> float:
        return f(i).t + levels[i]

    lo, hi = 0, len(levels) - 1
    best = min((lo, hi), key=total)
    stack = [(lo, hi)] if hi - lo > 1 else []
    while stack:
        a, b = stack.pop()
        fa, fb = f(a).t, f(b).t
        if fa - fb <= 1e-12 * max(1.0, fa):
            continue  # bw constant on [a, b]: no interior budget beats a
        if fb + levels[a + 1] >= total(best) - 1e-12:
            continue
        mid = (a + b) // 2
        if total(mid) < total(best):
            best = mid
        if mid - a > 1:
            stack.append((a, mid))
        if b - mid > 1:
            stack.append((mid, b))
    return f(best), levels, memo


def _mip(prob: _Problem, chunks: int, levels: list[float], memo: dict[int, _LPResult],
         time_limit_s: float) -> tuple[dict[int, int], str]:
    """Integer chunk counts for the most promising latency budgets.

    For each of the (up to :data:`MIP_BUDGETS`) budgets with the lowest LP
    total, the trees within budget are cut down to the LP's support plus the
    columns of least reduced cost (:data:`MIP_POOL` in all), and ``milp``
    minimises the bandwidth term over integer chunk counts ``n_k`` with
    ``sum n_k = K``.  The best total (bandwidth + latency of the trees
    actually used) wins.
    """
    ranked = sorted(memo, key=lambda i: memo[i].t + levels[i])[:MIP_BUDGETS]
    per_budget = time_limit_s / len(ranked)
    best: tuple[float, dict[int, int], str] | None = None
    for i in ranked:
        lp = memo[i]
        prices = _link_prices(prob, lp)
        pool = [c for c, x in zip(lp.cols, lp.x) if x > 1e-9]
        for c in sorted(lp.cols, key=lambda c: (prices[list(prob.keys[c])].sum(), prob.lats[c])):
            if len(pool) >= MIP_POOL:
                break
            if c not in pool:
                pool.append(c)
        counts, how = _mip_counts(prob, sorted(pool), chunks, per_budget)
        if counts is None:
            counts, how = _round_shares(lp, chunks), "mip-fallback-rounded-lp"
        load = sum(prob.cols[c] * n for c, n in counts.items()) / chunks
        total = float(load.max(initial=0.0)) + max(prob.lats[c] for c in counts)
        if best is None or total < best[0] - 1e-12:
            best = (total, counts, how)
    assert best is not None
    return best[1], best[2]


def _mip_counts(prob: _Problem, pool: list[int], chunks: int,
                time_limit_s: float) -> tuple[dict[int, int] | None, str]:
    """``min t  s.t.  sum_k A_k n_k / K <= t,  sum_k n_k = K,  n_k in {0..K}`` (HiGHS MIP)."""
    k = len(pool)
    rows = len(prob.rows)
    cons = []
    if rows:
        a = np.zeros((rows, k + 1))
        for j, col in enumerate(pool):
            a[:, j] = prob.cols[col] / chunks
        a[:, k] = -1.0
        cons.append(LinearConstraint(a, -np.inf, 0.0))
    eq = np.zeros((1, k + 1))
    eq[0, :k] = 1.0
    cons.append(LinearConstraint(eq, chunks, chunks))
    c = np.zeros(k + 1)
    c[k] = 1.0
    res = milp(c, constraints=cons, integrality=np.r_[np.ones(k), 0.0],
               bounds=Bounds(np.zeros(k + 1), np.r_[np.full(k, chunks), np.inf]),
               options={"time_limit": max(0.2, time_limit_s), "mip_rel_gap": MIP_GAP})
    if res.x is None:
        return None, "mip-failed"
    counts = {col: int(round(res.x[j])) for j, col in enumerate(pool) if round(res.x[j]) > 0}
    if sum(counts.values()) != chunks:
        return None, "mip-failed"
    return counts, "mip" if res.status == 0 else "mip-time-limit"


def _round_shares(lp: _LPResult, chunks: int) -> dict[int, int]:
    """Largest-remainder rounding of LP shares to chunk counts summing to ``chunks``."""
    raw = {c: x * chunks for c, x in zip(lp.cols, lp.x) if x > 1e-12}
    counts = {c: int(math.floor(v)) for c, v in raw.items()}
    left = chunks - sum(counts.values())
    for c in sorted(raw, key=lambda c: raw[c] - counts[c], reverse=True)[:left]:
        counts[c] += 1
    return {c: n for c, n in counts.items() if n > 0}


def _tree(prob: _Problem, c: int, share: float, chunks: int) -> Tree:
    """Candidate ``c`` as a plan tree, hung from its best root (a DC or a link)."""
    root = prob.roots[c]
    return Tree(root, orient(prob.nodes, prob.links, prob.keys[c], root), share, chunks, pair=prob.pairs[c])


def plan_blp(graph: nx.DiGraph, size_bytes: int, *, chunks: int | None = None, mip: bool = False,
             path: PathFn | None = None, enum_limit: int = ENUM_LIMIT, time_limit_s: float = 10.0,
             bandwidth_only: bool = False) -> Plan:
    """Plan the all-reduce of ``size_bytes`` over the DC graph (one leader per DC).

    ``graph``: DiGraph with one edge per link direction (``rate_bps``,
    ``delay_s``), e.g. ``Topology.dc_graph()``.  ``chunks``: ``K``, the
    number of pipeline chunks of the whole gradient (chunk size ``S/K``; in
    the LP variant a tree with share ``x`` gets ``ceil(x K)`` chunks); by
    default :func:`auto_chunks`.
    ``path(src, dst)``: the DCs traffic between adjacent DCs really crosses
    (default: the direct link; pass ``Topology.path`` to honour routing).
    ``bandwidth_only``: minimise the bandwidth term alone (Blink-style
    packing, see the module docstring); the plan's cost is still the full model.
    Raises :class:`ValidationError` for a disconnected graph or a size <= 0.
    """
    size = check_size(size_bytes)
    if chunks is None:
        chunks = auto_chunks(size)
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValidationError("chunks", f"chunk count must be a positive integer, got {chunks!r}", "give e.g. 64")
    check_graph(graph)
    path = cached_path(path) if path else direct_path
    nodes = list(graph.nodes)
    if len(nodes) == 1:
        tree = Tree(nodes[0], {}, 1.0, 1)
        return Plan(tuple(nodes), size, (tree,), chunks, "trivial", evaluate(graph, [tree], size, path))
    deadline = time.monotonic() + time_limit_s
    chunk_bytes = size / chunks
    prob = _build(graph, size, chunk_bytes, path)
    notes = []
    n_trees = count_spanning_trees(nodes, prob.links)
    if n_trees <= enum_limit:
        for key in enumerate_spanning_trees(nodes, prob.links):
            prob.add(key)
        how = f"all {len(prob.keys)} spanning trees"
    else:
        _column_generation(prob, deadline)
        how = f"column generation: {len(prob.keys)} of {n_trees} spanning trees"
        notes.append("latency trade-off searched over a generated pool (bandwidth term exact)")
    if bandwidth_only:
        levels = sorted(set(round(v, 12) for v in prob.lats))
        memo = {len(levels) - 1: _solve_lp(prob, list(range(len(prob.keys))))}
        best = memo[len(levels) - 1]
        notes.append("bandwidth term only (latency not in the objective)")
    else:
        best, levels, memo = _budget_search(prob)
    if mip:
        counts, solver = _mip(prob, chunks, levels, memo, max(1.0, deadline - time.monotonic()))
        trees = [_tree(prob, c, n / chunks, n) for c, n in sorted(counts.items())]
    else:
        solver = "lp"
        # The budget search ranks budgets by its surrogate bw(L) + L; the plan is costed by the full
        # model (pipeline credit, whole chunks per tree), which can order two budgets differently
        # (measured on four_dc_ring at 8 MB: the surrogate's pick 406.0 ms, the largest budget's,
        # Blink's packing, 405.3 ms).  So every LP the search solved is costed in full, its pick
        # first, and the cheapest kept: BLP is never above a budget it looked at.
        lps = [best] + ([] if bandwidth_only else [lp for _, lp in sorted(memo.items()) if lp is not best])
        trees, cost = [], None
        for lp in lps:
            cand = _lp_trees(prob, lp, chunks)
            c = evaluate(graph, cand, size, path)
            if cost is None or c.time_s < cost.time_s * (1 - 1e-12):
                trees, cost = cand, c
    notes.append(f"candidates: {how}; {len(memo)} LPs solved")
    cost = evaluate(graph, trees, size, path) if mip else cost
    return Plan(tuple(nodes), size, tuple(trees), chunks, solver, cost, tuple(notes))


def _lp_trees(prob: _Problem, lp: _LPResult, chunks: int) -> list[Tree]:
    """An LP solution as plan trees: shares normalised, each tree ``ceil(share x chunks)`` chunks."""
    total = float(sum(x for x in lp.x if x > 1e-9))
    trees = []
    for c, x in zip(lp.cols, lp.x):
        if x > 1e-9:
            share = float(x / total)
            trees.append(_tree(prob, c, share, max(1, math.ceil(share * chunks - 1e-6))))
    return trees
