"""The jitter definition (traffic_control/jitter.py): the delay process, its statistics, ordering."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from traffic_control.jitter import (
    DelayProcess,
    defined_stats,
    expected_stats,
    interval_s,
    ordering_excess_s,
)
from traffic_control.userspace.schedule import Scheduler
from traffic_control.userspace.shape import ImpairmentShape


def test_interval_default_and_floor():
    assert interval_s(0.004) == pytest.approx(0.04)
    assert interval_s(0.00001) == 0.001
    assert interval_s(0.004, 0.02) == 0.02


def test_process_is_a_pure_function_of_seed_and_interval():
    p = DelayProcess(0.01, 0.004, "uniform", seed=7, interval_s=0.04)
    assert [p.value(k) for k in range(50)] == [DelayProcess(0.01, 0.004, seed=7, interval_s=0.04).value(k)
                                                 for k in range(50)]
    other = DelayProcess(0.01, 0.004, seed=8, interval_s=0.04)
    assert [p.value(k) for k in range(20)] != [other.value(k) for k in range(20)]
    assert all(0.006 <= p.value(k) <= 0.014 for k in range(2000))
    assert p.index(0.079) == 1 and p.index(0.08) == 2


@pytest.mark.parametrize("dist", ["uniform", "normal"])
def test_values_follow_the_defined_distribution(dist):
    p = DelayProcess(0.01, 0.004, dist, seed=1, interval_s=0.04)
    vals = [p.value(k) for k in range(20000)]
    mean, sd = defined_stats(0.01, 0.004, dist)
    assert statistics.fmean(vals) == pytest.approx(mean, abs=0.00008)
    assert statistics.pstdev(vals) == pytest.approx(sd, rel=0.03)


def test_clipped_normal_moments_by_sampling():
    rng = random.Random(3)
    ys = [max(0.0, rng.gauss(0.002, 0.004)) for _ in range(200000)]
    mean, sd = defined_stats(0.002, 0.004, "normal")
    assert statistics.fmean(ys) == pytest.approx(mean, rel=0.01)
    assert statistics.pstdev(ys) == pytest.approx(sd, rel=0.01)


def _stream(shape: ImpairmentShape, spacing: float, n: int) -> list[float]:
    """One-way delays a packet stream sees through the scheduler (arrival every ``spacing`` s)."""
    s = Scheduler(shape)
    out: list[float] = []
    for i in range(n):
        s.admit(i, 100.0 + i * spacing)
    arrivals = {i: 100.0 + i * spacing for i in range(n)}
    got: list[int] = []
    while len(s):
        due = s.next_due()
        before = len(got)
        s.pop_due(due, got)
        out += [due - arrivals[j] for j in got[before:]]
    assert got == sorted(got) or shape.reorder
    return out


@pytest.mark.parametrize("spacing", [0.0002, 0.001, 0.02])
def test_order_kept_stream_sees_the_defined_distribution_at_any_spacing(spacing):
    """Bulk (0.2 ms apart) and sparse streams alike: mean within 0.5 ms + 5 %, sd within 20 %.

    A per-packet draw with order kept (the old scheduler) gave a mean of ~12.9 ms and a
    quarter of the spread for bulk traffic at 10 +- 4 ms; this test fails on it.
    """
    shape = ImpairmentShape(delay_s=0.01, jitter_s=0.004, seed=5)
    d = _stream(shape, spacing, int(60 / spacing) if spacing > 0.001 else 200000)
    mean, sd = expected_stats(0.01, 0.004, "uniform")
    assert statistics.fmean(d) == pytest.approx(mean, abs=0.0005 + 0.05 * mean)
    assert statistics.pstdev(d) == pytest.approx(sd, rel=0.2)


def test_ordering_excess_matches_the_stream():
    shape = ImpairmentShape(delay_s=0.01, jitter_s=0.004, seed=9)
    d = _stream(shape, 0.0001, 400000)
    base, _ = defined_stats(0.01, 0.004)
    excess = ordering_excess_s(0.004, interval_s(0.004))
    assert excess == pytest.approx(0.004 ** 2 / 3 / (2 * 0.04))
    assert statistics.fmean(d) - base == pytest.approx(excess, abs=0.00015)


def test_reordering_draws_per_packet():
    shape = ImpairmentShape(delay_s=0.01, jitter_s=0.004, reorder=True, seed=2)
    d = _stream(shape, 0.0002, 50000)
    mean, sd = expected_stats(0.01, 0.004, reorder=True)
    assert statistics.fmean(d) == pytest.approx(mean, abs=0.0002)
    assert statistics.pstdev(d) == pytest.approx(sd, rel=0.05)


def test_uniform_sd_is_jitter_over_root_three():
    assert defined_stats(0.01, 0.003)[1] == pytest.approx(0.003 / math.sqrt(3))
    assert defined_stats(0.01, 0.0) == (0.01, 0.0)
