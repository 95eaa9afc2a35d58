"""three_dc_triangle with 4 hosts per DC, impairment none: reachability, relaying, routes, tc read-back, link events.

The copy of the bundled topology differs in two ways: 4 trainer hosts per DC,
and a pinned route east->west via central (so relaying through a third DC,
with an asymmetric return path, is exercised on the triangle too).
"""

from __future__ import annotations

import socket
from ipaddress import IPv4Network

import pytest
from pyroute2 import NetNS

from testbed.network import naming
from tests.network.helpers import network, ping_all, ping_ok, reply_ttl, require_root_tools
from topologies import from_dict, load

pytestmark = pytest.mark.root


def triangle_copy():
    d = load("three_dc_triangle").to_dict()
    for dc in d["dcs"]:
        dc["hosts"] = 4
    d["routes"] = {"east->west": ["east", "central", "west"]}
    return from_dict(d)


@pytest.fixture(scope="module")
def net():
    require_root_tools("ping")
    with network(triangle_copy()) as n:
        yield n


def test_impairment_is_recorded(net):
    assert net.impairment.backend == "none"
    assert net.impairment.skipped, "delays of the spec were skipped and that must be recorded"
    assert len(net.plan.hosts()) == 12 and net.plan.hosts(role="ps")


def test_every_host_pings_every_other_host(net):
    targets = {n.name: n.ip for n in net.plan.nodes.values() if n.role != "router"}
    res = ping_all(net, list(targets), targets)
    assert len(res) == 13 * 12
    failed = sorted(k for k, ok in res.items() if not ok)
    assert not failed, f"{len(failed)} pairs failed, e.g. {failed[:5]}"


def test_routers_reach_every_link_address(net):
    addrs = {f"{w.a_router}:{w.a_ip}": w.a_ip for w in net.plan.wans} | {f"{w.b_router}:{w.b_ip}": w.b_ip
                                                                          for w in net.plan.wans}
    for dc in net.topo.dc_names:
        r = net.plan.router(dc).name
        for key, ip in addrs.items():
            ok, out = ping_ok(net, r, ip)
            assert ok, f"{r} -> {key}: {out}"


def test_ttl_shows_the_path(net):
    e1, c1, w1 = (net.plan.nodes[naming.host_name(dc, 1)] for dc in ("east", "central", "west"))
    ok, out = ping_ok(net, e1.name, net.plan.nodes[naming.host_name("east", 2)].ip)
    assert ok and reply_ttl(out) == 64  # same LAN: no router
    ok, out = ping_ok(net, e1.name, c1.ip)
    assert ok and reply_ttl(out) == 62  # two routers
    # pinned east->west via central: a TTL of 2 expires in central's router
    ok, out = ping_ok(net, e1.name, w1.ip, ttl=2)
    assert not ok and "Time to live exceeded" in out, out
    central = {i.address for i in net.plan.router("central").ifaces}
    src = out.split("From ")[1].split()[0].rstrip(":")
    assert src in central, out
    # east->west crosses three routers: TTL 3 expires in west's router, 4 arrives
    ok, out = ping_ok(net, e1.name, w1.ip, ttl=3)
    assert not ok and "Time to live exceeded" in out, out
    ok, out = ping_ok(net, e1.name, w1.ip, ttl=4)
    assert ok, out
    # west->east is not pinned: direct, two routers (so the replies above arrive with TTL 62)
    assert reply_ttl(out) == 62
    ok, out = ping_ok(net, w1.name, e1.ip, ttl=3)
    assert ok, out


def _kernel_routes(ns_name: str) -> set[tuple[str, str]]:
    out = set()
    with NetNS(ns_name) as ns:
        for r in ns.get_routes(family=socket.AF_INET, table=254):
            gw = r.get_attr("RTA_GATEWAY")
            if gw is None:
                continue
            dst = r.get_attr("RTA_DST") or "0.0.0.0"
            out.add((str(IPv4Network(f"{dst}/{r['dst_len']}")), gw))
    return out


def test_routes_match_the_plan(net):
    for node in net.plan.nodes.values():
        want = {("0.0.0.0/0" if r.dst == "default" else r.dst, r.via) for r in node.routes}
        assert _kernel_routes(node.netns) == want, node.name


def test_relay_route_in_the_kernel(net):
    ns = net.plan.router("east").netns
    west_h1 = net.plan.nodes[naming.host_name("west", 1)].ip
    with NetNS(ns) as h:
        r = h.route("get", dst=west_h1)[0]
        oif = h.get_links(r.get_attr("RTA_OIF"))[0].get_attr("IFLA_IFNAME")
    assert oif == naming.wan_ifname("central")


def test_tc_read_back_equals_the_spec(net):
    rb = net.read_back()
    assert rb == net.applied or set(rb) == set(net.applied)
    for w in net.plan.wans:
        for node, ifn, shape in ((w.a_router, w.a_if, w.forward), (w.b_router, w.b_if, w.reverse)):
            got = rb[f"{node}:{ifn}"]["shape"]
            assert got["rate_bps"] == pytest.approx(shape.rate_bps, rel=1e-6)
            assert got["burst_bytes"] == pytest.approx(shape.burst_bytes, rel=2e-3)
            assert got["limit"] == shape.netem_limit
    lan = net.topo.dc("east").lan
    for n in net.plan.hosts("east"):
        got = rb[f"{n.name}:eth0"]["shape"]
        # the plan's LAN shape: the spec's, its queue sized for the DC's longest flow
        assert got["rate_bps"] == pytest.approx(lan.rate_bps) and got["limit"] == n.ifaces[0].egress.netem_limit
        ifc = n.ifaces[0]
        assert ifc.switch_netns == "tb-east-sw"  # the switch port, in the switch's own namespace
        assert rb[f"{ifc.switch_netns}:{ifc.port}"]["shape"]["rate_bps"] == pytest.approx(lan.rate_bps)


def test_link_down_and_up(net):
    e1 = net.plan.nodes[naming.host_name("east", 1)]
    c1 = net.plan.nodes[naming.host_name("central", 1)]
    assert ping_ok(net, e1.name, c1.ip)[0]
    net.set_link_up("east", "central", False)
    try:
        ok, out = ping_ok(net, e1.name, c1.ip, count=2, wait=1)
        assert not ok, out
        # the other links are untouched
        w1 = net.plan.nodes[naming.host_name("west", 1)]
        assert ping_ok(net, w1.name, c1.ip)[0]
    finally:
        net.set_link_up("east", "central", True)
    ok, out = ping_ok(net, e1.name, c1.ip, count=3, wait=2)
    assert ok, out
    for dc in ("east", "central"):
        node = net.plan.router(dc)
        want = {(r.dst, r.via) for r in node.routes}
        assert _kernel_routes(node.netns) == want
