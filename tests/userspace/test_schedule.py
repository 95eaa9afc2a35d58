"""Scheduler: release times, order, batching, loss statistics; no root needed."""

from __future__ import annotations

import math

import pytest

from traffic_control.userspace import ImpairmentShape
from traffic_control.userspace.schedule import Scheduler


def run(sched: Scheduler, arrivals: list[tuple[int, float]], step: float = 1e-4) -> list[tuple[float, int]]:
    """Feed ``(id, time)`` arrivals; return ``(release time, id)`` as a clock ticking by ``step`` sees them."""
    released: list[tuple[float, int]] = []
    pending = list(arrivals)
    now = 0.0
    while pending or len(sched):
        while pending and pending[0][1] <= now:
            pkt_id, t = pending.pop(0)
            sched.admit(pkt_id, t)
        out: list[int] = []
        sched.pop_due(now, out)
        released.extend((now, i) for i in out)
        now += step
    return released


def test_constant_delay_is_fifo_and_batchable() -> None:
    sched = Scheduler(ImpairmentShape(delay_s=0.01))
    for i in range(5):
        assert sched.admit(i, i * 0.001)
    assert sched.next_due() == 0.01
    out: list[int] = []
    assert sched.pop_due(0.0125, out) is True
    assert out == [0, 1, 2]
    assert sched.next_due() == pytest.approx(0.013)
    out.clear()
    sched.pop_all(out)
    assert out == [3, 4] and len(sched) == 0 and sched.next_due() is None


def test_release_never_before_arrival_plus_delay() -> None:
    sched = Scheduler(ImpairmentShape(delay_s=0.005))
    arrivals = [(i, i * 0.0003) for i in range(200)]
    for t_rel, pkt_id in run(sched, arrivals):
        assert t_rel >= arrivals[pkt_id][1] + 0.005 - 1e-12
        assert t_rel < arrivals[pkt_id][1] + 0.005 + 1e-4 + 1e-12


def test_jitter_without_reorder_keeps_order_and_bounds() -> None:
    shape = ImpairmentShape(delay_s=0.01, jitter_s=0.004, seed=1)
    sched = Scheduler(shape)
    arrivals = [(i, i * 0.0002) for i in range(2000)]
    rel = run(sched, arrivals, step=5e-5)
    ids = [i for _, i in rel]
    assert ids == sorted(ids)
    delays = [t - arrivals[i][1] for t, i in rel]
    assert min(delays) >= 0.006 - 1e-9
    # max(prev, own) only adds delay: some packets wait behind earlier ones
    assert max(delays) > 0.012


def test_jitter_with_reorder_uses_own_times() -> None:
    sched = Scheduler(ImpairmentShape(delay_s=0.01, jitter_s=0.004, reorder=True, seed=2))
    arrivals = [(i, i * 0.0002) for i in range(2000)]
    rel = run(sched, arrivals, step=5e-5)
    ids = [i for _, i in rel]
    assert sorted(ids) == list(range(2000))
    inversions = sum(1 for a, b in zip(ids, ids[1:], strict=False) if b < a)
    assert inversions > 100
    delays = [t - arrivals[i][1] for t, i in rel]
    assert min(delays) >= 0.006 - 1e-9 and max(delays) <= 0.014 + 5e-5 + 1e-9


def test_reorder_releases_are_not_batchable() -> None:
    sched = Scheduler(ImpairmentShape(delay_s=0.01, jitter_s=0.004, reorder=True, seed=2))
    for i in range(10):
        sched.admit(i, 0.0)
    out: list[int] = []
    assert sched.pop_due(1.0, out) is False
    assert sorted(out) == list(range(10))


def test_normal_distribution_spread() -> None:
    sched = Scheduler(ImpairmentShape(delay_s=0.05, jitter_s=0.002, distribution="normal", reorder=True, seed=3))
    for i in range(20000):
        sched.admit(i, 0.0)
    dues = []
    while (d := sched.next_due()) is not None:
        out: list[int] = []
        sched.pop_due(d, out)
        dues.extend([d] * len(out))
    mean = sum(dues) / len(dues)
    std = math.sqrt(sum((d - mean) ** 2 for d in dues) / len(dues))
    assert abs(mean - 0.05) < 1e-4 and abs(std - 0.002) < 1e-4


def test_loss_rate_within_bound_and_seeded() -> None:
    n, p = 20000, 0.1
    sched = Scheduler(ImpairmentShape(delay_s=0.001, loss_pct=100 * p, seed=42))
    kept = [sched.admit(i, 0.0) for i in range(n)]
    lost = kept.count(False) / n
    # 5 standard deviations of a binomial proportion: a false failure ~1e-6
    assert abs(lost - p) <= 5 * math.sqrt(p * (1 - p) / n)
    again = Scheduler(ImpairmentShape(delay_s=0.001, loss_pct=100 * p, seed=42))
    assert [again.admit(i, 0.0) for i in range(n)] == kept


def test_change_keeps_order_and_held_times() -> None:
    sched = Scheduler(ImpairmentShape(delay_s=0.02))
    sched.admit(0, 0.0)
    sched.set_shape(ImpairmentShape(delay_s=0.005))
    sched.admit(1, 0.001)  # would be due at 0.006, waits behind packet 0
    out: list[int] = []
    sched.pop_due(0.019, out)
    assert out == []
    assert sched.pop_due(0.02, out) is True and out == [0, 1]


def test_switch_to_reorder_disables_batch_until_heap_drains() -> None:
    sched = Scheduler(ImpairmentShape(delay_s=0.01))
    sched.admit(0, 0.0)  # FIFO, due 0.010
    sched.set_shape(ImpairmentShape(delay_s=0.01, jitter_s=0.005, reorder=True, seed=0))
    sched.admit(1, 0.0)  # heap, due ~0.0134 with this seed
    sched.set_shape(ImpairmentShape(delay_s=0.001))
    sched.admit(2, 0.0)  # FIFO again: waits behind packet 0, due 0.010
    out: list[int] = []
    batch = sched.pop_due(0.0101, out)
    # a batch "accept up to id 2" would also release packet 1, still held
    assert out == [0, 2] and batch is False
    out.clear()
    assert sched.pop_due(0.02, out) is False and out == [1]
    sched.admit(3, 0.02)
    out.clear()
    assert sched.pop_due(0.03, out) is True and out == [3]


def test_reseed_only_when_seed_changes() -> None:
    a = Scheduler(ImpairmentShape(loss_pct=50, seed=1))
    b = Scheduler(ImpairmentShape(loss_pct=50, seed=1))
    first = [a.admit(i, 0.0) for i in range(50)]
    assert first == [b.admit(i, 0.0) for i in range(50)]
    a.set_shape(ImpairmentShape(loss_pct=50, seed=1, delay_s=0.01))
    assert [a.admit(i, 0.0) for i in range(50)] != first
