"""Rates above 34.4 Gbit/s (2^32 - 1 bytes/s): HTB and netem's order-keeping rate through 64-bit attributes.

A 32-bit rate silently wraps or saturates there; the kernel takes
``TCA_HTB_RATE64``/``TCA_HTB_CEIL64`` and ``TCA_NETEM_RATE64``.  Live read-backs:
``tests/network/test_rate64.py`` (HTB, natively) and
``tests/netem/test_netem_payload.py`` (netem, in the lab).
"""

from __future__ import annotations

import pytest
from pyroute2.netlink.rtnl.tcmsg import sched_htb, sched_netem

from traffic_control import netem_codec
from traffic_control.qdisc import htb_class_op, leaf_op
from traffic_control.shape import NO_REORDER_NETEM_RATE_BPS, LinkShape, order_keeping_rate_bps


def _round_trip(cls, opts):
    msg = cls()
    msg.setvalue(opts)
    msg.encode()
    back = cls(msg.data)
    back.decode()
    return back


def test_netem_order_keeping_rate_goes_64_bit_above_34_gbit():
    netem_codec.install()
    shape = LinkShape(rate_bps=100e9, delay_s=0.001, jitter_s=0.0005)
    assert order_keeping_rate_bps(shape.rate_bps) == 400e9
    assert order_keeping_rate_bps(1e9) == NO_REORDER_NETEM_RATE_BPS  # below: unchanged
    op = leaf_op(shape, "add", True)
    params = dict(op.params)
    back = _round_trip(sched_netem.options, sched_netem.get_parameters(params))
    assert back.get_attr("TCA_NETEM_RATE64") == 50_000_000_000
    assert back.get_attr("TCA_NETEM_RATE")["rate"] == 2**32 - 1
    assert "rate 400gbit" in " ".join(op.argv)


def test_htb_class_rate_is_64_bit_above_34_gbit():
    op = htb_class_op(LinkShape(rate_bps=100e9), "add-class")
    back = _round_trip(sched_htb.options, sched_htb.get_class_parameters(dict(op.params)))
    assert back.get_attr("TCA_HTB_RATE64") == 12_500_000_000
    assert back.get_attr("TCA_HTB_CEIL64") == 12_500_000_000
    assert back.get_attr("TCA_HTB_PARMS")["rate"] == pytest.approx(2**32 - 1)
