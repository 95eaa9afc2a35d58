"""Measurements inside the emulated network: ping RTT and iperf3 goodput.

Both run as real processes in the nodes' namespaces (through Mininet's
``popen``) so that what is measured is what training traffic sees.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from traffic_control.shape import tcp_payload_fraction

#: TCP payload per wire byte at MTU 1500 with timestamps: 1448 / (1500 + 14 Ethernet header)
#: (other MTUs: :func:`traffic_control.shape.tcp_payload_fraction`).
TCP_PAYLOAD_FRACTION = tcp_payload_fraction(1500)


@dataclass
class PingResult:
    sent: int
    received: int
    min_s: float
    avg_s: float
    max_s: float
    mdev_s: float
    rtts_s: list[float]

    @property
    def loss_pct(self) -> float:
        return 100.0 * (self.sent - self.received) / self.sent if self.sent else 0.0

    def joined(self, other: PingResult) -> PingResult:
        """Both trains as one sample (min, mean, max and mdev over every reply)."""
        rtts = self.rtts_s + other.rtts_s
        if not rtts:
            return PingResult(self.sent + other.sent, 0, *(float("nan"),) * 4, [])
        mean = sum(rtts) / len(rtts)
        mdev = (sum((r - mean) ** 2 for r in rtts) / len(rtts)) ** 0.5
        return PingResult(self.sent + other.sent, self.received + other.received, min(rtts), mean, max(rtts),
                          mdev, rtts)


def parse_ping(text: str) -> PingResult:
    rtts = [float(x) / 1e3 for x in re.findall(r"time=([0-9.]+) ms", text)]
    m = re.search(r"(\d+) packets transmitted, (\d+) received", text)
    sent, received = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    s = re.search(r"= ([0-9.]+)/([0-9.]+)/([0-9.]+)/([0-9.]+) ms", text)
    if s:
        mn, avg, mx, md = (float(x) / 1e3 for x in s.groups())
    else:
        mn = avg = mx = md = float("nan")
    return PingResult(sent, received, mn, avg, mx, md, rtts)


def ping(net: Any, src: str, dst_ip: str, count: int = 20, interval: float = 0.05,
         size: int = 56, timeout: float | None = None) -> PingResult:
    """``ping`` from node ``src``; interval below 0.2 s needs root (the testbed runs as root)."""
    argv = ["ping", "-n", "-q" if count > 200 else "-n", "-c", str(count), "-i", str(interval), "-s", str(size),
            "-W", "2", dst_ip]
    p = net.popen(src, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = p.communicate(timeout=timeout or (count * interval + 10))
    return parse_ping(out)


#: How long iperf3's client keeps trying a server that refuses the connection (not listening yet).
SERVER_START_S = 15.0


def iperf3(net: Any, client: str, server: str, server_ip: str, seconds: float = 3.0, port: int = 5201,
           udp_rate: str | None = None, omit: float = 1.0) -> dict[str, Any]:
    """TCP (or UDP) goodput client -> server in bit/s, from iperf3's own JSON report."""
    srv = net.popen(server, ["iperf3", "-s", "-1", "-p", str(port), "-B", server_ip],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.2)
        argv = ["iperf3", "-c", server_ip, "-p", str(port), "-t", str(seconds), "-O", str(omit), "-J"]
        if udp_rate:
            argv += ["-u", "-b", udp_rate]
        # a server on another server (testbed.cluster.view) starts over ssh: up to a second or two, so a
        # refused connection is tried again while the server process lives (a refusal costs no traffic)
        deadline = time.monotonic() + SERVER_START_S
        while True:
            cli = net.popen(client, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            out, err = cli.communicate(timeout=seconds + omit + 30)
            if "Connection refused" not in out or srv.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        srv.kill()
        srv.wait()
    try:
        data = json.loads(out)
    except json.JSONDecodeError:
        raise RuntimeError(f"iperf3 {client}->{server} failed: {err.strip() or out.strip()[:200]}") from None
    if "error" in data:
        raise RuntimeError(f"iperf3 {client}->{server}: {data['error']}")
    end = data["end"]
    if udp_rate:
        s = end["sum"]
        return {"bps": s["bits_per_second"], "lost_pct": s.get("lost_percent", 0.0), "packets": s.get("packets", 0)}
    return {"bps": end["sum_received"]["bits_per_second"], "retransmits": end["sum_sent"].get("retransmits", 0)}


def receiver_then_sender(net: Any, what: str, rx_node: str, rx_argv: list[str], tx_node: str, tx_argv: list[str],
                         tx_timeout: float, rx_timeout: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start a probe receiver (it prints ``ready``, later one JSON line), then its sender; both JSON results.

    The pattern of the stdlib probe trains (``udp_train.py``, ``owd_train.py``):
    the receiver must be bound before the first datagram leaves.  The
    receiver is killed if it outlives the exchange; a probe that prints no
    JSON is a :class:`RuntimeError` naming ``what`` and the tail of its stderr.
    The receiver's stdin is a pipe, closed (by ``communicate``) once the
    sender exited: only then may an idle gap end the train, since a sender
    descheduled mid-train on a loaded machine is not the train's end.
    """
    rx = net.popen(rx_node, rx_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   text=True)
    try:
        ready = rx.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"{what}: receiver in {rx_node} did not start: {ready or rx.stderr.read()[-300:]}")
        tx = net.popen(tx_node, tx_argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sent_out, sent_err = tx.communicate(timeout=tx_timeout)
        got_out, got_err = rx.communicate(timeout=rx_timeout)
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    try:
        return json.loads(sent_out), json.loads(got_out)
    except ValueError:
        raise RuntimeError(f"{what} failed: {(sent_err or got_err).strip()[-300:]}") from None
