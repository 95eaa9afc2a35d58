"""A throw-away line of network namespaces to measure this backend on a host.

``host a -- r1 -- ... -- rN -- host b``, IPv4 only, one /24 per hop.  The
tests and ``benchmarks/userspace_bench.py`` use it; ``testbed doctor`` may use
it for a self-check.  It creates only namespaces named ``<prefix>-...`` and
deletes only those, so it can run next to other experiments on one machine.

The "WAN" interfaces are the router-to-router ones; with a single router
(no router-to-router hop) its two interfaces play that part, so one router
suffices to exercise both directions of one link.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from typing import Any

NET = "10.77"


class Chain:
    """Namespaces ``<prefix>-a``, ``<prefix>-r1..rN``, ``<prefix>-b`` joined by veth pairs."""

    def __init__(self, routers: int = 1, prefix: str | None = None) -> None:
        if routers < 1:
            raise ValueError("need at least one router")
        self.routers = routers
        self.prefix = prefix or f"uqt{os.getpid() % 100000}"
        self.nodes = ["a", *[f"r{i}" for i in range(1, routers + 1)], "b"]
        self._created: list[str] = []

    # ------------------------------------------------------------ naming
    def ns(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def addr(self, node: str) -> str:
        """The address of host ``a`` or ``b``."""
        return f"{NET}.0.1" if node == "a" else f"{NET}.{self.routers}.2"

    def wan(self) -> list[tuple[str, str]]:
        """``(router node, ifname)`` of every impaired egress, forward (a->b) hops first."""
        if self.routers == 1:
            return [("r1", "right"), ("r1", "left")]
        fwd = [(f"r{i}", "right") for i in range(1, self.routers)]
        rev = [(f"r{i}", "left") for i in range(2, self.routers + 1)]
        return fwd + rev

    # ------------------------------------------------------------ commands
    def argv(self, node: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(node), *argv]

    def run(self, node: str, argv: Sequence[str], check: bool = True, timeout: float = 60,
            **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(node, argv), capture_output=True, text=True, check=check,
                              timeout=timeout, **kw)

    def popen(self, node: str, argv: Sequence[str], **kw: Any) -> subprocess.Popen[str]:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        return subprocess.Popen(self.argv(node, argv), text=True, **kw)

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)

    # ------------------------------------------------------------ build/destroy
    def build(self) -> Chain:
        try:
            for node in self.nodes:
                self._ip("netns", "add", self.ns(node))
                self._created.append(self.ns(node))
                self.run(node, ["ip", "link", "set", "lo", "up"])
                self.run(node, ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"], check=False)
            for hop in range(self.routers + 1):
                left, right = self.nodes[hop], self.nodes[hop + 1]
                lname = "eth0" if left == "a" else "right"
                rname = "eth0" if right == "b" else "left"
                self._ip("link", "add", lname, "netns", self.ns(left), "type", "veth",
                         "peer", "name", rname, "netns", self.ns(right))
                for node, name, host in ((left, lname, 1), (right, rname, 2)):
                    self.run(node, ["ip", "addr", "add", f"{NET}.{hop}.{host}/24", "dev", name])
                    self.run(node, ["ip", "link", "set", name, "up"])
            self.run("a", ["ip", "route", "add", "default", "via", f"{NET}.0.2"])
            self.run("b", ["ip", "route", "add", "default", "via", f"{NET}.{self.routers}.1"])
            for i in range(1, self.routers + 1):
                node = f"r{i}"
                self.run(node, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
                for hop in range(self.routers + 1):
                    if hop < i - 1:
                        self.run(node, ["ip", "route", "add", f"{NET}.{hop}.0/24", "via", f"{NET}.{i - 1}.1"])
                    elif hop > i:
                        self.run(node, ["ip", "route", "add", f"{NET}.{hop}.0/24", "via", f"{NET}.{i}.2"])
        except BaseException:
            self.destroy()
            raise
        return self

    def destroy(self) -> None:
        """Delete the namespaces this object created (their veths go with them)."""
        for name in reversed(self._created):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20, check=False)
        self._created.clear()

    def __enter__(self) -> Chain:
        return self.build()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # ------------------------------------------------------------ measuring
    def ping(self, count: int, interval: float = 0.02, src: str = "a", size: int = 56,
             timeout: float = 60) -> dict[str, float]:
        """``min/avg/max/mdev`` RTT (ms) and ``loss`` (%) of ``ping`` from ``src`` to the other host."""
        dst = self.addr("b" if src == "a" else "a")
        out = self.run(src, ["ping", "-q", "-n", "-c", str(count), "-i", str(interval), "-s", str(size),
                             "-W", "2", dst], check=False, timeout=timeout).stdout
        return parse_ping(out)

    def set_htb(self, node: str, ifname: str, rate_bps: float) -> None:
        """An HTB root with one default class at ``rate_bps`` (the kernel rate limit)."""
        rate = f"{int(rate_bps)}bit"
        burst = max(int(rate_bps / 8 * 0.001), 64 * 1024)
        self.run(node, ["tc", "qdisc", "replace", "dev", ifname, "root", "handle", "1:", "htb", "default", "1"])
        self.run(node, ["tc", "class", "replace", "dev", ifname, "parent", "1:", "classid", "1:1", "htb",
                        "rate", rate, "ceil", rate, "burst", str(burst), "cburst", str(burst)])


def parse_ping(text: str) -> dict[str, float]:
    """Numbers from ping's summary lines (NaN RTTs when nothing came back)."""
    res = {"min": float("nan"), "avg": float("nan"), "max": float("nan"), "mdev": float("nan"),
           "loss": 100.0, "sent": 0.0, "received": 0.0}
    m = re.search(r"(\d+) packets transmitted, (\d+) (?:packets )?received", text)
    if m:
        res["sent"], res["received"] = float(m.group(1)), float(m.group(2))
        res["loss"] = 100.0 * (1 - res["received"] / res["sent"]) if res["sent"] else 100.0
    m = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms", text)
    if m:
        res.update(zip(("min", "avg", "max", "mdev"), map(float, m.groups()), strict=True))
    return res
