"""Delay distributions: one table per distribution, the same for netem and the userspace backend.

The tables must be what their docstring says (standardized, int16, the shapes named), the userspace
draws must follow them, the netem request must carry them (TCA_NETEM_DELAY_DIST, through pyroute2's
own encoder), and ``net verify``'s expected values must come from them.
"""

from __future__ import annotations

import random
import statistics
import struct

import pytest

from testbed.network.delay_check import checks_for
from traffic_control import delay_dist, netem_codec
from traffic_control.errors import ValidationError
from traffic_control.jitter import DelayProcess, defined_stats
from traffic_control.qdisc import build_ops, leaf_op
from traffic_control.shape import LinkShape
from traffic_control.userspace import ImpairmentShape

from .netem_round_trip import netem_round_trip


@pytest.mark.parametrize("name", delay_dist.TABLE_DISTRIBUTIONS)
def test_tables_are_standardized_int16_arrays(name):
    t = delay_dist.table(name)
    assert len(t) == delay_dist.SIZE and all(isinstance(v, int) and -32767 <= v <= 32767 for v in t)
    v = [x / delay_dist.SCALE for x in t]
    assert abs(statistics.fmean(v)) < 2e-4
    assert abs(statistics.pstdev(v) - 1) < 2e-4
    assert list(t) == sorted(t)  # quantiles at increasing u
    assert len(delay_dist.table_bytes(name)) == 2 * delay_dist.SIZE


def test_the_shapes_differ_as_named():
    skew = {}
    for name in delay_dist.TABLE_DISTRIBUTIONS:
        v = [x / delay_dist.SCALE for x in delay_dist.table(name)]
        skew[name] = statistics.fmean(x ** 3 for x in v)
        print(f"{name}: min {min(v):.3f} median {statistics.median(v):+.3f} max {max(v):.3f} skew {skew[name]:.2f}")
    assert abs(skew["normal"]) < 0.01  # symmetric
    assert skew["pareto"] > 2 and skew["paretonormal"] > 1.5  # heavy right tail
    pareto = delay_dist.table("pareto")
    assert min(pareto) / delay_dist.SCALE > -0.85  # never far below the mean
    assert statistics.median(pareto) < -0.2 * delay_dist.SCALE  # the median lies well below the mean (0)


@pytest.mark.parametrize("name", delay_dist.TABLE_DISTRIBUTIONS)
def test_the_userspace_draws_follow_the_table(name):
    p = DelayProcess(0.010, 0.004, name, seed=3)
    rng = random.Random(5)
    draws = [p.draw(rng) for _ in range(40000)]
    mean, sd = defined_stats(0.010, 0.004, name)
    _, _, p99 = delay_dist.table_stats(name, 0.010, 0.004)
    assert statistics.fmean(draws) == pytest.approx(mean, abs=6e-5)
    assert statistics.pstdev(draws) == pytest.approx(sd, rel=0.02)
    assert sorted(draws)[int(0.99 * len(draws))] == pytest.approx(p99, abs=4e-4)
    assert min(draws) >= 0


def test_spec_and_backends_carry_the_distribution():
    shape = LinkShape.from_dict({"rate": "100Mbit", "delay": "10ms", "jitter": "4ms", "distribution": "pareto",
                                 "reorder": True})
    assert shape.to_dict() == {"rate": "100Mbit", "delay": "10ms", "jitter": "4ms", "distribution": "pareto",
                               "reorder": True}
    # userspace: the daemon's shape names it
    from testbed.network.impairment import to_impairment_shape

    assert to_impairment_shape(shape).distribution == "pareto"
    assert ImpairmentShape(delay_s=0.01, jitter_s=0.004, distribution="paretonormal").distribution == "paretonormal"
    # netem, reorder: the table travels in TCA_NETEM_DELAY_DIST, encoded by pyroute2

    netem_codec.install()
    op = leaf_op(shape, "add", True)
    assert op.params["delay_dist"] == "pareto" and "distribution pareto" in " ".join(op.argv)
    raw = netem_round_trip(op.params).get_attr("TCA_NETEM_DELAY_DIST")
    assert struct.unpack(f"={delay_dist.SIZE}h", raw) == delay_dist.table("pareto")
    # order kept: the jitter driver sets the interval's delay, jitter 0, no table on its changes
    from traffic_control.jitter_driver import Leaf

    leaf = Leaf(None, "w-b", shape.with_changes(reorder=False), seed=1)
    assert leaf.process.distribution == "pareto"
    assert "delay_dist" not in leaf.op_for(7).params
    # uniform needs no table
    assert "delay_dist" not in build_ops(shape.with_changes(jitter_distribution="uniform"), netem=True)[-1].params


@pytest.mark.parametrize(("spec", "field"), [
    ({"delay": "10ms", "distribution": "pareto"}, "links[0].distribution"),
    ({"delay": "10ms", "jitter": "1ms", "distribution": "lognormal"}, "links[0].distribution"),
])
def test_bad_distributions_name_the_field(spec, field):
    with pytest.raises(ValidationError) as e:
        LinkShape.from_dict(spec, "links[0]")
    assert e.value.field == field, str(e.value)


def test_verify_expects_the_tables_moments():
    shape = LinkShape(delay_s=0.010, jitter_s=0.004, jitter_distribution="pareto", reorder=True)
    _, sd, p99 = delay_dist.table_stats("pareto", 0.010, 0.004, trim=0.005)
    rows = {c.kind: c for c in checks_for("b->h", shape, {"sent": 1000, "seconds": 2.0},
                                          {"received": 1000, "unique": 1000, "mean_s": 0.0101, "sd_s": sd,
                                           "p99_s": 0.026})}
    assert rows["delay_mean"].status == "pass" and rows["delay_sd"].status == "pass"
    assert rows["delay_sd"].expected == pytest.approx(sd) and rows["delay_p99"].expected == pytest.approx(p99)
    assert rows["delay_sd"].extra["distribution"] == "pareto"
    # the same train read as uniform +- 4 ms would expect a p99 of 13.9 ms, not the table's 26
    uni = {c.kind: c for c in checks_for("b->h", shape.with_changes(jitter_distribution="uniform"),
                                         {"sent": 1000, "seconds": 2.0}, {"received": 1000, "unique": 1000})}
    assert uni["delay_p99"].expected == pytest.approx(0.010 + 0.98 * 0.004)


# ------------------------------------------------------------- reorder probability and gap (netem's reorder)
def test_the_userspace_scheduler_reorders_like_netem():
    from traffic_control.userspace.schedule import Scheduler

    def run(pct, gap, n=20000):
        s = Scheduler(ImpairmentShape(delay_s=0.010, reorder_pct=pct, reorder_gap=gap, seed=4))
        at_once = []
        for i in range(n):
            now = i * 1e-4
            assert s.admit(i, now)
            out: list[int] = []
            s.pop_due(now, out)  # due at its own arrival: only a packet sent at once
            at_once += [p for p in out if p == i]
        return at_once

    every_5th = run(100, 5, 1000)
    assert every_5th == list(range(4, 1000, 5))  # gap 5, certain: 4 delayed, the 5th at once
    shape = LinkShape(delay_s=0.010, reorder_pct=25, reorder_gap=5)
    got = len(run(25, 5)) / 20000
    assert shape.immediate_share == pytest.approx(1 / (4 + 4))
    assert got == pytest.approx(shape.immediate_share, abs=0.01)
    assert len(run(10, 1)) / 20000 == pytest.approx(0.10, abs=0.007)


def test_reorder_travels_to_netem_and_reads_back():

    netem_codec.install()
    shape = LinkShape.from_dict({"delay": "10ms", "reorder_probability": "25%", "reorder_gap": 5})
    assert shape.to_dict() == {"delay": "10ms", "reorder_probability": "25%", "reorder_gap": 5}
    op = leaf_op(shape, "add", True)
    assert "reorder 25% gap 5" in " ".join(op.argv)

    def round_trip(params):
        return netem_codec.reorder_of(netem_round_trip(params))

    got = round_trip(op.params)
    assert got["reorder_gap"] == 5 and got["reorder_pct"] == pytest.approx(25)
    # cleared by a change: gap 0 (the kernel keeps a probability it is not sent, and ignores it at gap 0)
    cleared = leaf_op(shape.with_changes(reorder_pct=0.0, reorder_gap=1), "change", True)
    assert cleared.params["gap"] == 0 and round_trip(cleared.params) == {"reorder_pct": 0.0, "reorder_gap": 1}
    # the userspace daemon gets it too
    from testbed.network.impairment import to_impairment_shape

    imp = to_impairment_shape(shape)
    assert (imp.reorder_pct, imp.reorder_gap) == (25, 5)


def test_verify_expects_the_mixture_and_reports_reordering():
    shape = LinkShape(delay_s=0.020, reorder_pct=50)
    rows = {c.kind: c for c in checks_for("a->b", shape, {"sent": 1000, "seconds": 2.0},
                                          {"received": 1000, "unique": 1000, "reordered": 300}, )}
    assert rows["delay_mean"].expected == pytest.approx(0.010)  # half at once, half after 20 ms
    assert rows["delay_sd"].expected == pytest.approx(0.010)
    assert rows["reordering"].status == "info"


@pytest.mark.parametrize(("spec", "field", "words"), [
    ({"reorder_probability": "5%"}, "links[0].reorder_probability", "without delay"),
    ({"delay": "5ms", "reorder_gap": 3}, "links[0].reorder_gap", "without reorder_probability"),
    ({"delay": "5ms", "reorder_probability": "5%", "reorder_gap": 0}, "links[0].reorder_gap", ">= 1"),
    ({"delay": "5ms", "jitter": "1ms", "correlation": "25%"}, "links[0].correlation", "shrinks the spread"),
    ({"delay": "5ms", "loss": "1%", "loss_correlation": "25%"}, "links[0].loss_correlation", "gilbert_elliott"),
])
def test_bad_reorder_and_correlation_name_the_field(spec, field, words):
    with pytest.raises(ValidationError) as e:
        LinkShape.from_dict(spec, "links[0]")
    assert e.value.field == field, str(e.value)
    assert words in str(e.value)


def test_leaving_a_table_sends_netem_a_uniform_one():
    """The kernel keeps a table a change omits: back to uniform jitter, the change sends U[-1, 1]."""
    from traffic_control.qdisc import change_ops

    uni = delay_dist.table("uniform")
    assert min(uni) >= -delay_dist.SCALE and max(uni) <= delay_dist.SCALE
    assert abs(statistics.fmean(uni)) < 1 and statistics.pstdev(uni) / delay_dist.SCALE == pytest.approx(3 ** -0.5, rel=1e-3)
    old = LinkShape(delay_s=0.01, jitter_s=0.004, jitter_distribution="pareto", reorder=True)
    ops = change_ops(old, old.with_changes(jitter_distribution="uniform"), netem=True)
    assert ops[-1].params["delay_dist"] == "uniform"
    assert "delay_dist" not in change_ops(old, old.with_changes(jitter_s=0.0, jitter_distribution="uniform"),
                                          netem=True)[-1].params  # no jitter: no draw, no table needed
