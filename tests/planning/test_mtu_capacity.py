"""The planner's link capacity follows the MTU the crossing flows get (the spec's mtu is real now)."""

from __future__ import annotations

import pytest

from testbed.network.measure import TCP_PAYLOAD_FRACTION
from testbed.planning.model import PAYLOAD_FRACTION, capacity_Bps
from topologies import from_dict
from traffic_control.shape import tcp_payload_fraction


def test_payload_fraction_by_mtu():
    assert tcp_payload_fraction(1500) == PAYLOAD_FRACTION == TCP_PAYLOAD_FRACTION == 1448 / 1514
    assert tcp_payload_fraction(9000) == 8948 / 9014


def test_capacity_uses_the_smallest_mtu_on_the_way():
    spec = {"name": "m", "dcs": [{"name": "a", "lan": {"mtu": 9000}}, {"name": "b", "lan": {"mtu": 9000}}, "c"],
            "links": [{"a": "a", "b": "b", "rate": "1Gbit", "mtu": 9000},
                      {"a": "b", "b": "c", "rate": "1Gbit", "mtu": 9000}]}
    g = from_dict(spec).dc_graph()
    assert capacity_Bps(g, "a", "b") == pytest.approx(1e9 / 8 * 8948 / 9014)
    assert capacity_Bps(g, "c", "b") == pytest.approx(1e9 / 8 * 1448 / 1514)  # c's LAN is 1500
