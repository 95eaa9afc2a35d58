"""Cross traffic shares the emulated WAN: each pattern delivers what its spec offers, and it takes
capacity from the flows a study measures.

Live, on a 20 Mbit/s, 10 ms each way link (the userspace backend natively, netem in the lab):

* in process: a paced TCP flow, a UDP flow, an on/off flow and Poisson short flows run for 6 s;
  each one's delivered rate (read by the sink) matches its spec, the short flows complete in the
  round trips the path's delay implies (a missing delay would read ~0), the bytes crossed the
  shaped WAN interface, and the endpoints are gone afterwards;
* as a user runs it: `net up` in one process, `net cross` in another, and iperf3 through
  `net exec` beside it gets the capacity the UDP cross traffic leaves (and the whole link without
  it); `net down` leaves nothing behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.network import cleanup
from testbed.network.cross_traffic import CrossTraffic, parse_cross_traffic
from tests.network.helpers import network, require_root_tools
from topologies import from_dict

pytestmark = pytest.mark.root

RATE, DELAY = 20e6, 0.010
SPEC = {"name": "xt", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
        "links": [{"a": "a", "b": "b", "rate": "20Mbit", "delay": "10ms"}]}
TCP_PAYLOAD, UDP_PAYLOAD = 1448 / 1500, 1468 / 1500  # payload per IP byte (the 4-byte flow header counted out)


def _tx_bytes(net, node: str, ifname: str) -> int:
    out = subprocess.run(["ip", "netns", "exec", net.netns(node), "cat", f"/sys/class/net/{ifname}/statistics/tx_bytes"],
                         capture_output=True, text=True, check=True).stdout
    return int(out)


def test_each_pattern_delivers_its_spec_over_the_shaped_wan(tmp_path: Path) -> None:
    require_root_tools()
    flows = parse_cross_traffic([
        {"from": "a", "to": "b", "pattern": "constant", "rate": "6Mbit", "label": "tcp"},
        {"from": "a", "to": "b", "pattern": "constant", "rate": "4Mbit", "protocol": "udp", "label": "udp"},
        {"from": "b", "to": "a", "pattern": "on_off", "rate": "5Mbit", "on_time": "1s", "off_time": "1s", "label": "onoff"},
        {"from": "b", "to": "a", "pattern": "short_flows", "size": "50KB", "arrival_rate": 5, "label": "short"},
    ], ["a", "b"])
    with network(from_dict(SPEC), with_ps=False, impairment="auto") as net:
        if net.impairment is None or net.impairment.skipped:
            pytest.skip("the path's delay is not applied on this machine")
        tx0 = _tx_bytes(net, "a-r", "w-b")
        cross = CrossTraffic(net, flows, tmp_path).start()
        assert {"tb-a-xt", "tb-b-xt"} <= set(cleanup.owned_netns())
        time.sleep(6.0)
        summary = cross.stop()
        tx = _tx_bytes(net, "a-r", "w-b") - tx0
        left = [n for n in cleanup.owned_netns() if n.endswith("-xt")]
    rows = {r["label"]: r for r in summary["flows"]}
    for label, r in rows.items():
        print(f"{label}: delivered {r['delivered_bytes']} B in {r['active_s']} s = "
              f"{(r['goodput_bps'] or 0) / 1e6:.3f} Mbit/s; {r.get('short', '')}")
    print(f"a->b WAN egress {tx} B; sinks got {rows['tcp']['delivered_bytes'] + rows['udp']['delivered_bytes']} B a->b")
    assert summary["errors"] == [], summary["errors"]
    assert left == [], "cross-traffic endpoints left behind"
    assert 0.90 <= rows["tcp"]["goodput_bps"] / (6e6 * TCP_PAYLOAD) <= 1.05
    assert 0.90 <= rows["udp"]["goodput_bps"] / (4e6 * UDP_PAYLOAD) <= 1.03
    on = rows["onoff"]
    assert 2.5 <= on["active_s"] <= 3.6, "1 s on, 1 s off over 6 s: three bursts"
    assert 0.85 <= on["goodput_bps"] / (5e6 * TCP_PAYLOAD) <= 1.15  # idle when off, its rate when on
    sh = rows["short"]["short"]
    assert 17 <= sh["started"] <= 47, "Poisson, mean 30 in 6 s: outside its 99.9 % range"
    assert sh["completed"] >= sh["started"] - 2  # the last ones may still run at the stop
    # 50 KB from a fresh window: handshake + 3 rounds of slow start at least, each a 20 ms round trip
    assert 3 * 2 * DELAY <= sh["fct_p50_s"] <= 0.5, sh
    # everything a->b crossed the shaped WAN interface (headers make the interface count larger)
    sunk = rows["tcp"]["delivered_bytes"] + rows["udp"]["delivered_bytes"]
    assert sunk <= tx <= 1.2 * sunk + 200_000
    recs = [json.loads(x) for x in (tmp_path / "samples" / "cross.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in recs} >= {"rx", "state", "short"}
    assert not list((tmp_path / "samples").glob("cross-*-*.jsonl")), "per-endpoint parts merged and removed"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(Path(__file__).resolve().parents[2]))


def _iperf_bps(seconds: int) -> float:
    srv = subprocess.Popen([sys.executable, "-m", "testbed.cli", "net", "exec", "b-h1", "--", "iperf3", "-s", "-1",
                            "-p", "5302"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        r = _cli("net", "exec", "a-h1", "--", "iperf3", "-c", "10.2.0.1", "-p", "5302", "-t", str(seconds), "-J")
    finally:
        srv.kill()
        srv.wait()
    return json.loads(r.stdout)["end"]["sum_received"]["bits_per_second"]


def test_cli_cross_traffic_takes_capacity_from_a_measured_flow(tmp_path: Path) -> None:
    require_root_tools("iperf3")
    topo = tmp_path / "xt.yaml"
    topo.write_text(json.dumps(SPEC))
    cross = tmp_path / "cross.yaml"
    cross.write_text("cross_traffic:\n  - {from: a, to: b, pattern: constant, rate: 12Mbit, protocol: udp}\n")
    up = _cli("net", "up", str(topo), "--no-ps")
    assert up.returncode == 0, up.stderr
    try:
        alone = _iperf_bps(3)
        bg = subprocess.Popen([sys.executable, "-m", "testbed.cli", "net", "cross", str(cross), "--duration", "9s",
                               "--out", str(tmp_path / "out"), "--json"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=str(Path(__file__).resolve().parents[2]))
        time.sleep(2.5)
        shared = _iperf_bps(3)
        out, err = bg.communicate(timeout=60)
        assert bg.returncode == 0, err
        summary = json.loads(out)
    finally:
        down = _cli("net", "down")
    udp = summary["flows"][0]
    print(f"iperf3 alone {alone / 1e6:.2f} Mbit/s, beside 12 Mbit/s UDP {shared / 1e6:.2f} Mbit/s; "
          f"UDP delivered {udp['goodput_bps'] / 1e6:.2f} Mbit/s")
    assert down.returncode == 0, down.stderr
    assert not cleanup.owned_netns(), "net down left namespaces"
    assert alone >= 0.85 * RATE * TCP_PAYLOAD
    # the link's 20 Mbit/s less the UDP flow's 12: TCP gets what is left (plus what UDP loses to the queue)
    assert shared <= (RATE - 12e6 * 0.8) * TCP_PAYLOAD
    assert udp["goodput_bps"] >= 0.8 * 12e6 * UDP_PAYLOAD
    assert (tmp_path / "out" / "samples" / "cross.jsonl").is_file()
    assert (tmp_path / "out" / "cross_traffic.json").is_file()
