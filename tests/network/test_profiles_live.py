"""A generated time-varying profile, played on a live network, gives the link the rates it drew.

A NetStorm-style profile redraws the a->b rate every 3 s (seeded); one cubic flow crosses the link
the whole time; the link's egress counters over the middle of each interval read the drawn rate.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.network.helpers import iperf3_finish, network, require_root_tools
from tests.network.test_shaping import wire_bps
from topologies import from_dict
from traffic_control.profiles import generate

pytestmark = pytest.mark.root

SPEC = {"name": "storm", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
        "links": [{"a": "a", "b": "b", "rate": "40Mbit"}]}
EVERY = 3.0


def test_a_netstorm_profile_sets_each_drawn_rate():
    require_root_tools("iperf3")
    topo = from_dict(SPEC)
    events = [e for e in generate(topo, {"profile": "netstorm", "every": f"{EVERY}s", "range": [0.25, 1.0],
                                         "duration": f"{3 * EVERY}s", "seed": 6}) if (e.src, e.dst) == ("a", "b")]
    drawn = [e.changes["rate_bps"] for e in events]
    assert len(drawn) == 3 and max(drawn) / min(drawn) > 1.3, drawn  # this seed's draws differ enough to tell
    with network(topo, with_ps=False) as net:
        w = net.plan.wans[0]
        dst = net.plan.nodes["b-h1"].ip
        srv = net.popen("b-h1", ["iperf3", "-s", "-1", "-p", "5361", "-B", dst],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        cli = net.popen("a-h1", ["iperf3", "-c", dst, "-p", "5361", "-t", str(3 * EVERY + 2), "-J"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        player = net.play(events)
        t0 = time.monotonic()
        measured = []
        try:
            for k in range(3):
                time.sleep(max(0.0, t0 + k * EVERY + 0.8 - time.monotonic()))  # past the change and TCP's reaction
                measured.append(wire_bps(net, w.a_router, w.a_if, 1.6))
            player.wait()
        finally:
            player.stop()
            iperf3_finish(srv, cli, timeout=30)
    assert not player.errors, player.errors
    print("drawn", [f"{r / 1e6:.2f}" for r in drawn], "measured", [f"{m / 1e6:.2f}" for m in measured])
    for r, m in zip(drawn, measured):
        assert 0.93 * r <= m <= 1.03 * r, (drawn, measured)
