"""The network plan: nodes, interfaces, addresses and routes, computed from a topology.

Pure data, no side effects: ``testbed net up --dry-run`` prints it, tests
check it without root, and the builder realises exactly this plan.

Addressing: DC number i (1-based, in spec order) owns the LAN 10.i.0.0/24
(hosts .1..N, parameter server .200, router .254).  WAN link number k
(1-based) is the point-to-point 10.255.k.0/30 (.1 on endpoint a, .2 on b).
These private addresses only exist inside the testbed's namespaces.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network

from topologies.model import MAX_DCS, MAX_LINKS, Topology
from traffic_control.shape import DEFAULT_MTU, LinkShape

from . import naming


@dataclass(frozen=True)
class IfacePlan:
    name: str
    address: str  # a.b.c.d
    prefixlen: int
    egress: LinkShape | None = None  # shape applied on this interface's egress
    peer_node: str | None = None  # WAN: the router at the other end
    bridge: str | None = None  # LAN: bridge this iface's peer is a port of
    port: str | None = None  # LAN: that port's name
    port_egress: LinkShape | None = None  # LAN: shape on the bridge port (switch -> node): rate only
    switch_netns: str | None = None  # LAN: namespace of bridge and port (None: root, OVS only)
    mtu: int = DEFAULT_MTU  # this interface's MTU, and its switch port's (the spec's lan/link mtu)


@dataclass(frozen=True)
class RoutePlan:
    dst: str  # CIDR
    via: str  # next-hop address


@dataclass
class NodePlan:
    name: str
    dc: str
    role: str  # host | ps | router
    ifaces: list[IfacePlan] = field(default_factory=list)
    routes: list[RoutePlan] = field(default_factory=list)
    cpu: float | None = None
    memory: int | None = None  # bytes

    @property
    def netns(self) -> str:
        return naming.netns_name(self.name)

    @property
    def ip(self) -> str:
        return self.ifaces[0].address


@dataclass(frozen=True)
class WanPlan:
    a: str
    b: str
    a_router: str
    b_router: str
    a_if: str
    b_if: str
    a_ip: str
    b_ip: str
    forward: LinkShape  # a -> b, applied on a_if
    reverse: LinkShape  # b -> a, applied on b_if


@dataclass(frozen=True)
class SwitchPlan:
    """A DC's switch: a bridge in its own namespace (Linux bridge) or in the root namespace (OVS)."""

    dc: str
    bridge: str
    netns: str | None  # None: root namespace (OVS)
    lan_impairment: LinkShape | None = None  # the DC's LAN delay/jitter/loss (userspace backend: held here)


@dataclass
class NetPlan:
    topology: Topology
    nodes: dict[str, NodePlan]
    wans: list[WanPlan]
    bridges: list[str]
    switches: list[SwitchPlan] = field(default_factory=list)
    #: several servers (testbed.cluster): WAN links with one end on this server, built as tunnels
    tunnels: list[WanPlan] = field(default_factory=list)
    #: several servers: the DCs this server builds (None: every DC, one machine)
    part: tuple[str, ...] | None = None

    def hosts(self, dc: str | None = None, role: str | None = "host") -> list[NodePlan]:
        return [n for n in self.nodes.values() if (dc is None or n.dc == dc) and (role is None or n.role == role)]

    def router(self, dc: str) -> NodePlan:
        return self.nodes[naming.router_name(dc)]

    def lan_cidr(self, dc: str) -> str:
        return str(_lan(self.topology.dc_names.index(dc) + 1))

    def describe(self) -> list[str]:
        out = []
        for lk in self.wans:
            out.append(f"wan {lk.a}<->{lk.b}: {lk.a_router}:{lk.a_if} {lk.a_ip} -> {lk.forward.describe()} | "
                       f"{lk.b_router}:{lk.b_if} {lk.b_ip} -> {lk.reverse.describe()}")
        for sw in self.switches:
            where = f"netns {sw.netns}" if sw.netns else "root namespace (OVS)"
            out.append(f"switch {sw.dc}: bridge {sw.bridge} in {where}")
        for n in self.nodes.values():
            addrs = ", ".join(f"{i.name} {i.address}/{i.prefixlen}" for i in n.ifaces)
            routes = ", ".join(f"{r.dst} via {r.via}" for r in n.routes)
            out.append(f"{n.role:6} {n.name:12} netns {n.netns:16} {addrs}; routes: {routes}")
        return out


def restrict(plan: NetPlan, dcs: Iterable[str]) -> NetPlan:
    """The part of ``plan`` one server builds when the topology spans several (testbed.cluster): the nodes
    and switches of ``dcs``, the WAN links between two of them (``wans``), and those with one end among
    them (``tunnels``, each built as a tunnel to the server of the other end).  Names and addresses are the
    full plan's, so routes and shapes are the same as on one machine."""
    mine = set(dcs)
    unknown = mine - set(plan.topology.dc_names)
    if unknown:
        raise ValueError(f"no DC(s) {sorted(unknown)} in topology {plan.topology.name!r}")
    return NetPlan(plan.topology, {n: p for n, p in plan.nodes.items() if p.dc in mine},
                   [w for w in plan.wans if w.a in mine and w.b in mine],
                   [sw.bridge for sw in plan.switches if sw.dc in mine],
                   [sw for sw in plan.switches if sw.dc in mine],
                   [w for w in plan.wans if (w.a in mine) != (w.b in mine)],
                   tuple(d for d in plan.topology.dc_names if d in mine))


def lan_shapes(lan: LinkShape) -> tuple[LinkShape | None, LinkShape | None, LinkShape | None]:
    """``(node egress, switch port egress, impairment)`` that realise a DC's LAN shape.

    Definition: ``lan: {rate, delay, jitter, loss}`` describes every node's
    link to its DC switch.  Its **rate** limits each direction of that link
    (node -> switch on the node's egress, switch -> node on the switch port's
    egress), as a full-duplex NIC does.  Its **delay, jitter and loss** apply
    once per delivery across the LAN (node -> switch -> node), so a one-way
    trip host -> host or host -> router takes ``delay`` and a same-DC round
    trip ``2 x delay``: netem sits on the sending node's egress only.  (The
    userspace backend holds the packet in the DC's switch instead, once per
    frame it bridges; the sum over any path is the same.)  ``impairment`` is
    that delay/jitter/loss part, or None when the LAN has none.
    """
    if not (lan.rate_bps or lan.needs_netem):
        return None, None, None
    port = lan.without_netem() if lan.rate_bps else None
    return lan, port, (lan if lan.needs_netem else None)


def _lan(i: int) -> IPv4Network:
    return IPv4Network(f"10.{i}.0.0/24")


def _wan(k: int) -> IPv4Network:
    return IPv4Network(f"10.255.{k}.0/30")


def plan_network(topo: Topology, with_ps: bool = True) -> NetPlan:
    """Compute every node, address and route for ``topo``."""
    if len(topo.dcs) > MAX_DCS or len(topo.links) > MAX_LINKS:
        raise ValueError(f"at most {MAX_DCS} DCs and {MAX_LINKS} links are addressable")
    nodes: dict[str, NodePlan] = {}
    # every queue is sized for the longest round trip of the flows through it, not its own link's
    rtts = topo.queue_rtts()
    bridges = []
    switches: list[SwitchPlan] = []
    lan_of = {}
    for i, dc in enumerate(topo.dcs, start=1):
        net = _lan(i)
        lan_of[dc.name] = net
        br = naming.bridge_name(dc.name)
        bridges.append(br)
        gw = str(net.network_address + 254)
        members: list[tuple[str, str, str, float | None, int | None]] = []
        for j in range(1, dc.hosts + 1):
            members.append((naming.host_name(dc.name, j), "host", str(net.network_address + j), dc.cpu, dc.memory))
        if with_ps and topo.ps == dc.name:
            members.append((naming.ps_name(dc.name), "ps", str(net.network_address + 200), None, None))
        # LAN shape (see lan_shapes): node egress = the whole shape, switch port egress = rate only.
        egress, port_egress, impairment = lan_shapes(dc.lan.with_changes(queue_rtt_s=rtts[(dc.name, dc.name)]))
        sw_ns = None if topo.switch == "ovs" else naming.netns_name(naming.switch_name(dc.name))
        switches.append(SwitchPlan(dc.name, br, sw_ns, impairment))
        r = NodePlan(naming.router_name(dc.name), dc.name, "router")
        for port_no, (name, role, addr, cpu, mem) in enumerate([*members, (r.name, "router", gw, None, None)], start=1):
            port = naming.port_name(dc.name, port_no) if sw_ns is None else naming.switch_port_name(name)
            node = r if role == "router" else NodePlan(name, dc.name, role, cpu=cpu, memory=mem)
            ifname = naming.LAN_IFNAME if role == "router" else naming.HOST_IFNAME
            node.ifaces.append(IfacePlan(ifname, addr, 24, egress, bridge=br, port=port, port_egress=port_egress,
                                         switch_netns=sw_ns, mtu=dc.lan.mtu))
            if role != "router":
                node.routes.append(RoutePlan("default", gw))
            nodes[name] = node

    wans = []
    wan_addr: dict[tuple[str, str], str] = {}  # (router dc, peer dc) -> peer's address on that link
    for k, lk in enumerate(topo.links, start=1):
        net = _wan(k)
        a_ip, b_ip = str(net.network_address + 1), str(net.network_address + 2)
        ra, rb = nodes[naming.router_name(lk.a)], nodes[naming.router_name(lk.b)]
        a_if, b_if = naming.wan_ifname(lk.b), naming.wan_ifname(lk.a)
        fwd = lk.forward.with_changes(queue_rtt_s=rtts.get((lk.a, lk.b)))
        rev = lk.reverse.with_changes(queue_rtt_s=rtts.get((lk.b, lk.a)))
        ra.ifaces.append(IfacePlan(a_if, a_ip, 30, fwd, peer_node=rb.name, mtu=fwd.mtu))
        rb.ifaces.append(IfacePlan(b_if, b_ip, 30, rev, peer_node=ra.name, mtu=rev.mtu))
        wan_addr[(lk.a, lk.b)] = b_ip
        wan_addr[(lk.b, lk.a)] = a_ip
        wans.append(WanPlan(lk.a, lk.b, ra.name, rb.name, a_if, b_if, a_ip, b_ip, fwd, rev))

    # Per-destination routes on every router: next hop from the topology's routing.
    for dc in topo.dcs:
        r = nodes[naming.router_name(dc.name)]
        for other in topo.dcs:
            if other.name == dc.name:
                continue
            nh = topo.next_hop(dc.name, other.name)
            r.routes.append(RoutePlan(str(lan_of[other.name]), wan_addr[(dc.name, nh)]))
        # Far ends of WAN links that are not adjacent (so routers can ping any link address).
        for k, lk in enumerate(topo.links, start=1):
            if dc.name in (lk.a, lk.b):
                continue
            # reach the /30 via the next hop towards endpoint a
            nh = topo.next_hop(dc.name, lk.a)
            r.routes.append(RoutePlan(str(_wan(k)), wan_addr[(dc.name, nh)]))
    return NetPlan(topo, nodes, wans, bridges, switches)


def address_of(plan: NetPlan, node: str) -> IPv4Address:
    return IPv4Address(plan.nodes[node].ip)
