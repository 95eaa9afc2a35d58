"""The BLP plan: typed trees + shares, its JSON form, its validation and its cost model.

Our reading of BLP (the paper is closed-access; docs/DESIGN.md "Training model"):
the gradient of ``S`` bytes is all-reduced among one *leader* per data
center.  A plan is a set of aggregation trees over the DC graph.  Tree ``k``
is a spanning tree of the DCs rooted at ``root``; it carries the share
``x_k`` of the gradient (a contiguous slice of the flat tensor), cut into
``chunks`` pipelined chunks.  Every chunk is reduced towards the root (a DC
adds its children's partial sums to its own slice and sends the result to its
parent) and the root's total is broadcast back down the same tree.  The trees
run concurrently.

A tree may instead be rooted at a *link* (``pair``: a child of ``root``):
the root's side and the pair's subtree each reduce towards their end of the
link, the two ends exchange their sides' partial sums over it (``A`` one way,
``B`` the other, the same bytes a DC root's reduce and broadcast put on that
link), both add (``A + B`` at one end, ``B + A`` at the other: IEEE addition
is commutative, so every DC still ends with bit-identical sums) and each
broadcasts down its own side.  The planner picks whichever rooting has the
lower latency term; on two DCs the link root is the direct exchange, which
needs one crossing of the link where a DC root needs two.

Cost model (the one the planner minimises and reports):

* Load.  In tree ``k`` every tree edge ``{u, v}`` (``v`` the parent) carries
  ``x_k * S`` bytes child->parent (reduce) and ``x_k * S`` parent->child
  (broadcast).  Traffic between two DCs follows ``path(u, v)`` (the direct
  link by default; a topology with pinned routes may relay it), so the load
  of a link direction ``e`` is the sum over trees and tree edges whose path
  crosses ``e``.
* Bandwidth term ``T_bw = max_e load_e / cap_e`` (``cap_e`` = rate in
  bytes/s): with pipelined chunks all trees stream concurrently and the most
  loaded link direction, relative to its capacity, finishes last (fluid
  model, as in Blink's tree packing).
* Latency / pipeline-fill term ``T_lat = max over used trees of
  (max_v up_k(v) + max_v down_k(v))``, where ``up_k(v)`` sums, over the hops
  from ``v`` to the root, the one-way delay plus the time to send one chunk at
  that hop's rate, and ``down_k(v)`` the same from the root down to ``v``:
  the last chunk cannot be complete everywhere before it has climbed the
  deepest branch and come down again.  For a link root: each side's deepest
  climb to its end, the crossing of the link (the other side's climb plus
  one hop, whichever is later), then that side's deepest descent; the slower
  side counts.  The bottleneck's transmission of the last chunk is also in
  ``T_bw``, so one chunk time comes off (:func:`pipeline_credit`): the
  fastest link's, which keeps the term an upper bound and is exact on one link.
* ``T = T_bw + T_lat``.  LAN phases (intra-DC reduce/broadcast) and compute
  are not modelled; TCP effects (slow start, loss) are not modelled.
* TCP/IP overhead: a shaped link of ``rate_bps`` carries tensor payload at
  ``rate_bps * PAYLOAD_FRACTION`` (1448 payload bytes per 1514-byte frame at
  MTU 1500, the figure the shaping benchmarks measure goodput against).
  :func:`capacity_Bps` is the one place that applies it; every scheme's
  prediction (BLP, its baselines, the solver's LP) goes through it, so the
  numbers stay comparable and match what the executors can move.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import networkx as nx
from pydantic import Field

from traffic_control.errors import ValidationError
from traffic_control.fields import SpecModel, unit_field, validate
from traffic_control.shape import DEFAULT_MTU, tcp_payload_fraction

from .trees import rooted_latency

#: A route: ``path(src, dst)`` is the list of DCs traffic from ``src`` to ``dst`` crosses.
PathFn = Callable[[str, str], Sequence[str]]

FORMAT = "blp-plan/1"
SHARE_TOLERANCE = 1e-6

#: Target chunk size when the chunk count is not given: small enough that the
#: store-and-forward fill of a chunk on a 100 Mbit/s hop (~21 ms) is of the order
#: of WAN delays, large enough that per-message overhead stays negligible.
DEFAULT_CHUNK_BYTES = 256 * 1024
MAX_AUTO_CHUNKS = 4096


def auto_chunks(size_bytes: int) -> int:
    """Default ``K``: chunks of about :data:`DEFAULT_CHUNK_BYTES`, at least 1, at most 4096.

    Every chunked scheme (BLP and the chunked baselines) cuts the gradient
    with the same ``K``, so their pipeline-fill terms are comparable.
    """
    return max(1, min(MAX_AUTO_CHUNKS, round(size_bytes / DEFAULT_CHUNK_BYTES)))


def direct_path(src: str, dst: str) -> list[str]:
    """The default route for tree edges: the direct link between adjacent DCs."""
    return [src, dst]


def cached_path(path: PathFn) -> PathFn:
    """Memoise a route function (``Topology.path`` recomputes the graph on every call)."""
    table: dict[tuple[str, str], list[str]] = {}

    def lookup(src: str, dst: str) -> list[str]:
        if (src, dst) not in table:
            table[(src, dst)] = list(path(src, dst))
        return table[(src, dst)]

    return lookup


# ------------------------------------------------------------------ graph checks
def check_size(size_bytes: object, field_name: str = "size") -> int:
    """A positive whole number of bytes, else :class:`ValidationError`."""
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, (int, float)):
        raise ValidationError(field_name, f"expected a number of bytes, got {size_bytes!r}", "give e.g. 100MB")
    if not math.isfinite(float(size_bytes)) or size_bytes <= 0:
        raise ValidationError(field_name, f"gradient size must be positive, got {size_bytes!r}",
                              "give the gradient size in bytes, e.g. 100MB")
    return int(size_bytes)


def check_graph(graph: nx.DiGraph, field_name: str = "topology") -> None:
    """Reject graphs the planner cannot use: empty, bad link attributes, disconnected.

    Trees need both directions of a link (reduce goes up, broadcast comes
    down), so connectivity is checked on the links present in both directions.
    """
    if graph.number_of_nodes() == 0:
        raise ValidationError(f"{field_name}.dcs", "the DC graph has no data centers", "add at least one DC")
    for u, v, d in graph.edges(data=True):
        rate = d.get("rate_bps")
        delay = d.get("delay_s", 0.0)
        if not isinstance(rate, (int, float)) or not rate > 0:
            raise ValidationError(f"{field_name}.links[{u}->{v}].rate_bps", f"rate must be positive, got {rate!r}",
                                  "give every link direction a rate, e.g. 100Mbit")
        if not isinstance(delay, (int, float)) or not math.isfinite(delay) or delay < 0:
            raise ValidationError(f"{field_name}.links[{u}->{v}].delay_s",
                                  f"delay must be finite and >= 0, got {delay!r}", "give e.g. 10ms")
    if graph.number_of_nodes() == 1:
        return
    und = nx.Graph()
    und.add_nodes_from(graph.nodes)
    und.add_edges_from((u, v) for u, v in graph.edges if graph.has_edge(v, u))
    if not nx.is_connected(und):
        parts = sorted(sorted(c) for c in nx.connected_components(und))
        raise ValidationError(f"{field_name}.links", f"the DC graph is disconnected: {parts}",
                              "add links (usable in both directions) so every DC reaches every other")


def bidirectional_links(graph: nx.DiGraph) -> list[tuple[str, str]]:
    """Undirected links (each once, in graph node order) present in both directions."""
    index = {n: i for i, n in enumerate(graph.nodes)}
    out = []
    for u, v in graph.edges:
        if index[u] < index[v] and graph.has_edge(v, u):
            out.append((u, v))
    return sorted(out, key=lambda e: (index[e[0]], index[e[1]]))


#: TCP payload per wire byte at MTU 1500 (what a shaped link carries of a tensor);
#: the same figure as ``testbed.network.measure.TCP_PAYLOAD_FRACTION`` (a test checks it).
PAYLOAD_FRACTION = tcp_payload_fraction(DEFAULT_MTU)


def payload_Bps(rate_bps: float, mtu: int = DEFAULT_MTU) -> float:
    """Tensor bytes/s a link shaped to ``rate_bps`` (wire bits/s) with ``mtu`` carries: TCP/IP headers off."""
    return float(rate_bps) / 8.0 * tcp_payload_fraction(mtu)


def capacity_Bps(graph: nx.DiGraph, u: str, v: str) -> float:
    """Payload capacity of the link direction u->v in bytes/s (inf when unshaped); see :func:`payload_Bps`.

    Flows that cross the link start on a LAN: the MSS is set by the smaller of the link's MTU and the
    end DCs' LAN MTUs (the edge's ``mtu``, from :meth:`Topology.dc_graph`)."""
    e = graph.edges[u, v]
    return payload_Bps(e["rate_bps"], int(e.get("mtu", DEFAULT_MTU)))


def link_loads(graph: nx.DiGraph, loads: Mapping[tuple[str, str], float]) -> tuple[LinkLoad, ...]:
    """Every link direction of ``graph`` with its payload bytes and the time its capacity needs for them."""
    out = []
    for (u, v) in graph.edges:
        b = loads.get((u, v), 0.0)
        out.append(LinkLoad(u, v, b, float(graph.edges[u, v]["rate_bps"]), b / capacity_Bps(graph, u, v) if b else 0.0))
    return tuple(out)


def hop_edges(graph: nx.DiGraph, path: PathFn, src: str, dst: str, field_name: str = "route") -> list[tuple[str, str]]:
    """Link directions crossed by traffic src->dst, checked to exist."""
    p = list(path(src, dst))
    if len(p) < 2 or p[0] != src or p[-1] != dst:
        raise ValidationError(field_name, f"route {src}->{dst} is {p}", "routes must start at src and end at dst")
    hops = list(zip(p, p[1:]))
    for a, b in hops:
        if not graph.has_edge(a, b):
            raise ValidationError(field_name, f"route {src}->{dst} uses link {a}->{b}, which the topology lacks",
                                  "route only over existing links")
    return hops


# ------------------------------------------------------------------ plan types
@dataclass(frozen=True)
class Tree:
    """One aggregation tree: ``parents`` maps every non-root DC to its parent.

    ``pair``: when set (a child of ``root``), the tree is rooted at the link
    ``root``-``pair`` rather than at ``root`` (module docstring): ``pair``'s
    subtree reduces towards ``pair``, the rest towards ``root``, and the two
    exchange their partial sums over the link.
    """

    root: str
    parents: Mapping[str, str]
    share: float
    chunks: int = 1
    pair: str | None = None

    @property
    def edges(self) -> list[tuple[str, str]]:
        """Tree edges as (child, parent)."""
        return sorted(self.parents.items())

    def children(self) -> dict[str, list[str]]:
        """DC -> its children, every DC of the tree present (leaves map to [])."""
        kids: dict[str, list[str]] = {self.root: []}
        for c in self.parents:
            kids.setdefault(c, [])
        for c, p in sorted(self.parents.items()):
            kids.setdefault(p, []).append(c)
        return kids

    def path_to_root(self, dc: str) -> list[str]:
        out = [dc]
        while out[-1] != self.root:
            out.append(self.parents[out[-1]])
            if len(out) > len(self.parents) + 1:
                raise ValueError("cycle")
        return out

    def side(self, dc: str) -> str:
        """The DC whose total ``dc`` receives: ``root``, or ``pair`` for a DC in the pair's subtree."""
        if self.pair is not None and self.pair in self.path_to_root(dc):
            return self.pair
        return self.root

    def label(self) -> str:
        """``root``, or ``root<>pair`` for a link root."""
        return self.root if self.pair is None else f"{self.root}<>{self.pair}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"root": self.root, "parents": dict(sorted(self.parents.items())),
                               "share": self.share, "chunks": self.chunks}
        if self.pair is not None:
            out["pair"] = self.pair
        return out


@dataclass(frozen=True)
class LinkLoad:
    """Bytes one link direction carries for one all-reduce, and the time that takes."""

    src: str
    dst: str
    bytes: float
    rate_bps: float
    time_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "bytes": self.bytes,
                "rate_bps": self.rate_bps, "time_s": self.time_s}


@dataclass(frozen=True)
class PlanCost:
    """The model's prediction for a set of trees on a graph (see the module docstring)."""

    bandwidth_time_s: float
    latency_time_s: float
    tree_latency_s: tuple[float, ...]
    links: tuple[LinkLoad, ...]

    @property
    def time_s(self) -> float:
        return self.bandwidth_time_s + self.latency_time_s

    @property
    def bottleneck(self) -> LinkLoad | None:
        return max(self.links, key=lambda ll: ll.time_s, default=None)


@dataclass(frozen=True)
class Plan:
    """A BLP plan for all-reducing ``size_bytes`` among the leaders of ``dcs``."""

    dcs: tuple[str, ...]
    size_bytes: int
    trees: tuple[Tree, ...]
    chunks: int
    solver: str
    cost: PlanCost
    notes: tuple[str, ...] = field(default=())

    @property
    def predicted_time_s(self) -> float:
        return self.cost.time_s

    def link_bytes(self) -> dict[tuple[str, str], float]:
        return {(ll.src, ll.dst): ll.bytes for ll in self.cost.links}

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "dcs": list(self.dcs),
            "size_bytes": self.size_bytes,
            "chunks": self.chunks,
            "solver": self.solver,
            "predicted_time_s": self.cost.time_s,
            "bandwidth_time_s": self.cost.bandwidth_time_s,
            "latency_time_s": self.cost.latency_time_s,
            "trees": [dict(t.to_dict(), latency_s=lat) for t, lat in zip(self.trees, self.cost.tree_latency_s)],
            "links": [ll.to_dict() for ll in self.cost.links],
            "notes": list(self.notes),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @staticmethod
    def from_dict(data: Any, field_name: str = "plan") -> Plan:
        """Parse the JSON form; structural errors name the field.  Costs are read back as stored.

        Call :func:`validate_plan` (and :func:`evaluate`) against a graph before
        running a plan read from a file.
        """
        return _plan_from_dict(data, field_name)

    @staticmethod
    def from_json(text: str, field_name: str = "plan") -> Plan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValidationError(field_name, f"not valid JSON: {e}", "give a file written by `testbed blp-plan --json`") from e
        return _plan_from_dict(data, field_name)


_Finite = Annotated[float, Field(allow_inf_nan=False)]


class TreeSpec(SpecModel):
    """One aggregation tree of a plan file."""

    root: str = unit_field(..., fix="name the root DC")
    parents: dict[str, str] = unit_field(default_factory=dict, fix='write e.g. {"west": "central"}')
    """child DC -> parent DC, for every DC but the root"""
    share: _Finite = unit_field(..., ge=0, fix="the fraction of the gradient this tree carries")
    chunks: int = unit_field(1, ge=1, fix="write an integer >= 1")
    pair: str | None = unit_field(None, fix="name a child of the root (the link root's other end), or leave it out")
    """root the tree at the link root-pair instead of at root (a child of root)"""
    latency_s: float = 0.0
    """as written by blp-plan (informational)"""


class LinkLoadSpec(SpecModel):
    src: str
    dst: str
    bytes: _Finite = unit_field(0.0, ge=0)
    rate_bps: float = unit_field(math.inf, ge=0)
    time_s: _Finite = unit_field(0.0, ge=0)


class PlanSpec(SpecModel):
    """A plan file as ``testbed blp-plan --json`` writes it (and pgcs's ``plan:`` takes inline)."""

    format: Literal[FORMAT] = unit_field(FORMAT, fix=f"expected {FORMAT!r}")  # type: ignore[valid-type]
    dcs: list[str] = unit_field(..., min_length=1, fix="list every DC")
    size_bytes: _Finite = unit_field(..., gt=0, fix="give the gradient size in bytes, e.g. 100MB")
    chunks: int = unit_field(1, ge=1, fix="write an integer >= 1")
    solver: str = "file"
    predicted_time_s: float | None = None
    bandwidth_time_s: float = 0.0
    latency_time_s: float = 0.0
    trees: list[TreeSpec] = unit_field(..., min_length=1, fix="give at least one tree")
    links: list[LinkLoadSpec] = unit_field(default_factory=list)
    notes: list[str] = unit_field(default_factory=list)


def _plan_from_dict(data: Any, f: str) -> Plan:
    if not isinstance(data, dict):
        raise ValidationError(f, f"expected a JSON object, got {type(data).__name__}", "give a plan written by blp-plan")
    if "plan" in data and "trees" not in data and isinstance(data["plan"], dict):
        data = data["plan"]  # the CLI's --json output wraps the plan with the baselines
    m = validate(PlanSpec, data, f)
    trees = tuple(Tree(root=t.root, parents=dict(t.parents), share=float(t.share), chunks=t.chunks, pair=t.pair)
                  for t in m.trees)
    links = tuple(LinkLoad(ll.src, ll.dst, float(ll.bytes), float(ll.rate_bps), float(ll.time_s)) for ll in m.links)
    cost = PlanCost(float(m.bandwidth_time_s), float(m.latency_time_s), tuple(float(t.latency_s) for t in m.trees),
                    links)
    return Plan(dcs=tuple(m.dcs), size_bytes=int(m.size_bytes), trees=trees, chunks=m.chunks, solver=m.solver,
                cost=cost, notes=tuple(m.notes))


# ------------------------------------------------------------------ validation
def validate_plan(plan: Plan, graph: nx.DiGraph, field_name: str = "plan") -> None:
    """Check that ``plan`` can run on ``graph``; raise :class:`ValidationError` naming the field.

    Every tree spans exactly the graph's DCs, every tree edge is a link the
    graph has in both directions, parents lead to the root without cycles,
    shares are >= 0 and sum to 1, and every tree carrying data has >= 1 chunk.
    """
    f = field_name
    nodes = set(graph.nodes)
    if set(plan.dcs) != nodes or len(plan.dcs) != len(nodes):
        missing = sorted(nodes - set(plan.dcs))
        extra = sorted(set(plan.dcs) - nodes)
        raise ValidationError(f"{f}.dcs", f"plan DCs differ from the topology's (missing {missing}, unknown {extra})",
                              "make the plan for this topology: testbed blp-plan TOPOLOGY")
    if not plan.trees:
        raise ValidationError(f"{f}.trees", "the plan has no trees", "give at least one tree")
    total = 0.0
    for i, t in enumerate(plan.trees):
        tf = f"{f}.trees[{i}]"
        if t.root not in nodes:
            raise ValidationError(f"{tf}.root", f"root {t.root!r} is not a DC of the topology",
                                  f"use one of {sorted(nodes)}")
        if t.root in t.parents:
            raise ValidationError(f"{tf}.parents.{t.root}", "the root has a parent", "remove the root from parents")
        want = nodes - {t.root}
        if set(t.parents) != want:
            missing = sorted(want - set(t.parents))
            extra = sorted(set(t.parents) - want)
            raise ValidationError(f"{tf}.parents", f"tree does not span the DCs (missing {missing}, unknown {extra})",
                                  "give every DC except the root exactly one parent")
        for child, parent in sorted(t.parents.items()):
            if parent not in nodes:
                raise ValidationError(f"{tf}.parents.{child}", f"parent {parent!r} is not a DC of the topology",
                                      f"use one of {sorted(nodes)}")
            for a, b in ((child, parent), (parent, child)):
                if not graph.has_edge(a, b):
                    raise ValidationError(f"{tf}.parents.{child}",
                                          f"tree edge {child}-{parent} needs link {a}->{b}, which the topology lacks",
                                          "use only links of the topology (relay through intermediate DCs)")
        for dc in t.parents:
            seen = {dc}
            cur = dc
            while cur != t.root:
                cur = t.parents[cur]
                if cur in seen:
                    raise ValidationError(f"{tf}.parents.{dc}", f"parents form a cycle through {cur!r}",
                                          "every DC's parent chain must end at the root")
                seen.add(cur)
        if t.pair is not None and t.parents.get(t.pair) != t.root:
            raise ValidationError(f"{tf}.pair", f"pair {t.pair!r} is not a child of the root {t.root!r}",
                                  "name a DC whose parent is the root (the link root's other end), or drop pair")
        if not (t.share >= 0 and math.isfinite(t.share)):
            raise ValidationError(f"{tf}.share", f"share must be >= 0, got {t.share!r}", "give a fraction in [0, 1]")
        if t.share > 0 and t.chunks < 1:
            raise ValidationError(f"{tf}.chunks", f"a tree carrying data needs >= 1 chunk, got {t.chunks}",
                                  "give a positive chunk count")
        total += t.share
    if abs(total - 1.0) > SHARE_TOLERANCE:
        raise ValidationError(f"{f}.trees", f"shares sum to {total:.9g}, not 1", "scale the shares so they sum to 1")


def route_mismatches(plan: Plan, path: PathFn) -> list[str]:
    """Tree edges whose traffic the network would not send over the direct link.

    The planner assumes leader(u)->leader(v) traffic for a tree edge takes the
    direct link unless told the routes; a topology whose routing (shortest
    delay, or pinned routes) relays it instead breaks that assumption.  Plan
    with ``path=topology.path`` to model the real routes.
    """
    out = []
    for i, t in enumerate(plan.trees):
        for c, p in t.edges:
            for a, b in ((c, p), (p, c)):
                route = list(path(a, b))
                if route != [a, b]:
                    out.append(f"trees[{i}] edge {a}->{b} is routed via {'->'.join(route)}")
    return out


# ------------------------------------------------------------------ cost model
def tree_latency(graph: nx.DiGraph, tree: Tree, chunk_bytes: float, path: PathFn = direct_path) -> float:
    """Pipeline-fill term of one tree: deepest climb plus deepest descent of one chunk (module docstring)."""
    if not tree.parents:
        return 0.0
    adj: dict[str, list[str]] = {v: [] for v in [tree.root, *tree.parents]}
    hop: dict[tuple[str, str], float] = {}
    fastest = math.inf
    for c, p in tree.parents.items():
        adj[c].append(p)
        adj[p].append(c)
        for a, b in ((c, p), (p, c)):
            t = 0.0
            for x, y in hop_edges(graph, path, a, b):
                send = chunk_bytes / capacity_Bps(graph, x, y)
                t += graph.edges[x, y].get("delay_s", 0.0) + send
                fastest = min(fastest, send)
            hop[(a, b)] = t
    return rooted_latency(adj, tree.root, hop, tree.pair) - pipeline_credit(fastest)


def pipeline_credit(fastest_send_s: float) -> float:
    """What a pipelined chunk stream's fill term gives back: one chunk's send on the tree's fastest link.

    A stream of ``K`` chunks through hops of rates ``B_h`` and delays ``d_h``
    delivers its last chunk at ``sum_h (d_h + c/B_h) + (K-1) c/B_min``; the
    bandwidth term already holds ``K c/B_min``, so the fill is the chain's
    chunk trip less one chunk time of its slowest hop.  The chain is not
    tracked, so the credit is the fastest hop's chunk time, which never
    exceeds the slowest's: the term stays an upper bound, exact on one link.
    """
    return fastest_send_s if math.isfinite(fastest_send_s) else 0.0


def tree_link_use(graph: nx.DiGraph, tree: Tree | Iterable[tuple[str, str]],
                  path: PathFn = direct_path) -> dict[tuple[str, str], int]:
    """How many times one unit of the tree's share crosses each link direction."""
    edges = tree.edges if isinstance(tree, Tree) else list(tree)
    use: dict[tuple[str, str], int] = {}
    for c, p in edges:
        for a, b in ((c, p), (p, c)):
            for e in hop_edges(graph, path, a, b):
                use[e] = use.get(e, 0) + 1
    return use


def evaluate(graph: nx.DiGraph, trees: Sequence[Tree], size_bytes: int, path: PathFn = direct_path) -> PlanCost:
    """The model's prediction for ``trees`` (see module docstring); trees with share 0 cost nothing."""
    loads: dict[tuple[str, str], float] = {}
    lats = []
    for t in trees:
        if t.share <= 0:
            lats.append(0.0)
            continue
        for e, n in tree_link_use(graph, t, path).items():
            loads[e] = loads.get(e, 0.0) + n * t.share * size_bytes
        lats.append(tree_latency(graph, t, t.share * size_bytes / max(t.chunks, 1), path))
    links = link_loads(graph, loads)
    bw = max((ll.time_s for ll in links), default=0.0)
    return PlanCost(bw, max(lats, default=0.0), tuple(lats), links)
