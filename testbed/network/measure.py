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

#: TCP payload per wire byte at MTU 1500 with timestamps: 1448 / (1500 + 14 Ethernet header).
TCP_PAYLOAD_FRACTION = 1448 / 1514


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
        cli = net.popen(client, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = cli.communicate(timeout=seconds + omit + 30)
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
