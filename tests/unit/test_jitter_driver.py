"""The netem jitter driver's loop logic (no netlink, no clock): which change at which boundary."""

from __future__ import annotations

import statistics

import pytest

from traffic_control.jitter import DelayProcess, interval_s
from traffic_control.jitter_driver import Driver, Leaf, driven, read_leaves, write_leaves
from traffic_control.qdisc import leaf_op
from traffic_control.shape import NO_REORDER_NETEM_RATE_BPS, LinkShape


def _leaf(**kw):
    shape = LinkShape(rate_bps=1e8, delay_s=0.02, jitter_s=0.004, **kw)
    return Leaf("tb-a-r", "w-b", shape, seed=7)


def test_each_boundary_sets_that_intervals_delay_with_order_kept():
    leaf = _leaf()
    applied = []
    d = Driver([leaf], lambda lf, op: applied.append(op))
    tau = interval_s(0.004)
    t = 1000 * tau + 0.001
    wake = d.step(t)
    assert wake == pytest.approx(1001 * tau)
    for i in range(1, 200):
        assert d.step(wake + 0.0002) == pytest.approx((1001 + i) * tau)
        wake = (1001 + i) * tau
    assert len(applied) == 200 and d.stats["changes"] == 200
    want = DelayProcess(0.02, 0.004, seed=7, interval_s=tau)
    delays = [op.params["delay"] for op in applied]
    assert delays == [round(want.value(1000 + i) * 1e6) for i in range(200)]  # the userspace backend's values
    assert all(op.params["jitter"] == 0 and op.params["rate"] == NO_REORDER_NETEM_RATE_BPS // 8 for op in applied)
    assert statistics.pstdev(delays) == pytest.approx(4000 / 3 ** 0.5, rel=0.15)
    assert d.stats["late_max_s"] == pytest.approx(0.0002)


def test_nothing_is_applied_inside_an_interval():
    applied = []
    d = Driver([_leaf()], lambda lf, op: applied.append(op))
    d.step(10.0)
    d.step(10.001)
    assert len(applied) == 1


def test_a_leaf_whose_namespace_is_gone_is_dropped_and_the_driver_ends():
    def fail(lf, op):
        raise OSError("no such namespace")

    d = Driver([_leaf()], fail)
    assert d.step(1.0) is None
    assert d.stats["errors"] == 1 and d.stats["dropped"] == ["tb-a-r:w-b"]


def test_which_leaves_are_driven():
    assert driven(LinkShape(delay_s=0.01, jitter_s=0.002))
    assert not driven(LinkShape(delay_s=0.01, jitter_s=0.002, reorder=True))
    assert not driven(LinkShape(delay_s=0.01))


def test_keep_order_gives_the_rate_without_jitter():
    op = leaf_op(LinkShape(delay_s=0.01), "change", True, keep_order=True)
    assert op.params["rate"] == NO_REORDER_NETEM_RATE_BPS // 8 and op.params["jitter"] == 0
    assert leaf_op(LinkShape(delay_s=0.01), "change", True).params["rate"] == 0


def test_leaf_file_round_trip(tmp_path):
    from traffic_control.shape import shape_dict

    f = tmp_path / "leaves.json"
    write_leaves(f, 3, [{"netns": "tb-a-r", "ifname": "w-b", "shape": shape_dict(_leaf().shape), "seed": 7}])
    gen, leaves = read_leaves(f)
    assert gen == 3 and leaves[0].shape == _leaf().shape and leaves[0].seed == 7


def test_a_seeded_leaf_gets_a_fresh_reproducible_netem_seed_per_interval():
    leaf = Leaf("tb-a-r", "w-b", LinkShape(delay_s=0.02, jitter_s=0.004, loss_pct=1.0), seed=7, qdisc_seed=99)
    seeds = [leaf.op_for(k).params["prng_seed"] for k in range(50)]
    assert len(set(seeds)) == 50 and seeds == [leaf.op_for(k).params["prng_seed"] for k in range(50)]
    assert "prng_seed" not in _leaf().op_for(3).params  # unseeded network: netem's own


def test_the_queue_limit_stays_the_specs():
    leaf = _leaf()
    assert {leaf.op_for(k).params["limit"] for k in range(100)} == {leaf.shape.netem_limit}
