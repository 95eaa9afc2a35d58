"""The TCP telemetry sampler reads each connection's own view of the emulated path, from the kernel.

One cubic flow over 50 Mbit/s with 20 ms each way; the sampler watches the sending host's namespace
at 10 Hz.  What it reads must agree with the spec and with what iperf3 says of the same connection:
the connection's minimum RTT is the path's 40 ms (not the sampler's own namespace's ~0), its window
grew to carry the bandwidth-delay product, and its acknowledged bytes are iperf3's sent bytes.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from testbed.collect.tcp_sampler import TcpSampler, TcpTarget
from tests.network.helpers import network, require_root_tools
from topologies import from_dict

pytestmark = pytest.mark.root

SPEC = {"name": "tcpinfo", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
        "links": [{"a": "a", "b": "b", "rate": "50Mbit", "delay": "20ms"}]}


def test_sampler_reads_the_connection_over_the_emulated_path(tmp_path):
    require_root_tools("iperf3")
    with network(from_dict(SPEC), with_ps=False, impairment="auto") as net:
        if net.impairment is None or net.impairment.skipped:
            pytest.skip("the path's delay is not applied on this machine")
        dst = net.plan.nodes["b-h1"].ip
        out = tmp_path / "tcp.jsonl"
        sampler = TcpSampler(out, [TcpTarget("a-h1", net.netns("a-h1"))], rate_hz=10).start()
        srv = net.popen("b-h1", ["iperf3", "-s", "-1", "-p", "5341", "-B", dst],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.3)
            cli = net.popen("a-h1", ["iperf3", "-c", dst, "-p", "5341", "-t", "5", "-J"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            rep, _ = cli.communicate(timeout=60)
        finally:
            srv.kill()
            srv.wait()
            stats = sampler.stop()
        end = json.loads(rep)["end"]
        sent, retrans = end["sum_sent"]["bytes"], end["sum_sent"]["retransmits"]
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert stats["errors"] == {}, stats
    data = [r for r in rows if r["dst"] == f"{dst}:5341"]
    bulk = max({r["src"] for r in data}, key=lambda s: max(r["bytes_acked"] for r in data if r["src"] == s))
    flow = [r for r in data if r["src"] == bulk]
    assert len(flow) >= 30, f"{len(flow)} samples of a 5 s flow at 10 Hz"
    rtt_min = min(r["min_rtt_us"] for r in flow) / 1e6
    bdp_segments = 50e6 / 8 * 0.040 / flow[-1]["mss"]
    acked = max(r["bytes_acked"] for r in flow)
    print(f"{len(flow)} samples; min RTT {rtt_min * 1e3:.2f} ms; max cwnd {max(r['cwnd'] for r in flow)} "
          f"segments (BDP {bdp_segments:.0f}); acked {acked} of {sent} sent; retransmits {flow[-1]['retrans_total']} "
          f"(iperf3 {retrans})")
    assert 0.040 <= rtt_min <= 0.040 * 1.05 + 0.001  # the path's RTT, read by the connection itself
    assert max(r["cwnd"] for r in flow) >= 0.9 * bdp_segments  # the window grew to carry the path
    assert 0.9 * sent <= acked <= sent  # the last sample can precede the last ACKs by one tick
    assert flow[-1]["retrans_total"] <= retrans
    ts = [r["ts"] for r in flow]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)


#: a receiver that reads one connection to its end; a sender that connects, sends N bytes and closes
_RECV = ("import socket,sys;s=socket.create_server((sys.argv[1],5342));c,_=s.accept();n=0\n"
         "while True:\n b=c.recv(65536)\n if not b: break\n n+=len(b)\nc.close();print(n)")
_SEND = ("import socket,sys;c=socket.create_connection((sys.argv[1],5342));c.sendall(b'x'*int(sys.argv[2]));"
         "c.shutdown(socket.SHUT_WR);c.recv(1);c.close()")


def test_a_connection_that_closes_between_two_ticks_still_reports_its_final_counters(tmp_path):
    """At 0.2 Hz a whole connection (connect, 3 MB, close: well under a second) falls between the first
    tick and the last; the kernel's destroy event still gives its final counters, as a ``closed`` line on
    each end, and they carry every byte.  Without the destroy events the file would hold no line of it."""
    require_root_tools()
    import sys

    with network(from_dict(SPEC), with_ps=False) as net:
        dst, nbytes = net.plan.nodes["b-h1"].ip, 3_000_000
        out = tmp_path / "tcp.jsonl"
        sampler = TcpSampler(out, [TcpTarget("a-h1", net.netns("a-h1")), TcpTarget("b-h1", net.netns("b-h1"))],
                             rate_hz=0.2).start()
        try:
            srv = net.popen("b-h1", [sys.executable, "-c", _RECV, dst], stdout=subprocess.PIPE, text=True)
            time.sleep(0.3)
            cli = net.popen("a-h1", [sys.executable, "-c", _SEND, dst, str(nbytes)])
            assert cli.wait(timeout=30) == 0
            got, _ = srv.communicate(timeout=30)
        finally:
            stats = sampler.stop()
    assert int(got) == nbytes
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert stats["errors"] == {} and stats["ticks"] <= 3, stats
    closed = {r["node"]: r for r in rows if r.get("closed") and f"{dst}:5342" in (r["src"], r["dst"])}
    assert set(closed) == {"a-h1", "b-h1"}, rows
    assert nbytes <= closed["a-h1"]["bytes_acked"] <= nbytes + 2  # + SYN and FIN
    assert nbytes <= closed["b-h1"]["bytes_received"] <= nbytes + 2


#: a sender that fills its send buffer (128 KiB asked, 256 KiB granted: about 2 s at 1 Mbit/s) until killed
_FLOOD = ("import socket,sys;c=socket.create_connection((sys.argv[1],5342))\n"
          "c.setsockopt(socket.SOL_SOCKET,socket.SO_SNDBUF,1<<17);b=b'x'*65536\n"
          "while True: c.sendall(b)")
SLOW = {**SPEC, "name": "tcpkill", "links": [{"a": "a", "b": "b", "rate": "1Mbit"}]}


def test_a_connection_killed_mid_transfer_still_gets_its_closed_line(tmp_path):
    """A trial cut short (timeout, failed worker, Ctrl-C) kills its processes and stops the samplers at once; a killed sender's
    socket lives on, orphaned, draining its send queue over the emulated link before its FIN is
    acknowledged.  The sampler waits for it (``close_grace_s``), so the connection's last line is the
    kernel's final one, ``closed``, with every byte the receiver read.  A second sampler with no grace,
    stopped at the same moment, is the control: it misses the sender's closed line."""
    require_root_tools()
    import sys

    with network(from_dict(SLOW), with_ps=False) as net:
        dst = net.plan.nodes["b-h1"].ip
        targets = [TcpTarget("a-h1", net.netns("a-h1")), TcpTarget("b-h1", net.netns("b-h1"))]
        out, ctl = tmp_path / "tcp.jsonl", tmp_path / "control.jsonl"
        sampler = TcpSampler(out, targets, rate_hz=5).start()
        control = TcpSampler(ctl, targets, rate_hz=5, close_grace_s=0).start()
        srv = net.popen("b-h1", [sys.executable, "-c", _RECV, dst], stdout=subprocess.PIPE, text=True)
        try:
            time.sleep(0.5)
            cli = net.popen("a-h1", [sys.executable, "-c", _FLOOD, dst])
            time.sleep(2.0)
            cli.kill()
            cli.wait(timeout=10)
        finally:
            control_stats = control.stop()
            stats = sampler.stop()
            got, _ = srv.communicate(timeout=30)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    closed = {r["node"]: r for r in rows if r.get("closed") and f"{dst}:5342" in (r["src"], r["dst"])}
    missed = {json.loads(x)["node"] for x in ctl.read_text().splitlines() if json.loads(x).get("closed")}
    print(f"receiver read {got.strip()} bytes; waited {stats['close_wait_s']} s for the closing connection; "
          f"closed lines {sorted(closed)}, control (no grace) {sorted(missed)}")
    assert stats["errors"] == {}, stats
    assert "a-h1" not in missed, "the sender's socket had finished closing before the stop: the test shows nothing"
    assert any("still closing after 0 s" in e for e in control_stats["errors"]), control_stats  # and says so
    assert 0.2 <= stats["close_wait_s"] < 5.0, stats  # a queue's worth at 1 Mbit/s
    assert set(closed) == {"a-h1", "b-h1"}, rows
    n = int(got)
    assert n <= closed["a-h1"]["bytes_acked"] <= n + 2  # + SYN and FIN
    assert n <= closed["b-h1"]["bytes_received"] <= n + 2
