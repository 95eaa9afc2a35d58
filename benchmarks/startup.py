#!/usr/bin/env python3
"""Start-up cost: ``net up`` + ``net down`` of three_dc_triangle (4 hosts per DC) vs plain Mininet.

The plain-Mininet equivalent builds the same nodes the way a Mininet script
would: three LinuxBridge switches, three routers and twelve hosts as Mininet
hosts, TCLinks with the same rates (and no delay, which this kernel cannot
do), addresses and static routes through ``cmd``, then ``net.stop()``.  Both
run in the same process, alternately, ``--repeat`` times; medians and the
ratio are printed.  Needs root.

    sudo .venv/bin/python benchmarks/startup.py [--repeat 3]
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


def topo4():
    t = load("three_dc_triangle")
    d = t.to_dict()
    for dc in d["dcs"]:
        dc["hosts"] = 4
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

    setLogLevel("error")
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
    args = ap.parse_args()
    topo = topo4()
    a, b = [], []
    for i in range(args.repeat):
        a.append(ours(topo))
        b.append(plain_mininet(topo))
        print(f"round {i + 1}: testbed up+down {a[-1]:.2f} s, plain Mininet {b[-1]:.2f} s", flush=True)
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"median: testbed {ma:.2f} s, plain Mininet {mb:.2f} s, ratio testbed/Mininet = {ma / mb:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
