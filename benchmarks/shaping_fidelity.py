#!/usr/bin/env python3
"""Shaping fidelity: TCP goodput / ideal for the testbed's shaper and Mininet's TCLink, side by side.

For each rate, in the same run:

* testbed: ``two_dc`` with the WAN link at that rate and no delay; one iperf3
  flow host -> host across both routers (shaped on the router's WAN egress),
  twice: with wire-sized packets (the default) and with ``gso: true`` (GSO
  super-packets: what a machine needs past its CPU's per-packet ceiling,
  about 1.2 Gbit/s per flow on the 2-core development machine);
* Mininet: two hosts joined by one ``TCLink(bw=...)`` (HTB, Mininet's own
  15 KB-burst configuration) — Mininet refuses rates above 1000 Mbit/s.

ideal = rate x 1448/1514 (TCP payload per wire byte at MTU 1500).  Prints a
table and the ratios.  Needs root.  Usage::

    sudo .venv/bin/python benchmarks/shaping_fidelity.py [--rates 10M,100M,1G,5G] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from testbed.network.emulation import EmulatedNetwork  # noqa: E402
from testbed.network.measure import TCP_PAYLOAD_FRACTION, iperf3  # noqa: E402
from topologies import from_dict  # noqa: E402
from traffic_control.units import parse_rate  # noqa: E402


def testbed_goodput(rate_bps: float, seconds: float, gso: bool = False) -> float:
    topo = from_dict({"name": "fidelity", "gso": gso, "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
                      "links": [{"a": "a", "b": "b", "rate": rate_bps}]})
    with EmulatedNetwork(topo, impairment="none", with_ps=False) as net:
        return iperf3(net, "a-h1", "b-h1", net.plan.nodes["b-h1"].ip, seconds=seconds)["bps"]


def mininet_goodput(rate_bps: float, seconds: float) -> float | None:
    from mininet.link import TCLink
    from mininet.log import setLogLevel
    from mininet.net import Mininet
    from mininet.node import OVSBridge  # noqa: F401  (not used: no OVS here)

    setLogLevel("error")
    mbit = rate_bps / 1e6
    if mbit > 1000:
        return None  # Mininet's TCIntf: "Bandwidth limit ... outside supported range 0..1000"
    net = Mininet(controller=None, link=TCLink, build=False)
    h1 = net.addHost("mnh1", ip="10.99.0.1/24")
    h2 = net.addHost("mnh2", ip="10.99.0.2/24")
    net.addLink(h1, h2, bw=mbit)
    net.build()
    try:
        srv = h2.popen(["iperf3", "-s", "-1", "-B", "10.99.0.2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        out = h1.cmd(f"iperf3 -c 10.99.0.2 -t {seconds} -O 1 -J")
        srv.wait(timeout=10)
        return json.loads(out)["end"]["sum_received"]["bits_per_second"]
    finally:
        net.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="10Mbit,100Mbit,1Gbit,5Gbit")
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    rows = []
    for r in args.rates.split(","):
        rate = parse_rate(r)
        ideal = rate * TCP_PAYLOAD_FRACTION
        ours = testbed_goodput(rate, args.seconds)
        gso = testbed_goodput(rate, args.seconds, gso=True)
        mn = mininet_goodput(rate, args.seconds)
        rows.append((r, ideal, ours, gso, mn))
        print(f"{r:>8}: ideal {ideal / 1e6:9.2f} Mbit/s | testbed {ours / 1e6:9.2f} ({ours / ideal:.3f}) | "
              f"testbed gso {gso / 1e6:9.2f} ({gso / ideal:.3f}) | "
              + (f"Mininet TCLink {mn / 1e6:9.2f} ({mn / ideal:.3f})" if mn else "Mininet TCLink n/a (caps at 1000 Mbit/s)"),
              flush=True)
    print("\nrate      testbed/ideal  gso/ideal  TCLink/ideal  testbed/TCLink")
    for r, ideal, ours, gso, mn in rows:
        print(f"{r:>8}  {ours / ideal:13.3f}  {gso / ideal:9.3f}  {(mn / ideal if mn else float('nan')):12.3f}  "
              f"{(ours / mn if mn else float('nan')):14.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
