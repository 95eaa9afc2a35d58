"""``verify.min_rtt``: a high minimum RTT is measured once more, a low one never (no network needed)."""

from __future__ import annotations

import math

import pytest

from testbed.network import verify
from testbed.network.measure import PingResult


def _train(*rtts_ms: float, sent: int | None = None) -> PingResult:
    r = [x / 1e3 for x in rtts_ms]
    if not r:
        return PingResult(sent or 3, 0, *(math.nan,) * 4, [])
    mean = sum(r) / len(r)
    return PingResult(sent or len(r), len(r), min(r), mean, max(r), 0.0, r)


@pytest.fixture
def trains(monkeypatch):
    """Replace ping with a queue of canned trains; records the interval each call asked for."""
    queue: list[PingResult] = []
    calls: list[float] = []

    def fake_ping(net, src, dst_ip, count=20, interval=0.05, **kw):
        calls.append(interval)
        return queue.pop(0)

    monkeypatch.setattr(verify, "ping", fake_ping)
    return queue, calls


def test_a_reading_within_the_bar_is_taken_as_is(trains):
    queue, calls = trains
    queue.append(_train(40.6, 41.0, 40.8))
    pr, attempts = verify.min_rtt(None, "a-r", "10.0.0.2", 0.040, 3)
    assert attempts == 1 and calls == [0.05] and pr.min_s == pytest.approx(0.0406)


def test_a_high_reading_gets_a_second_wider_train_and_the_lower_minimum_counts(trains):
    queue, calls = trains
    queue += [_train(45.0, 46.0, 44.0), _train(40.5, 47.0, 41.0)]
    pr, attempts = verify.min_rtt(None, "a-r", "10.0.0.2", 0.040, 3)
    assert attempts == 2 and calls == [0.05, verify.RETRY_INTERVAL_S]
    assert pr.min_s == pytest.approx(0.0405) and pr.sent == 6 and pr.received == 6
    assert verify.rtt_ok(pr.min_s, 0.040)


def test_a_delay_that_is_really_too_long_still_fails(trains):
    queue, _ = trains
    queue += [_train(80.2, 80.5), _train(80.1, 80.9)]  # the delay applied twice
    pr, attempts = verify.min_rtt(None, "a-r", "10.0.0.2", 0.040, 2)
    assert attempts == 2 and not verify.rtt_ok(pr.min_s, 0.040)


def test_a_low_reading_is_never_re_measured(trains):
    queue, calls = trains
    queue.append(_train(0.3, 0.4))  # the delay is missing: netem and the daemons are never early
    pr, attempts = verify.min_rtt(None, "a-r", "10.0.0.2", 0.040, 2)
    assert attempts == 1 and len(calls) == 1 and not verify.rtt_ok(pr.min_s, 0.040)


def test_no_reply_is_re_measured_and_an_empty_join_stays_empty(trains):
    queue, _ = trains
    queue += [_train(), _train()]
    pr, attempts = verify.min_rtt(None, "a-r", "10.0.0.2", 0.040, 3)
    assert attempts == 2 and pr.received == 0 and pr.sent == 6 and math.isnan(pr.min_s)
    assert not verify.rtt_ok(pr.min_s, 0.040)


def test_joined_statistics_cover_every_reply():
    j = _train(10.0, 12.0).joined(_train(14.0, sent=2))
    assert (j.sent, j.received) == (4, 3) and j.loss_pct == pytest.approx(25.0)
    assert j.min_s == pytest.approx(0.010) and j.max_s == pytest.approx(0.014) and j.avg_s == pytest.approx(0.012)
    assert j.mdev_s == pytest.approx(math.sqrt(8 / 3) / 1e3)


# -- verify.best_goodput: the same rule for goodput (one-sided: a shaper never delivers more than its rate)
@pytest.mark.parametrize("readings, retry, best, runs", [
    ([0.99], True, 0.99, 1),          # at the bar: never measured again
    ([0.942, 1.0], True, 1.0, 2),     # CI's stalled run: measured again, the better counts
    ([0.90, 0.85], True, 0.90, 2),    # really too slow: low twice, the better still fails
    ([0.5], False, 0.5, 1),           # a lossy link (reported only): never measured again
])
def test_a_low_goodput_is_measured_once_more(readings, retry, best, runs):
    queue = list(readings)
    asked: list[bool] = []

    def measure(again: bool) -> dict:
        asked.append(again)
        return {"bps": queue.pop(0) * 100e6}

    res, n = verify.best_goodput(measure, 100e6, retry=retry)
    assert (res["bps"] / 100e6, n) == (best, runs) and asked == [False, True][:runs]
