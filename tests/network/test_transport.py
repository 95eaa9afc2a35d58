"""Each host's TCP congestion control is the spec's, not the machine's default, seen from another process.

A new network namespace inherits the machine's default congestion control (BBR on the development
machines); the testbed sets it per DC (default cubic).  Measured why it matters: with the hosts on BBR,
about 40 % of the tree schemes' all-reduces on three_dc_triangle took ~0.23 s longer (BBR's PROBE_RTT:
cwnd 4 for 200 ms every 10 s), with cubic none did (README "TCP").
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from testbed.network import cleanup
from tests.conftest import run_cli
from tests.network.helpers import require_root_tools
from traffic_control.capabilities import congestion_control_problem

pytestmark = pytest.mark.root

SPEC = {"name": "tcp", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1, "tcp": {"congestion_control": "reno"}}],
        "links": [{"a": "a", "b": "b", "rate": "100Mbit"}]}


def _cc(ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/sys/net/ipv4/tcp_congestion_control"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_hosts_run_the_spec_congestion_control(tmp_path):
    require_root_tools()
    for cc in ("cubic", "reno"):
        problem = congestion_control_problem(cc)
        if problem:
            pytest.skip(problem)
    f = tmp_path / "tcp.yaml"
    f.write_text(yaml.safe_dump(SPEC))
    up = run_cli("net", "up", str(f), "--impairment", "none", timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        assert _cc("tb-a-h1") == "cubic" and _cc("tb-b-h1") == "reno"
        assert _cc("tb-a-r") == "cubic"
        shown = json.loads(run_cli("net", "show", "--json", timeout=120).stdout)
        dcs = {d["name"]: d for d in shown["state"]["topology"]["dcs"]}
        assert dcs["b"]["tcp"] == {"congestion_control": "reno"} and "tcp" not in dcs["a"]
    finally:
        run_cli("net", "down", timeout=300)
    assert cleanup.leftovers() == {}


def test_an_unavailable_congestion_control_is_refused_before_building(tmp_path):
    require_root_tools()
    bad = dict(SPEC, dcs=[{"name": "a", "hosts": 1, "tcp": {"congestion_control": "nosuchcc"}}, "b"])
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(bad))
    r = run_cli("net", "up", str(f), "--impairment", "none", timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "dcs[0].tcp.congestion_control" in r.stderr and "modprobe tcp_nosuchcc" in r.stderr
    assert cleanup.leftovers() == {}


BUFFERS = {"name": "bufs", "dcs": [{"name": "a", "hosts": 1},
                                   {"name": "b", "hosts": 1, "tcp": {"receive_buffer": "128KiB"}}],
           "links": [{"a": "a", "b": "b", "rate": "100Mbit", "delay": "20ms"}]}


def test_a_small_receive_buffer_caps_a_flow_at_window_over_rtt(tmp_path):
    """b's hosts may buffer 128 KiB per socket: a flow into b is window-limited (at most 128 KiB per 40 ms
    round trip, 26 Mbit/s), the same link's other direction into a (64 MiB, the default) is not.  Side by
    side on one network; the sysctl read back from another process."""
    from testbed.network.measure import TCP_PAYLOAD_FRACTION, iperf3
    from tests.network.helpers import network
    from topologies import from_dict

    require_root_tools("iperf3")
    with network(from_dict(BUFFERS), with_ps=False, impairment="auto") as net:
        if net.impairment is None or net.impairment.skipped:
            pytest.skip("the path's delay is not applied on this machine")
        rmem = subprocess.run(["ip", "netns", "exec", net.netns("b-h1"), "cat", "/proc/sys/net/ipv4/tcp_rmem"],
                              capture_output=True, text=True, check=True).stdout.split()
        assert rmem == ["4096", "131072", "131072"]
        into_b = iperf3(net, "a-h1", "b-h1", net.plan.nodes["b-h1"].ip, seconds=4, omit=1, port=5351)["bps"]
        into_a = iperf3(net, "b-h1", "a-h1", net.plan.nodes["a-h1"].ip, seconds=4, omit=1, port=5352)["bps"]
    ideal = 100e6 * TCP_PAYLOAD_FRACTION
    bound = 128 * 1024 * 8 / 0.040
    print(f"into b (128 KiB): {into_b / 1e6:.2f} Mbit/s (window bound {bound / 1e6:.1f}); into a (64 MiB): "
          f"{into_a / 1e6:.2f} Mbit/s ({into_a / ideal:.3f} x ideal)")
    assert into_b <= 1.05 * bound and into_b >= 0.2 * bound
    assert into_a >= 0.9 * ideal
