"""Shape mode's plan: which server is which DC, and what each server's egress to every other DC must be.

In shape mode nothing is emulated but the WAN: each DC that has trainer hosts is one server, its trainers
run on the server itself, and the server's traffic to every other DC's server leaves through a shaper
(:mod:`.shaper`) set to the path between the two DCs.  This module only computes and checks; errors are
:class:`ValidationError` naming the field and the fix, raised before anything is built.

What a path becomes (one shaper per ordered DC pair, at the source server):

* one WAN link: that link direction's shape, exactly as the spec writes it;
* several (traffic relayed through DCs without a server of their own, or through DCs that have one: the
  path is the one the routes take, ``Topology.path``): rate = the slowest hop's, delay = the sum, loss =
  1 - prod(1 - p), MTU = the smallest; jitter from at most one hop (two jittered hops would need their
  sum's distribution, which no single leaf draws), and no hop with reordering, Gilbert-Elliott loss,
  duplication or corruption (they do not compose into one leaf either) -- such a path is refused.

Where this departs from emulate mode (stated in the README and in every report): a WAN link that several
DC pairs' paths share is shared only by the flows that leave the same server (each server shapes its own
egress); two servers sending across one relayed link each get its full rate.  Use emulate mode where that
sharing matters.  A DC's LAN is the server's own loopback, so LAN shapes are refused.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from topologies.model import DEFAULT_LAN, Topology
from traffic_control.errors import ValidationError
from traffic_control.shape import LinkShape, shape_dict

from .model import Cluster
from .tunnel import ipv4_of

#: features of a hop that do not compose into one leaf over a multi-hop path
_NOT_COMPOSABLE = (("reorder_pct", "reordering"), ("ge_p_pct", "Gilbert-Elliott loss"),
                   ("duplicate_pct", "duplication"), ("corrupt_pct", "corruption"))


@dataclass(frozen=True)
class Egress:
    """What one server sends to one other DC's server goes through this shape."""

    dst_dc: str
    dst_server: str
    address: str  # the destination server's address (the shaper's routes and filters match it)
    shape: LinkShape
    path: tuple[str, ...]  # the DCs the spec's routes take, source first

    def to_dict(self) -> dict[str, Any]:
        return {"dst_dc": self.dst_dc, "dst_server": self.dst_server, "address": self.address,
                "shape": asdict(self.shape), "path": list(self.path)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Egress:
        return cls(d["dst_dc"], d["dst_server"], d["address"], LinkShape(**d["shape"]), tuple(d["path"]))

    def describe(self) -> str:
        via = "" if len(self.path) == 2 else f" via {', '.join(self.path[1:-1])}"
        return f"{self.path[0]}->{self.dst_dc} ({self.dst_server}{via}): {self.shape.describe()}"


@dataclass(frozen=True)
class ServerShaping:
    """One server's part in shape mode: its DC, its address, and its egress per destination DC."""

    server: str
    dc: str
    address: str
    egress: tuple[Egress, ...]
    gso: bool = False  # the topology's gso (False: the server's shaped flows leave in wire-sized packets)
    #: the servers' SSH ports: the testbed's own control traffic (commands, clock exchanges, records) is not
    #: shaped, so a lossy or failed-closed path never cuts the launcher off a server it must clean up
    control_ports: tuple[int, ...] = (22,)

    def to_dict(self) -> dict[str, Any]:
        return {"server": self.server, "dc": self.dc, "address": self.address, "gso": self.gso,
                "control_ports": list(self.control_ports), "egress": [e.to_dict() for e in self.egress]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ServerShaping:
        return cls(d["server"], d["dc"], d["address"], tuple(Egress.from_dict(e) for e in d["egress"]),
                   bool(d.get("gso", False)), tuple(d.get("control_ports", (22,))))


def trainer_dcs(topo: Topology) -> list[str]:
    """The DCs that have trainer hosts (or the parameter server): each needs a server in shape mode."""
    return [d.name for d in topo.dcs if d.hosts > 0 or topo.ps == d.name]


def placement(topo: Topology, cluster: Cluster) -> dict[str, str]:
    """DC -> server for every DC with hosts: one server per DC (the server *is* the DC's host).

    Automatic: the DCs in spec order onto the servers in file order, the launcher first.  DCs without hosts
    (relays) need no server: their links are folded into the paths that cross them.
    """
    need = trainer_dcs(topo)
    if cluster.placement is None:
        order = [cluster.launcher] + [n for n in cluster.names if n != cluster.launcher]
        if len(need) > len(order):
            raise ValidationError("servers", f"shape mode needs one server per DC with hosts: {len(need)} such DCs "
                                  f"({', '.join(need)}), {len(order)} server(s)",
                                  "add servers, give DCs without trainers hosts: 0, or use mode: emulate "
                                  "(several DCs per server)")
        return _gpus_fit(topo, cluster, dict(zip(need, order)))
    out: dict[str, str] = {}
    for dc in need:
        server = cluster.placement.get(dc)
        if server is None:
            raise ValidationError(f"placement.{dc}", f"DC {dc} has hosts but no server",
                                  f"add {dc}: <server> to placement, or write placement: auto")
        taken = [d for d, s in out.items() if s == server]
        if taken:
            raise ValidationError(f"placement.{dc}", f"server {server} already is DC {taken[0]}: in shape mode a "
                                  "server is one DC's host (its egress is shaped per destination DC)",
                                  "give each DC with hosts its own server, or use mode: emulate")
        out[dc] = server
    return _gpus_fit(topo, cluster, out)


def _gpus_fit(topo: Topology, cluster: Cluster, where: dict[str, str]) -> dict[str, str]:
    """A DC's hosts' GPUs within its server's ``gpus`` (where the file gives it; each server checks its own
    devices as it shapes)."""
    from .placement import dc_gpus, gpu_fits

    want = dc_gpus(topo)
    for dc, server in where.items():
        s = cluster.server(server)
        if not gpu_fits(s, want[dc], topo):
            raise ValidationError(f"placement.{dc}", f"server {server!r} has {s.gpus} GPUs; DC {dc}'s hosts ask for "
                                  f"{want[dc]}", "give the DC a server with more GPUs, lower gpus:, or set "
                                  "gpu_sharing: true")
    return where


def _where(topo: Topology, u: str, v: str) -> str:
    i = next(k for k, lk in enumerate(topo.links) if {lk.a, lk.b} == {u, v})
    return f"links[{i}].{'forward' if topo.links[i].a == u else 'reverse'}"


def delay_along(topo: Topology, path: tuple[str, ...]) -> float:
    return sum(topo.link(u, v).shape(u, v).delay_s for u, v in zip(path, path[1:]))


def path_shape(topo: Topology, src: str, dst: str, path: tuple[str, ...] | None = None,
               back: tuple[str, ...] | None = None) -> tuple[LinkShape, tuple[str, ...]]:
    """The one shape that stands for the route src -> dst (see the module's docstring), and the route.

    ``path``/``back``: the routes the shapers were built for (a change to a live network keeps its routes, as
    the routers of emulate mode keep theirs); by default the topology's routes now."""
    path = path or tuple(topo.path(src, dst))
    back = back or tuple(topo.path(dst, src))
    hops = [(u, v, topo.link(u, v).shape(u, v)) for u, v in zip(path, path[1:])]
    rtt = delay_along(topo, path) + delay_along(topo, back)
    if len(hops) == 1:
        return replace(hops[0][2], queue_rtt_s=rtt), path
    for u, v, s in hops:
        for attr, what in _NOT_COMPOSABLE:
            if getattr(s, attr):
                raise ValidationError(_where(topo, u, v), f"{what} on a hop of the relayed path "
                                      f"{' -> '.join(path)}: shape mode folds that path into one shaper, and "
                                      f"{what} does not compose across hops", "use mode: emulate for this topology, "
                                      "or give the DCs a direct link")
    jittered = [(u, v, s) for u, v, s in hops if s.jitter_s]
    if len(jittered) > 1:
        raise ValidationError(_where(topo, *jittered[1][:2]), f"two jittered hops on the relayed path "
                              f"{' -> '.join(path)} (shape mode draws one delay per packet for the whole path)",
                              "jitter on one hop of the path only, or use mode: emulate")
    rates = [s.rate_bps for _, _, s in hops if s.rate_bps]
    slowest = min((s for _, _, s in hops if s.rate_bps), key=lambda s: s.rate_bps or 0.0, default=hops[0][2])
    base = jittered[0][2] if jittered else LinkShape()
    shape = replace(base, rate_bps=min(rates) if rates else None,
                    delay_s=sum(s.delay_s for _, _, s in hops),
                    loss_pct=100.0 * (1.0 - math.prod(1.0 - s.loss_pct / 100.0 for _, _, s in hops)),
                    mtu=min(s.mtu for _, _, s in hops), limit=slowest.limit,
                    burst_time_s=slowest.burst_time_s, headroom=slowest.headroom, queue_rtt_s=rtt)
    return shape, path


def check_topology(topo: Topology) -> None:
    """What shape mode cannot give a topology, refused by field.  A LAN *rate* alone is not refused (the
    bundled topologies give every LAN one): it is not emulated, and every report says so
    (:func:`lan_not_emulated`); a LAN's delay, jitter or loss would change what a trial measures, and is.
    So is ``cpu:``/``memory:`` on a process host: its trainer is a process of the whole server, and nothing
    would hold it to the limit (a container host gets its limits: :mod:`.shape_hosts`)."""
    for i, d in enumerate(topo.dcs):
        for key in ("cpu", "memory"):
            if d.runtime == "process" and getattr(d, key) is not None and (d.hosts > 0 or topo.ps == d.name):
                raise ValidationError(f"dcs[{i}].{key}", f"DC {d.name}'s hosts are processes of its server in shape "
                                      f"mode: nothing would hold them to {key}:",
                                      f"runtime: docker (a container host gets its {key}: limit), drop {key}: (the "
                                      "server is the host), or use mode: emulate")
        if replace(d.lan, rate_bps=None) != DEFAULT_LAN:
            raise ValidationError(f"dcs[{i}].lan", f"DC {d.name}'s LAN is shaped ({d.lan.describe()}); in shape mode "
                                  "a DC is one server and its hosts talk over its loopback",
                                  "drop the DC's lan: shape (a rate alone is allowed, and noted), or use mode: emulate")


def plan(topo: Topology, cluster: Cluster) -> dict[str, ServerShaping]:
    """Every server's shaping (servers that are no DC's get none)."""
    check_topology(topo)
    where = placement(topo, cluster)
    addr = {s.name: ipv4_of(s.address, f"servers[{i}].address") for i, s in enumerate(cluster.servers)}
    out: dict[str, ServerShaping] = {}
    for dc, server in where.items():
        egress = []
        for other, peer in where.items():
            if other == dc:
                continue
            shape, path = path_shape(topo, dc, other)
            egress.append(Egress(other, peer, addr[peer], shape, path))
        out[server] = ServerShaping(server, dc, addr[server], tuple(egress), topo.gso,
                                    tuple(sorted({s.port for s in cluster.servers})))
    return out


def lan_not_emulated(topo: Topology, dc: str) -> list[str]:
    """What shape mode leaves out of a DC's LAN (said in every report, recorded with the skipped impairments)."""
    lan = topo.dc(dc).lan
    if not lan.rate_bps:
        return []
    return [f"LAN of {dc}: {lan.describe()} not emulated in shape mode (the DC's hosts share one server and talk "
            "over its loopback)"]


def describe(plans: dict[str, ServerShaping]) -> list[str]:
    """One line per server and per egress (what `cluster place` and `net up` print)."""
    lines = []
    for s in plans.values():
        lines.append(f"{s.server} ({s.address}) is DC {s.dc}")
        lines += [f"  {e.describe()}" for e in s.egress]
    return lines


def shapes_record(plans: dict[str, ServerShaping]) -> dict[str, Any]:
    """``{"a->b": shape in spec form}`` over every server's egress (manifests, reports)."""
    return {f"{s.dc}->{e.dst_dc}": shape_dict(e.shape) for s in plans.values() for e in s.egress}
