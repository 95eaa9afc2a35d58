"""traffic_control.netlink against the real kernel: apply, show, change (in place), clear; no 1 Gbit/s cap.

Runs in a scratch namespace ``tb-tcnl`` with a veth pair inside it, so it needs
root but no netem (rate-only shapes, or netem=False leaves).
"""

from __future__ import annotations

import subprocess

import pytest
from pyroute2 import NetNS, netns

from traffic_control import LinkShape
from traffic_control import netlink as tcnl
from traffic_control.errors import TrafficControlError

pytestmark = pytest.mark.root

NS = "tb-tcnl"


@pytest.fixture(scope="module")
def veth():
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root")
    if NS in netns.listnetns():
        netns.remove(NS)
    netns.create(NS)
    try:
        with NetNS(NS) as ns:
            ns.link("add", ifname="v0", kind="veth", peer={"ifname": "v1"})
            for i, name in enumerate(("v0", "v1")):
                idx = ns.link_lookup(ifname=name)[0]
                ns.addr("add", index=idx, address=f"10.99.0.{i + 1}", prefixlen=24)
                ns.link("set", index=idx, state="up")
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
        yield NS
    finally:
        netns.remove(NS)


def _ping_through_v0(count: int = 5) -> None:
    # bound to v0 (SO_BINDTODEVICE): the requests and ARP leave through v0's qdisc
    subprocess.run(["ip", "netns", "exec", NS, "ping", "-c", str(count), "-i", "0.01", "-I", "v0", "-W", "1",
                    "10.99.0.2"], capture_output=True, timeout=20)


@pytest.mark.parametrize("rate", [20e6, 1e9, 5e9, 40e9])
def test_apply_and_read_back(veth, rate):
    s = LinkShape(rate_bps=rate)
    tcnl.apply("v0", s, netns=veth)
    got = tcnl.show("v0", netns=veth)
    assert got["shape"]["rate_bps"] == pytest.approx(rate, rel=1e-6)
    assert got["shape"]["burst_bytes"] == pytest.approx(s.burst_bytes, rel=2e-3)
    assert got["shape"]["limit"] == s.netem_limit
    kinds = sorted((q["kind"], q["handle"], q["parent"]) for q in got["qdiscs"])
    assert kinds == [("htb", "1:", "root"), ("pfifo", "10:", "1:1")]
    cls = got["classes"][0]
    assert cls["ceil_bps"] == pytest.approx(rate, rel=1e-6)


def test_tc_tool_agrees_for_rate64(veth):
    tcnl.apply("v0", LinkShape(rate_bps=40e9), netns=veth)
    out = subprocess.run(["ip", "netns", "exec", veth, "tc", "class", "show", "dev", "v0"],
                         capture_output=True, text=True, check=True).stdout
    assert "rate 40Gbit" in out and "ceil 40Gbit" in out


def test_change_is_in_place(veth):
    old = LinkShape(rate_bps=100e6)
    tcnl.apply("v0", old, netns=veth)
    _ping_through_v0()
    before = tcnl.show("v0", netns=veth)
    root_before = next(q for q in before["qdiscs"] if q["kind"] == "htb")["stats"]
    assert root_before["packets"] > 0
    new = LinkShape(rate_bps=7e9, limit=4321)
    tcnl.change("v0", old, new, netns=veth)
    after = tcnl.show("v0", netns=veth)
    assert after["shape"]["rate_bps"] == pytest.approx(7e9)
    assert after["shape"]["limit"] == 4321
    assert after["shape"]["burst_bytes"] == pytest.approx(new.burst_bytes, rel=2e-3)
    root_after = next(q for q in after["qdiscs"] if q["kind"] == "htb")["stats"]
    # a delete-and-re-add would have reset the counters
    assert root_after["packets"] >= root_before["packets"]
    cls_after = after["classes"][0]["stats"]
    assert cls_after["packets"] >= before["classes"][0]["stats"]["packets"] > 0


def test_clear_and_clear_again(veth):
    tcnl.apply("v0", LinkShape(rate_bps=10e6), netns=veth)
    tcnl.clear("v0", netns=veth)
    got = tcnl.show("v0", netns=veth)
    assert not got["classes"] and "rate_bps" not in got["shape"]
    tcnl.clear("v0", netns=veth)  # idempotent


def test_apply_replaces_whatever_was_there(veth):
    tcnl.apply("v0", LinkShape(rate_bps=10e6), netns=veth)
    tcnl.apply("v0", LinkShape(rate_bps=30e6), netns=veth)
    assert tcnl.show("v0", netns=veth)["shape"]["rate_bps"] == pytest.approx(30e6)


def test_netem_skipped_leaf_is_pfifo(veth):
    s = LinkShape(rate_bps=50e6, delay_s=0.02, loss_pct=1)
    tcnl.apply("v0", s, netns=veth, netem=False)
    got = tcnl.show("v0", netns=veth)
    assert {q["kind"] for q in got["qdiscs"]} == {"htb", "pfifo"}
    assert got["shape"]["limit"] == s.netem_limit


def test_missing_interface_is_reported(veth):
    with pytest.raises(TrafficControlError):
        tcnl.apply("nope0", LinkShape(rate_bps=1e6), netns=veth)


def test_counters_and_link_state(veth):
    c = tcnl.link_counters("v0", netns=veth)
    assert set(c) >= {"tx_bytes", "rx_bytes", "tx_packets"}
    tcnl.set_link_state("v1", False, netns=veth)
    tcnl.set_link_state("v1", True, netns=veth)


@pytest.mark.parametrize("shape", [
    LinkShape(rate_bps=50e6, delay_s=0.02),
    LinkShape(rate_bps=50e6, delay_s=0.02, jitter_s=0.004),  # in order: netem rate
    LinkShape(rate_bps=50e6, delay_s=0.02, jitter_s=0.004, reorder=True),
    LinkShape(rate_bps=50e6, loss_pct=2.0),
], ids=["delay", "jitter-in-order", "jitter-reorder", "loss"])
def test_netem_requests_reach_the_kernel(veth, shape):
    """Every netem variant encodes and is sent: installed where the kernel has netem,
    CapabilityMissing (never an encoding error) where it has not."""
    from traffic_control.capabilities import probe_kernel
    from traffic_control.errors import CapabilityMissing

    if probe_kernel()["netem"].ok:
        tcnl.apply("v0", shape, netns=veth)
        got = tcnl.show("v0", netns=veth)["shape"]
        assert got["delay_s"] == pytest.approx(shape.delay_s, abs=2e-6)
        assert got["loss_pct"] == pytest.approx(shape.loss_pct, abs=1e-6)
        if shape.jitter_s:
            assert got["reorder"] == shape.reorder
            # and the reorder switch changes in place, both ways
            other = shape.with_changes(reorder=not shape.reorder)
            tcnl.change("v0", shape, other, netns=veth)
            assert tcnl.show("v0", netns=veth)["shape"]["reorder"] == other.reorder
    else:
        with pytest.raises(CapabilityMissing):
            tcnl.apply("v0", shape, netns=veth)
        # nothing half-built is left behind
        assert not tcnl.show("v0", netns=veth)["classes"]
