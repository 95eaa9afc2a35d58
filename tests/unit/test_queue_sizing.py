"""Queue limits from the round trip of the flows through a queue, and the ``gso`` switch (README "Queues")."""

from __future__ import annotations

import pytest

from testbed.network.addressing import plan_network
from topologies import from_dict, load
from traffic_control.errors import ValidationError
from traffic_control.shape import LinkShape

RELAY = {"name": "relay", "dcs": [{"name": "a", "hosts": 1, "lan": {"delay": "1ms"}}, {"name": "b", "hosts": 0},
                                  {"name": "c", "hosts": 1}],
         "links": [{"a": "a", "b": "b", "rate": "100Mbit", "delay": "1ms"},
                   {"a": "b", "b": "c", "forward": {"rate": "1Gbit", "delay": "30ms"},
                    "reverse": {"rate": "1Gbit", "delay": "20ms"}}]}


def test_queue_rtt_is_the_longest_round_trip_through_each_direction():
    rtts = from_dict(RELAY).queue_rtts()
    # a <-> c: 1 + 30 one way, 20 + 1 back, and a's LAN delay twice each way (host -> router, router -> host)
    a_c = 0.001 + 0.030 + 0.020 + 0.001 + 2 * 0.001
    assert rtts[("a", "b")] == pytest.approx(a_c) and rtts[("b", "a")] == pytest.approx(a_c)
    assert rtts[("b", "c")] == pytest.approx(a_c) and rtts[("c", "b")] == pytest.approx(a_c)
    assert rtts[("a", "a")] == pytest.approx(a_c)  # a's LAN carries a's flows to c
    assert rtts[("b", "b")] == pytest.approx(0.050)  # b <-> c: 30 + 20 ms, no LAN delay on either side


def test_a_chord_no_route_uses_keeps_its_own_sizing():
    tri = {"name": "t", "dcs": ["a", "b", "c"],
           "links": [{"a": "a", "b": "b", "delay": "1ms"}, {"a": "b", "b": "c", "delay": "1ms"},
                     {"a": "a", "b": "c", "rate": "10Mbit", "delay": "50ms"}]}
    topo = from_dict(tri)
    assert ("a", "c") not in topo.queue_rtts()  # least delay goes a-b-c
    plan = plan_network(topo)
    chord = next(w for w in plan.wans if (w.a, w.b) == ("a", "c"))
    assert chord.forward.queue_rtt_s is None
    assert chord.forward.netem_limit == topo.links[2].forward.netem_limit


def test_plan_limits_cover_the_path_bdp_with_headroom():
    plan = plan_network(from_dict(RELAY))
    first = plan.wans[0].forward
    assert first.queue_rtt_s == pytest.approx(0.054)
    # held for its own 1 ms + one round trip of 54 ms, in 1500-byte packets, x headroom 2
    assert first.netem_limit == pytest.approx(2 * 100e6 / 8 * (0.001 + 0.054) / 1500, abs=1)
    own = from_dict(RELAY).links[0].forward
    assert own.netem_limit == 64 and first.netem_limit > 10 * own.netem_limit
    # the LAN queues of a are sized for a's longest flow too
    host = plan.nodes["a-h1"].ifaces[0]
    assert host.egress.queue_rtt_s == pytest.approx(0.054)


def test_an_explicit_limit_wins():
    spec = {**RELAY, "links": [{**RELAY["links"][0], "limit": 77}, RELAY["links"][1]]}
    assert plan_network(from_dict(spec)).wans[0].forward.netem_limit == 77


def test_queue_rtt_is_derived_never_written_in_a_spec():
    shape = plan_network(from_dict(RELAY)).wans[0].forward
    assert "queue_rtt_s" not in shape.to_dict() and "queue_rtt_s" not in shape.to_dict(human=False)
    with pytest.raises(ValidationError, match="queue_rtt"):
        LinkShape(queue_rtt_s=-1.0)


def test_gso_is_off_unless_the_spec_asks_and_survives_round_trips():
    topo = from_dict(RELAY)
    assert topo.gso is False and "gso" not in topo.to_dict()
    on = from_dict({**RELAY, "gso": True})
    assert on.gso is True and on.to_dict()["gso"] is True
    assert from_dict(on.to_dict()).gso is True
    assert on.scaled(0.5).gso is True and on.with_link_shape("a", "b", delay_s=0.002).gso is True
    with pytest.raises(ValidationError, match="gso"):
        from_dict({**RELAY, "gso": "sometimes"})


@pytest.mark.parametrize("name", ["two_dc", "three_dc_triangle", "geo_wan", "star"])
def test_no_bundled_queue_is_smaller_than_its_own_sizing(name):
    topo = load(name)
    plan = plan_network(topo)
    for w, lk in zip(plan.wans, topo.links):
        assert w.forward.netem_limit >= lk.forward.netem_limit
        assert w.reverse.netem_limit >= lk.reverse.netem_limit


def test_queue_rtts_with_live_delays_keep_the_built_routes():
    """A running network's delays change, its routes do not: queue_rtts(delays) uses the spec's paths."""
    from topologies import from_dict

    tri = from_dict({"name": "t", "dcs": ["a", "b", "c"],
                     "links": [{"a": "a", "b": "b", "delay": "5ms"}, {"a": "b", "b": "c", "delay": "5ms"},
                               {"a": "a", "b": "c", "delay": "30ms"}]})
    assert tri.path("a", "c") == ["a", "b", "c"]
    assert tri.queue_rtts()[("a", "b")] == pytest.approx(0.020)  # a<->c via b: 2 x 10 ms
    slow = {("b", "c"): 0.050, ("c", "b"): 0.050}  # least delay would now go direct; the kernel's routes do not
    assert tri.queue_rtts(slow)[("a", "b")] == pytest.approx(0.110)
    assert ("a", "c") not in tri.queue_rtts(slow)  # still no route over the chord
