#!/usr/bin/env python3
"""Start-up cost: ``net up`` + ``net down`` vs plain Mininet, at several sizes, side by side.

Sizes are ``DCSxHOSTS``: ``3x4`` is three_dc_triangle with 4 hosts per DC
(its three links), every other size a full-mesh WAN of that many DCs (8x8:
28 links, 64 hosts, 8 routers).  Links keep their rates; delays are dropped
for both sides because plain Mininet can only delay through netem, which
this kernel lacks (the testbed's shaping tree is built either way).

The plain-Mininet equivalent builds the same nodes the way a Mininet script
would: three LinuxBridge switches, three routers and twelve hosts as Mininet
hosts, TCLinks with the same rates (and no delay, which this kernel cannot
do), addresses and static routes through ``cmd``, then ``net.stop()``.  Both
run in the same process, alternately, ``--repeat`` times; medians and the
ratio are printed.  Needs root.

    sudo .venv/bin/python benchmarks/startup.py [--sizes 3x4,8x8,16x4] [--repeat 3]

It prints, per size, the medians of both and their ratio, the testbed's
time per host and per link (growth should be linear in both), and the bar
of the network-fidelity issue: testbed / Mininet <= 0.5 at 8x8.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from testbed.network.addressing import plan_network  # noqa: E402
from testbed.network.emulation import EmulatedNetwork  # noqa: E402
from topologies import load  # noqa: E402


def topo(size: str):
    """``3x4``: the triangle with 4 hosts per DC; ``NxH``: an N-DC full mesh of 100 Mbit/s links."""
    n_dc, n_hosts = (int(v) for v in size.lower().split("x"))
    if n_dc == 3:
        return topo_triangle(n_hosts)
    from topologies import from_dict

    names = [f"d{i}" for i in range(1, n_dc + 1)]
    return from_dict({"name": f"mesh{n_dc}x{n_hosts}", "dcs": [{"name": x, "hosts": n_hosts} for x in names],
                      "links": [{"a": a, "b": b, "rate": "100Mbit"} for i, a in enumerate(names)
                                for b in names[i + 1:]]})


def topo_triangle(hosts: int):
    t = load("three_dc_triangle")
    d = t.to_dict()
    for dc in d["dcs"]:
        dc["hosts"] = hosts
    d.pop("ps", None)
    for lk in d["links"]:
        lk.pop("delay", None)
    for dc in d["dcs"]:
        dc.pop("lan", None)
    from topologies import from_dict

    return from_dict(d)


def ours(topo) -> float:
    t0 = time.monotonic()
    net = EmulatedNetwork(topo, impairment="none", with_ps=False)
    net.start()
    net.stop()
    return time.monotonic() - t0


def plain_mininet(topo) -> float:
    from mininet.link import TCLink
    from mininet.log import setLogLevel
    from mininet.net import Mininet
    from mininet.nodelib import LinuxBridge

    setLogLevel("critical")  # its TCLinks warn about HTB quanta at every link; errors still raise
    plan = plan_network(topo, with_ps=False)
    t0 = time.monotonic()
    net = Mininet(controller=None, switch=LinuxBridge, link=TCLink, build=False, waitConnected=False)
    sw = {}
    for i, dc in enumerate(topo.dcs, start=1):
        sw[dc.name] = net.addSwitch(f"s{i}")
    nodes = {}
    for n in plan.nodes.values():
        nodes[n.name] = net.addHost(n.name.replace("-", ""), ip=None)
    for n in plan.nodes.values():
        lan = n.ifaces[0]
        net.addLink(nodes[n.name], sw[n.dc], intfName1=f"{n.name.replace('-', '')}-eth0",
                    params1={"ip": f"{lan.address}/24"})
    for w in plan.wans:
        net.addLink(nodes[w.a_router], nodes[w.b_router], bw=w.forward.rate_bps / 1e6,
                    params1={"ip": f"{w.a_ip}/30"}, params2={"ip": f"{w.b_ip}/30"})
    net.build()
    for s in sw.values():
        s.start([])
    for n in plan.nodes.values():
        h = nodes[n.name]
        if n.role == "router":
            h.cmd("sysctl -qw net.ipv4.ip_forward=1")
        for r in n.routes:
            h.cmd(f"ip route replace {'default' if r.dst == 'default' else r.dst} via {r.via}")
    net.stop()
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes", default="3x4,8x8,16x4", help="comma-separated DCSxHOSTS (default 3x4,8x8,16x4)")
    args = ap.parse_args()
    rows = []
    for size in args.sizes.split(","):
        t = topo(size)
        a, b = [], []
        for i in range(args.repeat):
            a.append(ours(t))
            b.append(plain_mininet(t))
            print(f"{size} round {i + 1}: testbed up+down {a[-1]:.2f} s, plain Mininet {b[-1]:.2f} s", flush=True)
        hosts = sum(dc.hosts for dc in t.dcs)
        rows.append((size, hosts, len(t.links), statistics.median(a), statistics.median(b)))
    print(f"{'size':>6} {'hosts':>5} {'links':>5} {'testbed s':>9} {'Mininet s':>9} {'ratio':>5} "
          f"{'ms/host':>7} {'ms/link':>7}")
    for size, hosts, links, ma, mb in rows:
        print(f"{size:>6} {hosts:>5} {links:>5} {ma:9.2f} {mb:9.2f} {ma / mb:5.2f} "
              f"{ma / hosts * 1e3:7.1f} {ma / max(links, 1) * 1e3:7.1f}")
    bar = [r for r in rows if r[0] == "8x8"]
    if bar:
        ratio = bar[0][3] / bar[0][4]
        print(f"bar (testbed / Mininet <= 0.5 at 8x8): {ratio:.2f} {'met' if ratio <= 0.5 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
