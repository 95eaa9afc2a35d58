"""The rows of net verify's one-way delay check, from made-up train results (no network)."""

from __future__ import annotations

import math

import pytest

from testbed.network.delay_check import binomial_interval, checks_for, train_seconds
from testbed.network.owd_train import summarize
from traffic_control.shape import LinkShape


def _rows(shape, got, sent=4000):
    return {c.kind: c for c in checks_for("a->b", shape, {"sent": sent}, got)}


def _got(mean, sd, unique=4000, reordered=0):
    return {"received": unique, "unique": unique, "duplicates": 0, "reordered": reordered, "mean_s": mean,
            "sd_s": sd, "min_s": mean - sd, "p50_s": mean, "p99_s": mean + 2 * sd, "max_s": mean + 3 * sd}


def test_defined_jitter_passes_and_each_defect_fails_its_row():
    shape = LinkShape(rate_bps=1e8, delay_s=0.01, jitter_s=0.004)
    sd = 0.004 / math.sqrt(3)
    ok = _rows(shape, _got(0.01007, sd))
    assert {k: c.status for k, c in ok.items()} == {"delay_mean": "pass", "delay_sd": "pass", "delay_p99": "info",
                                                     "loss": "pass", "reordering": "pass"}
    # the running-maximum bias of per-packet draws with order kept (mean ~12.9 ms, a quarter of the spread)
    biased = _rows(shape, _got(0.0129, sd / 4))
    assert biased["delay_mean"].status == "fail" and biased["delay_sd"].status == "fail"
    assert _rows(shape, _got(0.01007, 2 * sd))["delay_sd"].status == "fail"      # jitter doubled
    assert _rows(shape, _got(0.01007, sd, reordered=3))["reordering"].status == "fail"
    assert _rows(shape, _got(0.01007, sd, unique=3900))["loss"].status == "fail"  # 2.5 % lost on a lossless link


def test_loss_within_the_binomial_interval():
    shape = LinkShape(rate_bps=1e8, delay_s=0.005, loss_pct=2.0)
    lo, hi = binomial_interval(4000, 0.02)
    assert lo < 80 < hi and 55 <= lo <= 62 and 98 <= hi <= 105
    assert _rows(shape, _got(0.005, 0.0001, unique=4000 - 80))["loss"].status == "pass"
    assert _rows(shape, _got(0.005, 0.0001, unique=4000 - (hi + 1)))["loss"].status == "fail"
    assert _rows(shape, _got(0.005, 0.0001, unique=4000 - (lo - 1)))["loss"].status == "fail"
    assert binomial_interval(100, 0.0) == (0, 0)


def test_reordering_is_reported_not_judged_when_asked_for():
    shape = LinkShape(rate_bps=1e8, delay_s=0.01, jitter_s=0.004, reorder=True)
    assert _rows(shape, _got(0.01, 0.004 / math.sqrt(3), reordered=500))["reordering"].status == "info"


def test_no_jitter_is_held_to_the_floor():
    shape = LinkShape(rate_bps=1e8, delay_s=0.02)
    assert _rows(shape, _got(0.0201, 0.0002))["delay_sd"].status == "pass"
    assert _rows(shape, _got(0.0201, 0.0012))["delay_sd"].status == "fail"


def test_train_covers_enough_intervals():
    assert train_seconds(LinkShape(delay_s=0.01)) == 2.0
    assert train_seconds(LinkShape(delay_s=0.02, jitter_s=0.004)) == pytest.approx(2.4)  # 60 x 40 ms
    assert train_seconds(LinkShape(delay_s=0.05, jitter_s=0.02)) == 8.0


def test_summarize_counts_order_and_duplicates():
    out = summarize([10_000_000, 12_000_000, 11_000_000, 11_000_000], [0, 2, 1, 1])
    assert out["received"] == 4 and out["unique"] == 3 and out["duplicates"] == 1 and out["reordered"] == 2
    assert out["mean_s"] == pytest.approx(0.011)
