"""WAN links between servers as VXLAN tunnels, and the part of a network one server builds.

A WAN link whose two DCs sit on different servers (emulate mode) is built as a VXLAN interface in the local
router's namespace, with the name, address and MTU the single-machine veth would have had, and shaped by the
same code (HTB + netem or the userspace backend, on each end's egress, as for a veth).  VXLAN rather than
GRE: it carries Ethernet frames, so the router's link behaves as the veth it replaces (ARP, neighbour
entries, the same IPv4 /30), it travels as UDP (crosses NAT and firewalls that pass UDP, and its per-flow
source ports spread over ECMP paths), and Linux's VXLAN device takes a netns move while its socket stays
in the server's own namespace.  Mininet's cluster edition (``mininet.examples.cluster``) tunnels links over
SSH or GRE between whole nodes; here only the WAN link crosses servers, the rest is the one-machine build.

Encapsulation adds :data:`VXLAN_OVERHEAD` bytes per packet on the servers' network: the WAN link's MTU plus
that must fit the underlay's MTU, or the outer packets fragment (twice the packets, a CPU cost the spec did
not ask for).  That is checked before anything is built (exit 2 with the fix).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from traffic_control.errors import ValidationError

VXLAN_PORT = 4789  # IANA's VXLAN port
VXLAN_OVERHEAD = 50  # outer IPv4 20 + UDP 8 + VXLAN 8 + inner Ethernet 14
#: a WAN link's VNI is this plus its index in the topology's links: the same on both servers
BASE_VNI = 4200


@dataclass(frozen=True)
class TunnelEnd:
    """This server's end of one WAN link's tunnel."""

    link: str  # "a-b" as in the topology
    vni: int
    local: str  # this server's underlay address (IPv4)
    remote: str  # the other server's
    port: int = VXLAN_PORT

    def to_dict(self) -> dict[str, Any]:
        return {"link": self.link, "vni": self.vni, "local": self.local, "remote": self.remote, "port": self.port}


@dataclass(frozen=True)
class Part:
    """What one server builds: its DCs and its ends of the tunnels."""

    server: str
    dcs: tuple[str, ...]
    tunnels: dict[str, TunnelEnd] = field(default_factory=dict)  # link "a-b" -> end

    def to_dict(self) -> dict[str, Any]:
        return {"server": self.server, "dcs": list(self.dcs),
                "tunnels": {k: t.to_dict() for k, t in self.tunnels.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Part:
        return cls(d["server"], tuple(d["dcs"]), {k: TunnelEnd(**t) for k, t in d.get("tunnels", {}).items()})


def ipv4_of(address: str, field_name: str) -> str:
    """The IPv4 address a server's ``address`` names (tunnels need addresses, not names)."""
    try:
        return socket.getaddrinfo(address, None, socket.AF_INET)[0][4][0]
    except socket.gaierror as e:
        raise ValidationError(field_name, f"cannot resolve {address!r} to an IPv4 address ({e.strerror})",
                              "give the server's IPv4 address") from None


def link_key(a: str, b: str) -> str:
    return f"{a}-{b}"


def underlay_mtu(remote: str) -> tuple[str, int]:
    """(device, MTU) of the route this namespace takes to ``remote``."""
    from pyroute2 import IPRoute

    with IPRoute() as ip:
        routes = ip.route("get", dst=remote)
        oif = routes[0].get_attr("RTA_OIF")
        link = ip.link("get", index=oif)[0]
        return link.get_attr("IFLA_IFNAME"), int(link.get_attr("IFLA_MTU"))


def check_fits(end: TunnelEnd, mtu: int, field_name: str) -> None:
    """The WAN link's MTU plus VXLAN's overhead must fit the underlay's MTU (checked on this server)."""
    dev, under = underlay_mtu(end.remote)
    if mtu + VXLAN_OVERHEAD > under:
        raise ValidationError(field_name, f"link {end.link} crosses servers through a VXLAN tunnel over {dev} "
                              f"(MTU {under}); its MTU {mtu} + {VXLAN_OVERHEAD} bytes of encapsulation does not fit "
                              "(the outer packets would fragment)",
                              f"set mtu: {under - VXLAN_OVERHEAD} on the link, or raise the servers' network MTU "
                              f"to {mtu + VXLAN_OVERHEAD} or more (jumbo frames)")


def create(end: TunnelEnd, ifname: str, mtu: int, netns_pid: int) -> None:
    """The tunnel's VXLAN interface, made in this namespace (its UDP socket stays here) and moved, renamed,
    into the router's namespace (``netns_pid``: a process in it)."""
    from pyroute2 import IPRoute

    from testbed.network import naming

    tmp = naming.tunnel_name(end.vni)  # testbed-named: `testbed clean` finds it if the move never happens
    with IPRoute() as ip:
        ip.link("add", ifname=tmp, kind="vxlan", vxlan_id=end.vni, vxlan_local=end.local, vxlan_group=end.remote,
                vxlan_port=end.port, vxlan_learning=0, mtu=mtu)
        try:
            idx = ip.link_lookup(ifname=tmp)[0]
            ip.link("set", index=idx, net_ns_pid=netns_pid, ifname=ifname)
        except Exception:
            for i in ip.link_lookup(ifname=tmp):
                ip.link("del", index=i)
            raise

