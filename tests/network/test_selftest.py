"""The self-test every trial runs: it passes on a network that is what the spec says, in under 5 s,
and fails, naming the link direction, on one whose shaping was changed behind the testbed's back.

Runs with the userspace backend where it is usable (so the spec's delays are applied and checked,
on a kernel without netem too), else with none (RTT rows skipped, rates still checked).
"""

from __future__ import annotations

import pytest

from testbed.network.selftest import quick_check
from tests.network.helpers import network, require_root_tools
from topologies import load
from traffic_control import netlink as tcnl

pytestmark = pytest.mark.root


def _backend() -> str:
    from traffic_control.userspace import available

    return "userspace" if available()[0] else "none"


@pytest.fixture(scope="module")
def net():
    require_root_tools("ping")
    # at half its rates (100 and 20 Mbit/s): a train at 1.25 x 200 Mbit/s can starve for CPU on a
    # loaded two-core machine (then its row says `info`, which this test would read as a failure)
    with network(load("three_dc_triangle", scale=0.5), impairment=_backend()) as n:
        yield n


def _report(st) -> None:  # noqa: ANN001
    for c in st.checks:
        print(f"MEASURED {c.kind} {c.subject}: {c.measured} (spec {c.expected}) {c.status} {c.extra.get('ratio', '')}")
    print(f"MEASURED self-test {st.seconds:.2f} s, faithful {st.faithful}")


def test_a_network_as_specified_passes_in_under_five_seconds(net):
    st = quick_check(net)
    _report(st)
    assert st.error is None, st.error
    rates = [c for c in st.checks if c.kind == "link_rate"]
    rtts = [c for c in st.checks if c.kind == "link_rtt"]
    assert len(rates) == 6 and len(rtts) == 3
    assert all(c.status == "pass" for c in rates), [(c.subject, c.extra) for c in rates]
    want = "pass" if net.impairment.backend == "userspace" else "skipped"
    assert all(c.status == want for c in rtts), [(c.subject, c.measured, c.expected) for c in rtts]
    assert st.faithful and st.problems == []
    assert st.seconds < 5.0  # the bar on the bundled topologies
    d = st.to_dict()
    # and the read-backs: one packets row, a queue_limit row per shaped direction
    assert d["faithful"] is True and len(d["checks"]) == 9 + 1 + 6
    assert {c.kind for c in st.checks if c.status == "pass"} == {"packets", "queue_limit", "link_rate", "link_rtt"} \
        or want == "skipped"


@pytest.mark.parametrize("factor", [0.5, 2.0], ids=["slower", "faster"])
def test_a_rate_changed_behind_the_testbeds_back_is_caught(net, factor):
    """Slower than the spec, and faster (as a missing shaper would be: the train shows it, TCP could not)."""
    w = next(w for w in net.plan.wans if {w.a, w.b} == {"east", "central"})
    slow = w.forward.with_changes(rate_bps=w.forward.rate_bps * factor)
    tcnl.change(w.a_if, w.forward, slow, netns=net.netns(w.a_router), netem=False)
    try:
        st = quick_check(net)
    finally:
        tcnl.change(w.a_if, slow, w.forward, netns=net.netns(w.a_router), netem=False)
    _report(st)
    # the rate row fails, and the queue limit row of the same direction: the limit went with the new rate
    assert {(c.kind, c.subject) for c in st.checks if c.status == "fail"} == {
        ("link_rate", f"{w.a}->{w.b}"), ("queue_limit", f"{w.a}->{w.b}")}, [(c.subject, c.status) for c in st.checks]
    bad = [c for c in st.checks if c.status == "fail" and c.kind == "link_rate"]
    assert bad[0].extra["attempts"] == 2  # a wrong link fails its retry too
    if factor < 1:
        assert bad[0].measured == pytest.approx(w.forward.rate_bps * factor, rel=0.05)
    else:  # the train is sent at 1.25 x the spec: that is what an over-fast link passes
        assert bad[0].measured > 1.15 * w.forward.rate_bps
    assert not st.faithful and any(p.startswith(f"{w.a}->{w.b}: rate") for p in st.problems), st.problems
    again = quick_check(net)
    _report(again)
    assert again.faithful, again.problems  # restored: the check says so again
