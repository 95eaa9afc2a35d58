"""Duplication and corruption (netem only: the userspace daemons hold packet ids, not payloads).

Runs in the kernel lab (``make test`` does); natively the userspace backend
refuses these fields before building (``tests/unit/test_loss_models.py``,
``tests/network/test_payload_refusal.py``).  One link between two routers::

    x --(100M, 2 ms; x->y duplicate 5 %, y->x corrupt 5 %)-- y --(100G, 1 ms +- 0.5 ms, in order)-- z

(the last link only for its read-back: rates past 2^32 - 1 bytes/s need the
kernel's 64-bit attributes, and the lab cannot carry 100 Gbit/s)

Bounds: 4 binomial standard deviations.  A corrupted frame has one bit
flipped at a random byte of its headers and payload; the receiver's IP header
or UDP checksum drops it (counted in the receiving namespace's
``/proc/net/snmp``), except a flip in the source MAC address (6 of the
1042-byte frames sent here), which arrives intact.
"""

from __future__ import annotations

import math
import subprocess

import pytest

from tests.netem.test_netem import _netem_ok, peer_ip, probe, report, router
from topologies import from_dict

pytestmark = [pytest.mark.netem, pytest.mark.root]

SPEC = {"name": "payload", "dcs": [{"name": "x", "hosts": 0}, {"name": "y", "hosts": 0}, {"name": "z", "hosts": 0}],
        "links": [{"a": "x", "b": "y", "rate": "100Mbit", "delay": "2ms", "forward": {"duplicate": "5%"},
                   "reverse": {"corrupt": "5%"}},
                  {"a": "y", "b": "z", "rate": "100Gbit", "delay": "1ms", "jitter": "0.5ms"}]}
SIZE = 1000  # UDP payload bytes; frame = SIZE + 8 + 20 + 14


@pytest.fixture(scope="module")
def net():
    ok, why = _netem_ok()
    if not ok:
        pytest.skip(f"netem not usable here ({why}); run inside the kernel lab (`testbed lab -- python -m pytest "
                    "-m netem tests/netem`)")
    from testbed.network.emulation import EmulatedNetwork

    n = EmulatedNetwork(from_dict(SPEC), impairment="netem", with_ps=False, seed=11)
    n.start()
    try:
        yield n
    finally:
        n.stop()


def stream(net, src: str, dst: str, count: int, expect: int, port: int) -> dict:
    """``count`` datagrams of SIZE bytes from router ``src`` to router ``dst`` (4 ms per 20)."""
    return probe(net, router(src), router(dst), peer_ip(net, src, dst), count, 20, 0.004, port=port, size=SIZE,
                 expect=expect)


def snmp(net, node: str) -> dict[str, int]:
    """The node's IP and UDP counters (its namespace's /proc/net/snmp)."""
    text = subprocess.run(["ip", "netns", "exec", net.netns(node), "cat", "/proc/net/snmp"], capture_output=True,
                          text=True, check=True).stdout
    out: dict[str, int] = {}
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    for head, vals in zip(lines[::2], lines[1::2]):
        proto = head[0].rstrip(":")
        for k, v in zip(head[1:], vals[1:]):
            try:
                out[f"{proto}.{k}"] = int(v)
            except ValueError:
                pass
    return out


def bound(n: int, p: float) -> float:
    return 4 * math.sqrt(n * p * (1 - p))


def test_read_back_has_duplicate_and_corrupt(net):
    rb = net.read_back()
    w = net.plan.wans[0]
    fwd, rev = rb[f"{w.a_router}:{w.a_if}"]["shape"], rb[f"{w.b_router}:{w.b_if}"]["shape"]
    assert fwd["duplicate_pct"] == pytest.approx(5, abs=1e-6) and fwd["corrupt_pct"] == 0
    assert rev["corrupt_pct"] == pytest.approx(5, abs=1e-6) and rev["duplicate_pct"] == 0


def test_rates_past_34_gbit_read_back_whole(net):
    """HTB at 100 Gbit/s (rate64) and netem's order-keeping rate at 4 x that (netem's rate64)."""
    rb = net.read_back()
    w = net.plan.wans[1]
    for node, ifn in ((w.a_router, w.a_if), (w.b_router, w.b_if)):
        info = rb[f"{node}:{ifn}"]
        assert info["shape"]["rate_bps"] == pytest.approx(100e9)
        netem = next(q for q in info["qdiscs"] if q["kind"] == "netem")
        assert netem["rate_bps"] == pytest.approx(400e9)


def test_duplicate_sends_the_spec_share_twice(net):
    n, p = 4000, 0.05
    r = stream(net, "x", "y", n, 2 * n, 7720)  # the receiver stops when idle, duplicates included
    dups = r["received"] - r["unique"]
    report("duplicate x->y", f"{dups} duplicates of {n} (expected {n * p:.0f} +- {bound(n, p):.0f})")
    assert r["unique"] == n
    assert abs(dups - n * p) <= bound(n, p)


def test_corrupt_flips_bits_the_receiver_drops(net):
    n, p = 4000, 0.05
    frame = SIZE + 42
    before = snmp(net, router("x"))
    r = stream(net, "y", "x", n, n, 7721)
    after = snmp(net, router("x"))
    lost = n - r["unique"]
    caught = sum(after.get(k, 0) - before.get(k, 0) for k in ("Udp.InCsumErrors", "Ip.InHdrErrors", "Ip.InAddrErrors"))
    lo, hi = n * p * (1 - 6 / frame), n * p  # a flipped source MAC bit arrives intact
    report("corrupt y->x", f"{lost} of {n} lost (expected {lo:.0f}-{hi:.0f} +- {bound(n, p):.0f}); "
           f"{caught} counted by the receiver's IP/UDP checksum counters")
    assert r["received"] == r["unique"]
    assert lo - bound(n, p) <= lost <= hi + bound(n, p)
    # the loss is corruption caught by checksums (14 of 1042 bytes are the Ethernet header, not counted there)
    assert caught >= 0.8 * lost and caught <= lost
