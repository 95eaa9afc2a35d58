"""star: spoke-to-spoke traffic is relayed through the hub (routes, TTL, time-exceeded source)."""

from __future__ import annotations

import pytest
from pyroute2 import NetNS

from testbed.network import naming
from tests.network.helpers import network, ping_all, ping_ok, reply_ttl, require_root_tools
from topologies import load

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def net():
    require_root_tools("ping")
    with network(load("star")) as n:
        yield n


def _host(net, dc):
    return net.plan.nodes[naming.host_name(dc, 1)]


def test_all_hosts_reach_each_other(net):
    targets = {n.name: n.ip for n in net.plan.nodes.values() if n.role != "router"}
    res = ping_all(net, list(targets), targets)
    failed = sorted(k for k, ok in res.items() if not ok)
    assert not failed, failed[:5]


@pytest.mark.parametrize("a,b", [("spoke1", "spoke2"), ("spoke3", "spoke4"), ("spoke4", "spoke1")])
def test_spoke_to_spoke_goes_through_the_hub(net, a, b):
    src, dst = _host(net, a), _host(net, b)
    # the kernel's own route lookup in the spoke router: out of the interface facing the hub
    with NetNS(net.plan.router(a).netns) as h:
        r = h.route("get", dst=dst.ip)[0]
        oif = h.get_links(r.get_attr("RTA_OIF"))[0].get_attr("IFLA_IFNAME")
        gw = r.get_attr("RTA_GATEWAY")
    assert oif == naming.wan_ifname("hub")
    hub_addrs = {i.address for i in net.plan.router("hub").ifaces}
    assert gw in hub_addrs
    # three routers on the way: reply TTL 64 - 3
    ok, out = ping_ok(net, src.name, dst.ip)
    assert ok and reply_ttl(out) == 61, out
    # TTL 2 dies in the hub's router
    ok, out = ping_ok(net, src.name, dst.ip, ttl=2)
    assert not ok and "Time to live exceeded" in out, out
    assert out.split("From ")[1].split()[0].rstrip(":") in hub_addrs, out


def test_spoke_to_hub_is_direct(net):
    ok, out = ping_ok(net, _host(net, "spoke1").name, _host(net, "hub").ip)
    assert ok and reply_ttl(out) == 62
