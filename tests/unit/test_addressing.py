"""The network plan: unique addresses and names, routes for every remote LAN on every router."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest

from testbed.network import naming
from testbed.network.addressing import plan_network
from topologies import from_dict, load

BUNDLED = ["geo_wan", "star", "three_dc_triangle", "two_dc"]


def _ifaces(plan):
    for n in plan.nodes.values():
        for i in n.ifaces:
            yield n, i


@pytest.mark.parametrize("name", BUNDLED)
def test_addresses_unique_and_in_their_subnets(name):
    t = load(name)
    plan = plan_network(t)
    addrs = [i.address for _, i in _ifaces(plan)]
    assert len(addrs) == len(set(addrs)), "duplicate address"
    for n, i in _ifaces(plan):
        net = IPv4Network(f"{i.address}/{i.prefixlen}", strict=False)
        if i.name == naming.HOST_IFNAME or i.name == naming.LAN_IFNAME:
            assert str(net) == plan.lan_cidr(n.dc)
        else:
            assert i.prefixlen == 30 and i.peer_node
    lans = [IPv4Network(plan.lan_cidr(d)) for d in t.dc_names]
    assert len(set(lans)) == len(lans)
    wans = {IPv4Network(f"{w.a_ip}/30", strict=False) for w in plan.wans}
    assert len(wans) == len(plan.wans)
    assert not any(a.overlaps(b) for a in lans for b in wans)


@pytest.mark.parametrize("name", BUNDLED)
def test_names_unique_and_short(name):
    plan = plan_network(load(name))
    netns = [n.netns for n in plan.nodes.values()]
    assert len(set(netns)) == len(netns)
    assert all(naming.is_ours(x) for x in netns)
    ports = [i.port for _, i in _ifaces(plan) if i.port]
    assert len(set(ports)) == len(ports)
    for x in ports + plan.bridges:
        assert len(x.encode()) <= 15
    # Linux-bridge switches live in their own tb-* namespaces: nothing of the LAN is in the root namespace
    assert all(i.switch_netns and naming.is_ours(i.switch_netns) for _, i in _ifaces(plan) if i.port)
    assert {sw.netns for sw in plan.switches} == {naming.netns_name(naming.switch_name(d)) for d in plan.topology.dc_names}
    assert not set(netns) & {sw.netns for sw in plan.switches}
    for n in plan.nodes.values():
        names = [i.name for i in n.ifaces]
        assert len(set(names)) == len(names)
        assert all(len(x.encode()) <= 15 for x in names)


@pytest.mark.parametrize("name", BUNDLED)
def test_every_router_routes_every_remote_lan_via_an_adjacent_router(name):
    t = load(name)
    plan = plan_network(t)
    for dc in t.dc_names:
        r = plan.router(dc)
        dsts = {rt.dst: rt.via for rt in r.routes}
        for other in t.dc_names:
            if other == dc:
                assert plan.lan_cidr(other) not in dsts
                continue
            via = dsts[plan.lan_cidr(other)]
            # the next hop is the peer's address on a link of this router, towards next_hop()
            nh = t.next_hop(dc, other)
            w = next(w for w in plan.wans if {w.a, w.b} == {dc, nh})
            assert via == (w.b_ip if w.a == dc else w.a_ip)
            connected = [IPv4Network(f"{i.address}/{i.prefixlen}", strict=False) for i in r.ifaces]
            assert any(IPv4Address(via) in c for c in connected)
        # every link subnet is reachable (connected or routed)
        for w in plan.wans:
            sub = str(IPv4Network(f"{w.a_ip}/30", strict=False))
            assert dc in (w.a, w.b) or sub in dsts


@pytest.mark.parametrize("name", BUNDLED)
def test_hosts_default_via_their_router(name):
    t = load(name)
    plan = plan_network(t)
    for n in plan.nodes.values():
        if n.role == "router":
            continue
        assert [(r.dst, r.via) for r in n.routes] == [("default", plan.router(n.dc).ifaces[0].address)]
    assert len(plan.hosts()) == t.total_hosts
    if t.ps:
        assert [p.dc for p in plan.hosts(role="ps")] == [t.ps]
    assert not plan_network(t, with_ps=False).hosts(role="ps")


def test_relayed_routes_follow_the_path():
    t = load("star")
    plan = plan_network(t)
    # spoke1's router sends spoke2's LAN to the hub; the hub sends it on to spoke2
    via = {r.dst: r.via for r in plan.router("spoke1").routes}[plan.lan_cidr("spoke2")]
    w = next(w for w in plan.wans if {w.a, w.b} == {"hub", "spoke1"})
    assert via == (w.a_ip if w.a == "hub" else w.b_ip)
    via2 = {r.dst: r.via for r in plan.router("hub").routes}[plan.lan_cidr("spoke2")]
    w2 = next(w for w in plan.wans if {w.a, w.b} == {"hub", "spoke2"})
    assert via2 == (w2.b_ip if w2.a == "hub" else w2.a_ip)


def test_shapes_land_on_the_right_egress():
    spec = {"name": "asym", "dcs": ["a", "b"], "links": [
        {"a": "a", "b": "b", "forward": {"rate": "10Mbit", "delay": "5ms"}, "reverse": {"rate": "20Mbit", "delay": "7ms"}}]}
    plan = plan_network(from_dict(spec))
    ra, rb = plan.router("a"), plan.router("b")
    fa = next(i for i in ra.ifaces if i.name == naming.wan_ifname("b"))
    fb = next(i for i in rb.ifaces if i.name == naming.wan_ifname("a"))
    assert fa.egress.rate_bps == 10e6 and fa.egress.delay_s == 0.005
    assert fb.egress.rate_bps == 20e6 and fb.egress.delay_s == 0.007


def test_max_hosts_addressable():
    t = from_dict({"name": "big", "dcs": [{"name": "a", "hosts": 64}, {"name": "b", "hosts": 64}],
                   "links": [{"a": "a", "b": "b", "rate": "1Gbit"}], "ps": "a"})
    plan = plan_network(t)
    addrs = [i.address for _, i in _ifaces(plan)]
    assert len(addrs) == len(set(addrs))


def test_describe_mentions_every_node():
    plan = plan_network(load("three_dc_triangle"))
    text = "\n".join(plan.describe())
    for n in plan.nodes:
        assert n in text


def test_ovs_switches_stay_in_the_root_namespace_with_prefixed_ports():
    t = from_dict({"name": "o", "switch": "ovs", "dcs": [{"name": "a"}, {"name": "b"}],
                   "links": [{"a": "a", "b": "b", "rate": "10Mbit"}]})
    plan = plan_network(t)
    ports = [i.port for _, i in _ifaces(plan) if i.port]
    assert ports and all(naming.is_ours(p) for p in ports)
    assert all(sw.netns is None for sw in plan.switches)


def test_lan_shape_rate_on_both_ends_delay_once():
    """LAN rate limits both directions of a node's link; delay/jitter/loss apply once per delivery."""
    t = from_dict({"name": "l", "dcs": [{"name": "a", "hosts": 2, "lan": {"rate": "1Gbit", "delay": "1ms",
                                                                          "loss": "1%"}}, {"name": "b"}],
                   "links": [{"a": "a", "b": "b", "rate": "10Mbit"}]})
    plan = plan_network(t)
    for n in plan.hosts("a", role=None):
        lan = n.ifaces[0]
        assert lan.egress.delay_s == 0.001 and lan.egress.loss_pct == 1 and lan.egress.rate_bps == 1e9
        assert lan.port_egress.rate_bps == 1e9 and not lan.port_egress.needs_netem
    sw = {s.dc: s for s in plan.switches}
    assert sw["a"].lan_impairment.delay_s == 0.001 and sw["b"].lan_impairment is None  # userspace: held in the switch
    assert all(n.ifaces[0].egress is None for n in plan.hosts("b", role=None))
    assert t.expected_rtt("a", "a") == pytest.approx(0.002)
    assert t.expected_rtt("a", "b") == pytest.approx(0.002)  # a's LAN once each way, b's LAN has none
