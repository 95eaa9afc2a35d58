"""LinkShape validation and derived values; the qdisc op model, its dry run and change path."""

from __future__ import annotations

import math

import pytest
from pyroute2.netlink.rtnl.tcmsg import sched_htb, sched_netem

from traffic_control import LinkShape, ValidationError
from traffic_control.qdisc import (
    HTB_CLASS,
    HTB_HANDLE,
    LEAF_HANDLE,
    ROOT,
    build_ops,
    change_ops,
    clear_ops,
    dry_run,
)
from traffic_control.shape import (
    GSO_MAX_BYTES,
    MIN_LIMIT_PKTS,
    NETEM_DEFAULT_LIMIT,
    parse_shape_fields,
)


# ------------------------------------------------------------------ validation
@pytest.mark.parametrize("kw,field", [
    ({"rate_bps": 0}, "rate"), ({"rate_bps": -1e6}, "rate"), ({"rate_bps": 100}, "rate"),
    ({"delay_s": -0.001}, "delay"), ({"jitter_s": 0.001}, "jitter"), ({"delay_s": 0.01, "jitter_s": -0.001}, "jitter"),
    ({"delay_s": 0.01, "jitter_s": 0.02}, "jitter"), ({"loss_pct": -0.1}, "loss"), ({"loss_pct": 100.01}, "loss"),
    ({"limit": 0}, "limit"), ({"mtu": 100}, "mtu"), ({"burst_time_s": 0}, "burst_time"), ({"headroom": 0.5}, "headroom"),
])
def test_bad_shapes_name_the_field(kw, field):
    with pytest.raises(ValidationError) as ei:
        LinkShape(**kw)
    assert ei.value.field == field


@pytest.mark.parametrize("spec,field", [
    ({"rate": "0Mbit"}, "links[1].forward.rate"), ({"rate": "-5Mbit"}, "links[1].forward.rate"),
    ({"loss": "101%"}, "links[1].forward.loss"), ({"loss": "-1%"}, "links[1].forward.loss"),
    ({"jitter": "2ms"}, "links[1].forward.jitter"), ({"rate": "10Mbt"}, "links[1].forward.rate"),
    ({"delay": "10ms", "rtt": "20ms"}, "links[1].forward.rtt"), ({"color": "red"}, "links[1].forward.color"),
    ({"reorder": "yes"}, "links[1].forward.reorder"), ({"limit": "lots"}, "links[1].forward.limit"),
    ({"headroom": "2"}, "links[1].forward.headroom"),
])
def test_parse_shape_fields_errors_carry_the_path(spec, field):
    with pytest.raises(ValidationError) as ei:
        parse_shape_fields(spec, "links[1].forward")
    assert ei.value.field == field


def test_valid_edges():
    LinkShape(loss_pct=0)
    LinkShape(loss_pct=100)
    LinkShape(delay_s=0.01, jitter_s=0.01)
    LinkShape(rate_bps=8000)
    assert LinkShape.from_dict({"rtt": "20ms"}).delay_s == pytest.approx(0.01)
    s = LinkShape.from_dict({"rate": "100Mbit", "delay": "10ms", "jitter": "1ms", "loss": "0.5%", "reorder": True})
    assert (s.rate_bps, s.delay_s, s.jitter_s, s.loss_pct, s.reorder) == (100e6, 0.01, 0.001, 0.5, True)


# ------------------------------------------------------------- derived values
@pytest.mark.parametrize("rate", [8e3, 1e6, 10e6, 100e6])
def test_burst_is_at_least_one_gso_packet(rate):
    s = LinkShape(rate_bps=rate)
    assert s.burst_bytes >= GSO_MAX_BYTES + s.mtu


@pytest.mark.parametrize("rate", [1e9, 5e9, 10e9, 40e9, 100e9])
def test_burst_grows_with_rate(rate):
    s = LinkShape(rate_bps=rate)
    assert s.burst_bytes == math.ceil(rate / 8 * s.burst_time_s)
    assert s.burst_bytes > 15 * 1024  # never tc's fixed default
    assert LinkShape(rate_bps=rate, burst_time_s=0.002).burst_bytes == pytest.approx(2 * s.burst_bytes, abs=1)


def test_no_burst_without_rate():
    assert LinkShape(delay_s=0.01).burst_bytes == 0


@pytest.mark.parametrize("rate,delay", [(1e9, 0.05), (10e9, 0.115), (100e6, 0.02), (5e9, 0.01)])
def test_netem_limit_covers_the_bdp_with_headroom(rate, delay):
    s = LinkShape(rate_bps=rate, delay_s=delay)
    bdp_pkts = rate / 8 * 2 * delay / s.mtu
    assert s.netem_limit >= MIN_LIMIT_PKTS
    assert s.netem_limit >= 2 * bdp_pkts  # headroom 2 over a round trip
    assert s.netem_limit >= s.headroom * rate / 8 * delay / s.mtu  # at least the packets held for the delay


def test_netem_limit_floor_and_explicit():
    assert LinkShape(rate_bps=10e6, delay_s=0.001).netem_limit == MIN_LIMIT_PKTS
    # no bufferbloat floor: 25 Mbit/s x 20 ms holds ~250 packets (~120 ms), not netem's 1000 (~480 ms)
    assert LinkShape(rate_bps=25e6, delay_s=0.02).netem_limit < 300
    # delay-free Gbit/s links keep 2 ms of the rate
    assert LinkShape(rate_bps=5e9).netem_limit >= 5e9 / 8 * 0.002 / 1500
    assert LinkShape(rate_bps=10e9, delay_s=0.1, limit=77).netem_limit == 77
    # 1 Gbit/s x 50 ms: far beyond netem's default of 1000 packets
    assert LinkShape(rate_bps=1e9, delay_s=0.05).netem_limit > 10 * NETEM_DEFAULT_LIMIT
    # jitter adds to the time packets are held
    assert LinkShape(rate_bps=1e9, delay_s=0.05, jitter_s=0.01).netem_limit > LinkShape(rate_bps=1e9, delay_s=0.05).netem_limit


def test_needs_netem_and_without_netem():
    assert not LinkShape(rate_bps=1e6).needs_netem
    for kw in ({"delay_s": 0.001}, {"loss_pct": 0.1}, {"delay_s": 0.01, "jitter_s": 0.001}):
        s = LinkShape(rate_bps=1e6, **kw)
        assert s.needs_netem
        assert not s.without_netem().needs_netem
        assert s.without_netem().rate_bps == 1e6


@pytest.mark.parametrize("rate", [5e9, 40e9])
def test_no_one_gbit_cap(rate):
    s = LinkShape(rate_bps=rate, delay_s=0.01)
    assert s.rate_bps == rate
    cls = build_ops(s)[1]
    assert cls.params["rate"] == rate / 8 and cls.params["ceil"] == rate / 8
    # rates above 2^32-1 bytes/s travel as TCA_HTB_RATE64 (pyroute2 builds it from our params)
    attrs = dict((a[0], a[1]) for a in sched_htb.get_class_parameters(dict(cls.params))["attrs"])
    if rate / 8 >= 2**32:
        assert attrs["TCA_HTB_RATE64"] == rate / 8 and attrs["TCA_HTB_CEIL64"] == rate / 8
        assert attrs["TCA_HTB_PARMS"]["rate"] == 2**32 - 1
    else:
        assert "TCA_HTB_RATE64" not in attrs
        assert attrs["TCA_HTB_PARMS"]["rate"] == rate / 8
    assert f"rate {int(rate / 1e9)}gbit" in " ".join(dry_run("w-x", s))


# ------------------------------------------------------------------- op model
def test_build_ops_tree():
    s = LinkShape(rate_bps=100e6, delay_s=0.01, loss_pct=0.5)
    root, cls, leaf = build_ops(s)
    assert (root.command, root.kind, root.handle, root.parent) == ("add", "htb", HTB_HANDLE, ROOT)
    assert root.params["default"] == 1
    assert (cls.command, cls.kind, cls.handle, cls.parent) == ("add-class", "htb", HTB_CLASS, HTB_HANDLE)
    assert cls.params["burst"] == s.burst_bytes == cls.params["cburst"]
    assert (leaf.command, leaf.kind, leaf.handle, leaf.parent) == ("add", "netem", LEAF_HANDLE, HTB_CLASS)
    assert leaf.params["delay"] == 10000 and leaf.params["loss"] == 0.5 and leaf.params["limit"] == s.netem_limit


def test_netem_params_are_what_pyroute2_encodes():
    s = LinkShape(rate_bps=100e6, delay_s=0.02, jitter_s=0.005, loss_pct=1.0)
    leaf = build_ops(s)[2]
    opts = sched_netem.get_parameters(dict(leaf.params))
    from pyroute2.netlink.rtnl.tcmsg.common import tick_in_usec

    assert opts["delay"] == int(20000 * tick_in_usec)
    assert opts["jitter"] == int(5000 * tick_in_usec)
    assert opts["limit"] == s.netem_limit
    assert opts["loss"] == int((2**32 - 1) * 0.01)
    rate = [a for a in opts["attrs"] if a[0] == "TCA_NETEM_RATE"]
    assert rate and rate[0][1]["rate"] > 100e6 / 8 * 10, "reorder=False keeps order with a netem rate far above the link"


def test_reorder_true_sends_no_netem_rate():
    s = LinkShape(rate_bps=100e6, delay_s=0.02, jitter_s=0.005, reorder=True)
    leaf = build_ops(s)[2]
    opts = sched_netem.get_parameters(dict(leaf.params))
    rates = [a[1]["rate"] for a in opts["attrs"] if a[0] == "TCA_NETEM_RATE"]
    assert rates in ([], [0])  # none, or explicitly off (so a `change` clears an earlier one)
    assert "rate" not in " ".join(dry_run("w-x", s)).split("htb")[-1].split("netem")[-1]


def test_pfifo_leaf_without_netem():
    s = LinkShape(rate_bps=100e6, delay_s=0.01)
    leaf = build_ops(s, netem=False)[2]
    assert leaf.kind == "pfifo" and leaf.params == {"limit": s.netem_limit}
    assert build_ops(LinkShape(rate_bps=100e6))[2].kind == "pfifo"  # netem=None: netem only when needed
    # netem=True: the leaf is netem even without delay, so it can take one later by `change`
    plain = build_ops(LinkShape(rate_bps=100e6), netem=True)[2]
    assert plain.kind == "netem" and plain.params["delay"] == 0 and plain.params["loss"] == 0


def test_dry_run_lines():
    s = LinkShape(rate_bps=200e6, delay_s=0.01, jitter_s=0.002, loss_pct=0.1)
    lines = dry_run("w-west", s, netns="tb-east-r")
    assert lines[0] == "ip netns exec tb-east-r tc qdisc add dev w-west root handle 1: htb default 1"
    assert lines[1].startswith("ip netns exec tb-east-r tc class add dev w-west parent 1: classid 1:1 htb "
                               "rate 200mbit ceil 200mbit ")
    assert f"burst {s.burst_bytes}b cburst {s.burst_bytes}b" in lines[1]
    assert lines[2].startswith("ip netns exec tb-east-r tc qdisc add dev w-west parent 1:1 handle 10: netem "
                               "delay 10000us 2000us loss 0.1% limit ")
    assert lines[2].endswith("rate 34.35973836gbit")
    plain = dry_run("eth0", LinkShape(rate_bps=1e9))
    assert plain[0].startswith("tc qdisc add dev eth0 root")
    assert plain[2] == f"tc qdisc add dev eth0 parent 1:1 handle 10: pfifo limit {LinkShape(rate_bps=1e9).netem_limit}"
    seeded = dry_run("eth0", s, seed=42)
    assert seeded[2].endswith("seed 42")
    assert " ".join(clear_ops()[0].tc_command("eth0")) == "tc qdisc del dev eth0 root"


# ------------------------------------------------------------------ change path
BASE = LinkShape(rate_bps=100e6, delay_s=0.01)


@pytest.mark.parametrize("new", [
    BASE.with_changes(rate_bps=50e6), BASE.with_changes(delay_s=0.05), BASE.with_changes(loss_pct=1.0),
    BASE.with_changes(jitter_s=0.002), BASE.with_changes(jitter_s=0.002, reorder=True), BASE.with_changes(delay_s=0.0),
    BASE.with_changes(rate_bps=40e9, delay_s=0.2), BASE.with_changes(limit=5000), LinkShape(rate_bps=1e6),
])
@pytest.mark.parametrize("netem", [True, False])
def test_change_ops_never_delete(new, netem):
    for old, nw in ((BASE, new), (new, BASE)):
        ops = change_ops(old, nw, netem=netem)
        if netem or old.rate_bps != nw.rate_bps or old.limit != nw.limit:
            assert ops, f"{old} -> {nw} needs some op"
        for op in ops:
            assert op.command in ("change", "change-class"), op
            assert op.tc_command("w-x")[2] == "change"
            assert op.kind == ("htb" if op.command == "change-class" else "netem" if netem else "pfifo")
            assert op.handle in (HTB_CLASS, LEAF_HANDLE)  # the root qdisc is never touched


def test_change_ops_minimal():
    assert change_ops(BASE, BASE) == []
    ops = change_ops(BASE, BASE.with_changes(rate_bps=50e6))
    assert [o.command for o in ops][0] == "change-class"
    ops = change_ops(BASE, BASE.with_changes(delay_s=0.03))
    assert [(o.command, o.kind) for o in ops] == [("change", "netem")]
    assert ops[0].params["delay"] == 30000
    # A rate-only link gets loss, and loses it again: its leaf was built as netem, so both are a
    # `change` of the same qdisc.  (A `replace` with another kind on the same handle is refused by
    # the kernel, "Invalid qdisc name"; that is why the kind never changes.)
    for a, b in ((LinkShape(rate_bps=10e6), LinkShape(rate_bps=10e6, loss_pct=1)),
                 (LinkShape(rate_bps=10e6, loss_pct=1, delay_s=0.01), LinkShape(rate_bps=10e6))):
        ops = change_ops(a, b, netem=True)
        assert [(o.command, o.kind, o.handle) for o in ops] == [("change", "netem", LEAF_HANDLE)]
    # the userspace backend's pfifo leaf: only its limit follows the new BDP
    ops = change_ops(LinkShape(rate_bps=10e6), LinkShape(rate_bps=10e6, delay_s=0.2), netem=False)
    assert [(o.command, o.kind) for o in ops] == [("change", "pfifo")]


def test_change_ops_refuse_what_a_pfifo_leaf_cannot_carry():
    from traffic_control.errors import TrafficControlError

    with pytest.raises(TrafficControlError, match="netem=True"):
        change_ops(LinkShape(rate_bps=10e6), LinkShape(rate_bps=10e6, loss_pct=1))  # built with netem=None


def test_change_reorder_toggle_clears_netem_rate():
    a = BASE.with_changes(jitter_s=0.002)  # in order: netem rate set
    b = a.with_changes(reorder=True)
    ops = change_ops(a, b)
    assert len(ops) == 1 and ops[0].kind == "netem"
    opts = sched_netem.get_parameters(dict(ops[0].params))
    rates = [x[1]["rate"] for x in opts["attrs"] if x[0] == "TCA_NETEM_RATE"]
    assert rates == [0], "the kernel keeps a netem rate a change does not send"
