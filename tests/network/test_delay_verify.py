"""net verify's one-way delay rows on a live network: the defined jitter, loss and order pass, and a
daemon changed behind the testbed's back fails exactly the rows its change touches.

Userspace backend (natively; netem's jitter is not yet the defined process, README "Jitter, defined").
Spec: a->b 20 ms +- 4 ms uniform with 2 % loss, b->a 10 ms; a one-way train router to router per
direction (testbed/network/delay_check.py).  The delays are long enough that the userspace daemon's own
0.6-0.8 ms of mean excess (measured, see SD_FLOOR_S) stays inside the mean bar of 0.5 ms + 5 %.
"""

from __future__ import annotations

import pytest

from testbed.network.delay_check import direction_checks
from tests.network.helpers import network, require_root_tools
from topologies.model import from_dict
from traffic_control.userspace import ImpairmentShape

pytestmark = pytest.mark.root

SPEC = {"name": "jit", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
        "links": [{"a": "a", "b": "b",
                   "forward": {"rate": "100Mbit", "delay": "20ms", "jitter": "4ms", "loss": "2%"},
                   "reverse": {"rate": "100Mbit", "delay": "10ms"}}]}


@pytest.fixture(scope="module")
def net():
    from traffic_control.userspace import available

    ok, why = available()
    if not ok:
        pytest.skip(f"userspace backend unavailable: {why}")
    require_root_tools()
    with network(from_dict(SPEC), impairment="userspace", seed=3) as n:
        yield n


def _rows(net, direction: str) -> dict[str, object]:  # noqa: ANN001
    w = net.plan.wans[0]
    if direction == "a->b":
        rows = direction_checks(net, "a->b", w.a_router, w.b_router, w.b_ip, w.forward)
    else:
        rows = direction_checks(net, "b->a", w.b_router, w.a_router, w.a_ip, w.reverse)
    for c in rows:
        e = c.extra
        print(f"MEASURED {c.kind} {c.subject}: {c.measured} (expected {c.expected}) {c.status} "
              f"sent {e.get('sent')} received {e.get('received')}")
    return {c.kind: c for c in rows}


def _daemon(net, what: str):  # noqa: ANN001, ANN202
    return next(imp for imp in net.userspace if imp.point.what == what)


def test_the_defined_distribution_loss_and_order_pass(net):
    fwd, rev = _rows(net, "a->b"), _rows(net, "b->a")
    bad = {k: (c.measured, c.expected) for k, c in fwd.items() if c.status == "fail"}
    assert not bad, bad
    # without jitter the daemon's own release noise is what the sd row sees: 0.5-1.0 ms measured on
    # this machine, above the 1 ms floor at times (README "Jitter, defined"); mean, loss, order hold
    bad = {k: (c.measured, c.expected) for k, c in rev.items() if c.status == "fail" and k != "delay_sd"}
    assert not bad, bad
    print(f"MEASURED userspace release noise, no jitter: sd {rev['delay_sd'].measured * 1e3:.2f} ms")
    assert fwd["loss"].measured >= 40  # loss was really applied (2 % of ~4800 sent: ~96)
    assert fwd["delay_sd"].measured > 0.0015  # jitter really applied (defined sd 2.31 ms)


@pytest.mark.parametrize("change,row", [
    # the interval stays the spec's 40 ms: the train is sized for 60 of the spec's draws, and at the
    # default 10 x jitter (80 ms) it would hold 30, where the sd of 4.62 ms reads below the bar of
    # 3.77 ms about once in 50 runs (sd of a 30-draw estimate: 8 %; CI saw 3.57 ms once)
    ({"jitter_s": 0.008, "interval_s": 0.04}, "delay_sd"),
    ({"loss_pct": 15.0}, "loss"),
    ({"delay_s": 0.016, "jitter_s": 0.0}, "delay_mean"),
], ids=["jitter-doubled", "loss-15pct", "delay-16ms"])
def test_a_daemon_changed_behind_the_testbeds_back_fails_its_row(net, change, row):
    imp = _daemon(net, "a->b")
    was = imp.shape
    imp.change(ImpairmentShape.from_any(was, **change))
    try:
        rows = _rows(net, "a->b")
    finally:
        imp.change(was)
    failed = sorted(k for k, c in rows.items() if c.status == "fail")
    assert row in failed, failed
    # untouched properties still pass: loss and order always; the mean under doubled jitter may
    # stray (its standard error doubles), and a delay without jitter changes the sd as well
    assert not {"loss", "reordering"} & set(failed) - {row}, failed
    if row == "loss":
        assert failed == ["loss"], failed
