"""Fixtures for the userspace impairment tests: namespace chains named ``uqt<pid>-*``.

Each fixture deletes exactly the namespaces it created, in teardown, even
when a test fails; other experiments on the same machine are not touched.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from traffic_control.userspace import cleanup
from traffic_control.userspace.lab import Chain

#: the netem tests' UDP probe: numbered datagrams, their order and loss (one JSON line per side)
PROBE = str(Path(__file__).resolve().parents[1] / "netem" / "udp_probe.py")


def _can_run() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("ip", "iptables", "iptables-save", "nsenter", "ping"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    return None


@pytest.fixture(scope="module")
def chain() -> Iterator[Chain]:
    """a -- r1 -- b; r1's two interfaces are the impaired egresses (one per direction)."""
    why = _can_run()
    if why:
        pytest.skip(why)
    c = Chain(routers=1, prefix=f"uqt{os.getpid() % 100000}s").build()
    try:
        yield c
    finally:
        cleanup(c.ns("r1"))
        c.destroy()


@pytest.fixture(scope="module")
def relay_chain() -> Iterator[Chain]:
    """a -- r1 -- r2 -- r3 -- b: two WAN links, traffic relayed through r2."""
    why = _can_run()
    if why:
        pytest.skip(why)
    c = Chain(routers=3, prefix=f"uqt{os.getpid() % 100000}m").build()
    try:
        yield c
    finally:
        for node in ("r1", "r2", "r3"):
            cleanup(c.ns(node))
        c.destroy()


def udp_recv_argv(port: int, expected: int, idle_s: float) -> list[str]:
    """The probe's receiver (in a namespace): ``READY``, then one JSON line with ``seqs`` in arrival order,
    once ``expected`` arrived or ``idle_s`` after its stdin was closed (the sender is done)."""
    return [sys.executable, PROBE, "recv", "0.0.0.0", str(port), str(expected), str(idle_s)]


def udp_send_argv(dst: str, port: int, count: int, gap_s: float) -> list[str]:
    """The probe's sender: ``count`` datagrams numbered from 0, ``gap_s`` apart, 143-byte IP packets."""
    return [sys.executable, PROBE, "send", dst, str(port), str(count), "1", str(gap_s), "115"]
