"""Shaped rate on a live network (HTB only: no netem needed) and a run-time rate change under load."""

from __future__ import annotations

import time

import pytest

from testbed.network.measure import TCP_PAYLOAD_FRACTION, iperf3
from tests.network.helpers import (
    iperf3_finish,
    iperf3_live,
    network,
    require_root_tools,
)
from topologies import from_dict

pytestmark = pytest.mark.root

RATE = 20e6
#: The hosts run the default, cubic.  Before packets were wire-sized (GSO super-packets of up to 64 KiB in a
#: queue of 64 skbs) cubic's loss recoveries on this delay-free link ended in 200 ms retransmission timeouts
#: and one flow got 0.87-0.96 of the rate; with wire-sized packets 1.005 (README "Queues").
SPEC = {"name": "shape2", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
        "links": [{"a": "a", "b": "b", "rate": "20Mbit"}]}


@pytest.fixture(scope="module")
def net():
    require_root_tools("iperf3")
    with network(from_dict(SPEC), with_ps=False) as n:
        yield n


def _ip(net, node):
    return net.plan.nodes[node].ip


def test_goodput_matches_the_shaped_rate(net):
    ideal = RATE * TCP_PAYLOAD_FRACTION
    res = iperf3(net, "a-h1", "b-h1", _ip(net, "b-h1"), seconds=4, omit=1)
    ratio = res["bps"] / ideal
    assert 0.9 <= ratio <= 1.02, f"goodput {res['bps'] / 1e6:.2f} Mbit/s = {ratio:.3f} x ideal"
    # and the other direction, which has its own HTB on the other router
    res = iperf3(net, "b-h1", "a-h1", _ip(net, "a-h1"), seconds=3, omit=1, port=5202)
    assert 0.9 <= res["bps"] / ideal <= 1.02


def wire_bps(net, node: str, ifname: str, seconds: float) -> float:
    """Bits/s the interface sent over ``seconds`` (kernel counters: what the shaper let out, L2 bytes)."""
    from traffic_control.netlink import link_counters

    ns = net.netns(node)
    c0, t0 = link_counters(ifname, netns=ns)["tx_bytes"], time.monotonic()
    time.sleep(seconds)
    c1, t1 = link_counters(ifname, netns=ns)["tx_bytes"], time.monotonic()
    return (c1 - c0) * 8 / (t1 - t0)


def test_rate_change_on_a_live_connection(net):
    """A bulk TCP flow crosses the link; the rate doubles under it; the link's egress carries the old, then the
    new rate (its kernel counters, 2 s windows), on the same connection.  Not iperf3's per-interval reports:
    the receiving client's 0.5 s intervals read up to 1.45 x the rate right after a change on this loaded
    machine while the egress counters never exceeded it (measured), so they time the reader, not the link."""
    link = net.plan.wans[0]
    old = link.forward
    srv, cli = iperf3_live(net, "a-h1", "b-h1", _ip(net, "a-h1"), seconds=7, interval=0.5, port=5213)
    try:
        time.sleep(1.0)
        before = wire_bps(net, link.a_router, link.a_if, 2.0)
        net.change_link("a", "b", old.with_changes(rate_bps=2 * RATE))
        time.sleep(0.8)
        after = wire_bps(net, link.a_router, link.a_if, 2.5)
    except BaseException:
        cli.kill()
        raise
    try:
        data = iperf3_finish(srv, cli, timeout=30)
        assert before / RATE == pytest.approx(1.0, abs=0.12)
        assert after / (2 * RATE) == pytest.approx(1.0, abs=0.12)
        # one connection from start to end: the change did not break it, and it carried the bytes
        assert len(data["start"]["connected"]) == 1
        assert data["end"]["sum_sent"]["seconds"] >= 6.5
        goodput = data["end"]["sum_received"]["bits_per_second"]
        assert RATE * TCP_PAYLOAD_FRACTION * 0.9 <= goodput <= 2 * RATE
        got = net.read_back()[f"{link.a_router}:{link.a_if}"]["shape"]
        assert got["rate_bps"] == pytest.approx(2 * RATE)
    finally:
        net.change_link("a", "b", old)
    assert net.read_back()[f"{link.a_router}:{link.a_if}"]["shape"]["rate_bps"] == pytest.approx(RATE)


def test_schedule_plays_rate_changes_and_link_events(net):
    """A CSV link trace played against the running network: rate changes and a down/up event."""
    from testbed.network.measure import ping
    from traffic_control import netlink as tcnl
    from traffic_control.schedule import parse_schedule

    link = net.plan.wans[0]
    original = link.forward
    events = parse_schedule("time,link,rate,delay,jitter,loss,state\n"
                            "0.2,a->b,5Mbit,,,,\n"
                            "0.6,a-b,,,,,down\n"
                            "1.4,a-b,,,,,up\n")
    try:
        player = net.play(events)
        time.sleep(0.45)
        assert tcnl.show(link.a_if, netns=net.netns(link.a_router))["shape"]["rate_bps"] == 5e6
        assert tcnl.show(link.b_if, netns=net.netns(link.b_router))["shape"]["rate_bps"] == RATE  # a->b only
        time.sleep(0.4)  # link is down now
        assert ping(net, "a-h1", _ip(net, "b-h1"), count=3, interval=0.1).received == 0
        assert player.wait(timeout=5)
        assert player.errors == []
        assert [round(t, 1) >= ev.time_s for t, ev in player.applied] == [True, True, True]
        assert ping(net, "a-h1", _ip(net, "b-h1"), count=3, interval=0.1).received == 3
    finally:
        net.set_link_up("a", "b", True)
        net.change_link("a", "b", original)


def test_schedule_errors_name_the_row():
    from traffic_control.errors import ValidationError
    from traffic_control.schedule import parse_schedule

    with pytest.raises(ValidationError) as e:
        parse_schedule("time,link,rate\n1,a->b,fast\n")
    assert e.value.field == "schedule[row 2].rate"
    with pytest.raises(ValidationError) as e:
        parse_schedule("time,link,rate\n2,a->b,1Mbit\n1,a->b,2Mbit\n")
    assert "backwards" in e.value.problem
