"""Extra endpoints on a running network's DC LAN: a namespace with one veth to the DC switch.

``net verify`` puts a probe (``<dc>-vp``) in a DC without trainer hosts;
cross traffic puts its generator (``<dc>-xt``) beside the trainer hosts, so
that background flows share the WAN without sharing a trainer's NIC or CPU
accounting.  Each endpoint is a node like the hosts as far as the network
sees it: an address on the DC's /24, the DC's router as default gateway,
wire-sized packets (unless the spec says ``gso: true``), the DC's TCP
settings, and, when asked, the DC's LAN shape on its own link.  Its name
carries the testbed prefix (``tb-<dc>-vp``...), so ``testbed clean`` removes
it with everything else, also after a crash.
"""

from __future__ import annotations

import subprocess
from ipaddress import IPv4Network

from pyroute2 import IPRoute, NetNS, netns

from . import naming
from .addressing import IfacePlan, NodePlan, lan_shapes
from .cleanup import kill_in_netns
from .emulation import EmulatedNetwork, tcp_mem


def endpoint_ip(net: EmulatedNetwork, dc: str, host_octet: int) -> str:
    """The address of host part ``host_octet`` on ``dc``'s LAN."""
    return str(IPv4Network(net.plan.lan_cidr(dc)).network_address + host_octet)


def add_endpoint(net: EmulatedNetwork, dc: str, name: str, host_octet: int, ovs_port: int,
                 as_host: bool = False) -> str:
    """Create endpoint ``name`` on ``dc``'s LAN at ``host_octet``; removed again if any step fails.

    ``as_host``: its link to the switch is a host's: the LAN's MTU and shape (rate both ways, and
    under netem the LAN's delay/jitter/loss on its egress).  A probe leaves it off (MTU 1500,
    unshaped: ``net verify`` accounts for that in its expected rates).
    """
    ns_name = naming.netns_name(name)
    sw = next(s for s in net.plan.switches if s.dc == dc)
    gw = net.plan.router(dc).ip
    ip = endpoint_ip(net, dc, host_octet)
    d = net.topo.dc(dc)
    mtu = d.lan.mtu if as_host else 1500
    netns.create(ns_name)
    try:
        with NetNS(ns_name) as ns:
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
        if sw.netns is not None:
            port = naming.switch_port_name(name)
            with NetNS(sw.netns) as s:
                s.link("add", ifname=port, kind="veth", peer={"ifname": naming.HOST_IFNAME, "net_ns_fd": ns_name})
                s.link("set", index=s.link_lookup(ifname=port)[0],
                       master=s.link_lookup(ifname=sw.bridge)[0], mtu=mtu, state="up")
        else:  # OVS: the port is in the root namespace
            from . import ovs as ovsctl

            port = naming.port_name(dc, ovs_port)
            with IPRoute() as root:
                root.link("add", ifname=port, kind="veth", peer={"ifname": naming.HOST_IFNAME, "net_ns_fd": ns_name})
                ovsctl.add_port(sw.bridge, port)
                root.link("set", index=root.link_lookup(ifname=port)[0], mtu=mtu, state="up")
        with NetNS(ns_name) as ns:
            idx = ns.link_lookup(ifname=naming.HOST_IFNAME)[0]
            ns.addr("add", index=idx, address=ip, prefixlen=24)
            ns.link("set", index=idx, mtu=mtu)
            if not net.topo.gso:  # it sends like the hosts: wire-sized packets
                from traffic_control.shape import WIRE_GSO_SEGS

                ns.link("set", index=idx, gso_max_segs=WIRE_GSO_SEGS)
            ns.link("set", index=idx, state="up")
            ns.route("replace", dst="0.0.0.0/0", gateway=gw)
        subprocess.run(["ip", "netns", "exec", ns_name, "sysctl", "-qw", f"net.ipv4.tcp_rmem={tcp_mem(d.receive_buffer)}",
                        f"net.ipv4.tcp_wmem={tcp_mem(d.send_buffer)}", "net.ipv4.tcp_slow_start_after_idle=0",
                        f"net.ipv4.tcp_congestion_control={d.congestion_control}"],
                       check=False, capture_output=True, timeout=10)
        if as_host and net.impairment is not None:
            egress, port_egress, _ = lan_shapes(d.lan)
            if egress is not None or port_egress is not None:
                node = NodePlan(name, dc, "endpoint")
                ifc = IfacePlan(naming.HOST_IFNAME, ip, 24, egress, bridge=sw.bridge, port=port,
                                port_egress=port_egress, switch_netns=sw.netns, mtu=d.lan.mtu)
                net._shape_lan(node, ifc, None, net.impairment.backend)
    except BaseException:
        remove_endpoint(name, ovs_port)
        raise
    return name


def remove_endpoint(name: str, ovs_port: int) -> None:
    """Remove an endpoint: its processes, its namespace (its veth goes with it), an OVS port if any."""
    ns_name = naming.netns_name(name)
    kill_in_netns(ns_name)
    try:
        netns.remove(ns_name)
    except OSError:
        pass
    with IPRoute() as root:  # an OVS endpoint's root-side port, if any
        for idx in root.link_lookup(ifname=naming.port_name(name.rsplit("-", 1)[0], ovs_port)):
            try:
                root.link("del", index=idx)
            except Exception:
                pass
