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


def _trains(monkeypatch, *results):
    """direction_checks with its trains replaced by ``results`` (receiver's JSON each), in order."""
    from testbed.network import delay_check

    left = list(results)
    monkeypatch.setattr(delay_check, "run_train", lambda *a, **k: ({"sent": 2000}, left.pop(0)))
    return left


def test_a_failing_train_is_run_once_more_and_the_better_attempt_counts(monkeypatch):
    """A stall of a loaded machine delays a stretch of one train (mean 3 ms late): measured again, the second
    train passes, and every row says two trains ran and what the first one failed."""
    from testbed.network.delay_check import direction_checks

    shape, said = LinkShape(rate_bps=5e7, delay_s=0.005), []
    left = _trains(monkeypatch, _got(0.008, 0.002, unique=2000), _got(0.00506, 0.00003, unique=2000))
    rows = {c.kind: c for c in direction_checks(object(), "a->b", "r1", "r2", "10.0.0.2", shape, say=said.append)}
    assert not left and rows["delay_mean"].status == "pass" and rows["delay_sd"].status == "pass"
    assert {c.extra["attempts"] for c in rows.values()} == {2}
    assert rows["delay_mean"].extra["first_attempt_failed"] == ["delay_mean", "delay_sd"]
    assert said == ["one-way delay train a->b: delay_mean, delay_sd failed; again ..."]


def test_a_direction_that_is_really_wrong_fails_twice_and_a_passing_one_runs_once(monkeypatch):
    from testbed.network.delay_check import direction_checks

    shape = LinkShape(rate_bps=5e7, delay_s=0.005)
    left = _trains(monkeypatch, _got(0.009, 0.00003, unique=2000), _got(0.009, 0.00003, unique=2000))
    rows = {c.kind: c for c in direction_checks(object(), "a->b", "r1", "r2", "10.0.0.2", shape)}
    assert not left and rows["delay_mean"].status == "fail" and rows["delay_mean"].extra["attempts"] == 2
    left = _trains(monkeypatch, _got(0.00505, 0.00003, unique=2000), _got(0.009, 0.00003, unique=2000))
    rows = {c.kind: c for c in direction_checks(object(), "a->b", "r1", "r2", "10.0.0.2", shape)}
    assert len(left) == 1 and rows["delay_mean"].status == "pass" and rows["delay_mean"].extra["attempts"] == 1
    assert "first_attempt_failed" not in rows["delay_mean"].extra


def test_verify_progress_counts_a_measurement_taken_again_as_the_same_step():
    from types import SimpleNamespace

    from testbed.network.verify import progress

    shape = LinkShape(rate_bps=5e7, delay_s=0.005)
    net = SimpleNamespace(topo=SimpleNamespace(dc_names=["a", "b"]),
                          plan=SimpleNamespace(wans=[SimpleNamespace(forward=shape, reverse=shape)]))
    lines: list[str] = []
    say = progress(net, lines.append, delays=True)
    for msg in ("ping", "train a->b", "train a->b: delay_mean failed; again", "train b->a", "iperf3 a->b",
                "iperf3 a->b, again", "iperf3 b->a", "pair a<->b"):
        say(msg + " ...")
    assert [line.split("]")[0] for line in lines] == ["[1/6", "[2/6", "[2/6", "[3/6", "[4/6", "[4/6", "[5/6", "[6/6"]
