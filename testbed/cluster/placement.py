"""Which server holds which DC.

A DC is never split: its hosts share a LAN, and a LAN across servers would put LAN traffic on a tunnel.
What a server carries is counted in emulated nodes (a DC's hosts, its router, the parameter-server host where
there is one), since on a shared machine each node's processes take their share of its cores.

Automatic placement minimizes, in this order:

1. the largest load of any server per free core (the emulation's fidelity is bounded by its busiest machine; a
   server's cores are ``servers[].cpus``, or measured, less what other jobs use of them, :mod:`.capacity`;
   where any server's are unknown, every server counts as one core, so loads are compared in nodes);
2. the number of WAN links between servers (each becomes a tunnel, with its encapsulation overhead);
3. the bandwidth of those links (a slow link cut costs less than a fast one);

subject to each server's ``max_hosts`` and ``gpus``.  The search is exact (depth-first with bounds, servers
of equal capacity taken as interchangeable) up to :data:`SEARCH_LIMIT` partial assignments, which covers
every bundled topology many times over; past it the best placement found so far is returned and marked not
proven optimal.  A given placement is checked against the same limits and reported the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from topologies.model import Topology
from traffic_control.errors import ValidationError

from .model import Cluster, Server

SEARCH_LIMIT = 200_000


def dc_nodes(topo: Topology) -> dict[str, int]:
    """Emulated nodes per DC: hosts, the router, and the parameter-server host in the PS's DC."""
    return {d.name: d.hosts + 1 + (1 if topo.ps == d.name else 0) for d in topo.dcs}


def dc_gpus(topo: Topology) -> dict[str, int]:
    """GPUs a DC's hosts ask for (a count per host x hosts; with indices, one past the highest index)."""
    out: dict[str, int] = {}
    for d in topo.dcs:
        if d.gpus is None:
            out[d.name] = 0
        elif isinstance(d.gpus, int):
            out[d.name] = d.gpus * d.hosts
        else:
            out[d.name] = max(d.gpus) + 1 if d.hosts else 0
    return out


@dataclass(frozen=True)
class Placement:
    """DC -> server, with what it costs."""

    assignment: dict[str, str]
    loads: dict[str, int]  # server -> emulated nodes
    cut: tuple[tuple[str, str], ...]  # WAN links whose DCs are on different servers (tunnels)
    cut_rate_bps: float
    automatic: bool
    optimal: bool = True
    searched: int = 0
    gpus: dict[str, int] = field(default_factory=dict)  # server -> GPUs asked for
    cpus: dict[str, int] = field(default_factory=dict)  # server -> its cores (all known, else empty)
    free: dict[str, float] = field(default_factory=dict)  # server -> the cores the loads were weighed by

    def per_core(self, server: str) -> float | None:
        """Nodes per free core (the cores less other jobs' use, where measured)."""
        return self.loads[server] / self.free[server] if server in self.free else None

    def dcs_on(self, server: str) -> list[str]:
        return [dc for dc, s in self.assignment.items() if s == server]

    def to_dict(self) -> dict[str, Any]:
        return {"assignment": dict(self.assignment), "loads": dict(self.loads), "gpus": dict(self.gpus),
                "tunnels": [list(c) for c in self.cut], "tunnel_rate_bps": self.cut_rate_bps,
                "automatic": self.automatic, "optimal": self.optimal, "searched": self.searched,
                "cpus": dict(self.cpus), "free_cpus": dict(self.free),
                "nodes_per_core": {s: self.per_core(s) for s in self.free}}


def cores(cluster: Cluster) -> dict[str, int]:
    """Every server's cores when all are known (given or measured), else {} (loads compared in nodes)."""
    if any(s.cpus is None for s in cluster.servers):
        return {}
    return {s.name: int(s.cpus) for s in cluster.servers if s.cpus is not None}


def free_cores(cluster: Cluster) -> dict[str, Fraction]:
    """What each server is weighed by: its cores less other jobs' use (``Server.free``), when every server's
    cores are known, else {}."""
    if not cores(cluster):
        return {}
    return {s.name: Fraction(str(s.free)) for s in cluster.servers}


def gpu_fits(server: Server, used: int, topo: Topology) -> bool:
    return server.gpus is None or topo.gpu_sharing or used <= server.gpus


def _result(topo: Topology, cluster: Cluster, assignment: dict[str, str], automatic: bool, optimal: bool,
            searched: int) -> Placement:
    nodes, gpus = dc_nodes(topo), dc_gpus(topo)
    loads = {s: 0 for s in cluster.names}
    used = {s: 0 for s in cluster.names}
    for dc, s in assignment.items():
        loads[s] += nodes[dc]
        used[s] += gpus[dc]
    cut = tuple((lk.a, lk.b) for lk in topo.links if assignment[lk.a] != assignment[lk.b])
    rate = sum(lk.forward.rate_bps + lk.reverse.rate_bps for lk in topo.links if assignment[lk.a] != assignment[lk.b])
    ordered = {d.name: assignment[d.name] for d in topo.dcs}
    return Placement(ordered, loads, cut, rate, automatic, optimal, searched, used, cores(cluster),
                     {s: float(v) for s, v in free_cores(cluster).items()})


def _check_given(topo: Topology, cluster: Cluster, given: dict[str, str]) -> dict[str, str]:
    names = set(topo.dc_names)
    for dc in given:
        if dc not in names:
            raise ValidationError(f"placement.{dc}", f"no data center named {dc!r} in topology {topo.name!r}",
                                  f"place its DCs: {', '.join(topo.dc_names)}")
    missing = [dc for dc in topo.dc_names if dc not in given]
    if missing:
        raise ValidationError("placement", f"DC(s) {', '.join(missing)} of topology {topo.name!r} have no server",
                              "name a server for every DC, or write placement: auto")
    nodes, gpus = dc_nodes(topo), dc_gpus(topo)
    for s in cluster.servers:
        mine = [dc for dc in topo.dc_names if given[dc] == s.name]
        load = sum(nodes[dc] for dc in mine)
        if s.max_hosts is not None and load > s.max_hosts:
            raise ValidationError(f"placement.{mine[-1]}", f"server {s.name!r} would hold {load} emulated nodes "
                                  f"({', '.join(f'{dc}: {nodes[dc]}' for dc in mine)}), over its max_hosts "
                                  f"{s.max_hosts}", "move a DC to another server, or raise max_hosts")
        want = sum(gpus[dc] for dc in mine)
        if not gpu_fits(s, want, topo):
            raise ValidationError(f"placement.{mine[-1]}", f"server {s.name!r} has {s.gpus} GPUs; its DCs ask for "
                                  f"{want}", "move a DC to another server, lower gpus:, or set gpu_sharing: true")
    return given


def _search(topo: Topology, cluster: Cluster) -> tuple[dict[str, str] | None, bool, int]:
    nodes, gpus = dc_nodes(topo), dc_gpus(topo)
    order = sorted(topo.dc_names, key=lambda dc: (-nodes[dc], topo.dc_names.index(dc)))
    servers = list(cluster.servers)
    cap = free_cores(cluster) or {s.name: Fraction(1) for s in servers}
    neighbours: dict[str, list[tuple[str, float]]] = {dc: [] for dc in order}
    for lk in topo.links:
        r = lk.forward.rate_bps + lk.reverse.rate_bps
        neighbours[lk.a].append((lk.b, r))
        neighbours[lk.b].append((lk.a, r))
    best: list[Any] = [None, None]  # cost, assignment
    count = [0]
    load = {s.name: 0 for s in servers}
    used = {s.name: 0 for s in servers}
    assign: dict[str, str] = {}

    def walk(i: int, cut_n: int, cut_r: float) -> bool:
        count[0] += 1
        if count[0] > SEARCH_LIMIT:
            return False
        peak = max(Fraction(load[n], cap[n]) for n in load)
        if best[0] is not None and (peak, cut_n, cut_r) >= best[0]:
            return True
        if i == len(order):
            best[0], best[1] = (peak, cut_n, cut_r), dict(assign)
            return True
        dc = order[i]
        tried_empty: set[tuple[Any, ...]] = set()
        # servers already holding a neighbour first: good placements are found early, bounds prune sooner
        ranked = sorted(servers, key=lambda s: (-sum(r for n, r in neighbours[dc] if assign.get(n) == s.name),
                                                Fraction(load[s.name] + nodes[dc], cap[s.name]),
                                                servers.index(s)))
        for s in ranked:
            if load[s.name] == 0 and used[s.name] == 0:
                kind = (s.max_hosts, s.gpus, cap[s.name])
                if kind in tried_empty:
                    continue  # an empty server like one tried already: the same placement, renamed
                tried_empty.add(kind)
            if s.max_hosts is not None and load[s.name] + nodes[dc] > s.max_hosts:
                continue
            if not gpu_fits(s, used[s.name] + gpus[dc], topo):
                continue
            add_n = add_r = 0.0
            for n, r in neighbours[dc]:
                if n in assign and assign[n] != s.name:
                    add_n, add_r = add_n + 1, add_r + r
            assign[dc] = s.name
            load[s.name] += nodes[dc]
            used[s.name] += gpus[dc]
            ok = walk(i + 1, cut_n + int(add_n), cut_r + add_r)
            del assign[dc]
            load[s.name] -= nodes[dc]
            used[s.name] -= gpus[dc]
            if not ok:
                return False
        return True

    complete = walk(0, 0, 0.0)
    return best[1], complete, count[0]


def place(topo: Topology, cluster: Cluster) -> Placement:
    """The cluster's placement of ``topo``'s DCs (given or automatic); ValidationError when it does not fit."""
    if cluster.placement is not None:
        return _result(topo, cluster, _check_given(topo, cluster, cluster.placement), False, True, 0)
    found, complete, searched = _search(topo, cluster)
    if found is None:
        nodes, gpus = dc_nodes(topo), dc_gpus(topo)
        biggest = max(topo.dc_names, key=lambda dc: nodes[dc])
        room = ", ".join(f"{s.name}: {s.max_hosts if s.max_hosts is not None else 'any'} nodes"
                         f"{'' if s.gpus is None else f', {s.gpus} GPUs'}" for s in cluster.servers)
        raise ValidationError("placement", f"topology {topo.name!r} ({sum(nodes.values())} emulated nodes, "
                              f"{sum(gpus.values())} GPUs; largest DC {biggest}: {nodes[biggest]} nodes) does not fit "
                              f"on the servers ({room})" + ("" if complete else f"; {searched} placements tried"),
                              "add servers, raise their max_hosts or gpus, or shrink the DCs")
    return _result(topo, cluster, found, True, complete, searched)
