"""The self-test's rate train retry rule (testbed.network.selftest._rate), from made-up readings (no network):
a failing train runs once more and the reading nearer the spec counts; a passing one runs once."""

from __future__ import annotations

import pytest

from testbed.network import selftest
from testbed.network.verify import Check

SPEC = 20e6


def _readings(monkeypatch, *ratios: float) -> list[float]:
    """_rate_once returns these readings in turn (ratio to the spec); the calls are counted."""
    calls: list[float] = []

    def once(*_a, **_k) -> Check:
        r = ratios[len(calls)]
        calls.append(r)
        ok = selftest.GOODPUT_MIN_RATIO <= r <= selftest.RATE_MAX_RATIO
        return Check("link_rate", "c->a", SPEC, r * SPEC, "bit/s", "", "pass" if ok else "fail", {"ratio": r})

    monkeypatch.setattr(selftest, "_rate_once", once)
    return calls


def _rate() -> Check:
    return selftest._rate(None, "c->a", "s", "d", "10.0.0.1", SPEC, 30000, 0.008)


def test_a_passing_train_runs_once(monkeypatch):
    calls = _readings(monkeypatch, 1.0)
    c = _rate()
    assert c.status == "pass" and calls == [1.0] and "attempts" not in c.extra


def test_a_failing_train_runs_once_more_and_the_passing_reading_counts(monkeypatch):
    calls = _readings(monkeypatch, 1.038, 1.001)
    c = _rate()
    assert calls == [1.038, 1.001]
    assert c.status == "pass" and c.measured == pytest.approx(1.001 * SPEC)
    assert c.extra["attempts"] == 2 and c.extra["first_attempt_failed"] and c.extra["first_ratio"] == 1.038


@pytest.mark.parametrize("ratios, kept", [((0.5, 0.52), 0.52), ((1.3, 1.5), 1.3)])
def test_a_link_that_is_really_wrong_fails_twice_and_the_nearer_reading_is_reported(monkeypatch, ratios, kept):
    _readings(monkeypatch, *ratios)
    c = _rate()
    assert c.status == "fail" and c.measured == pytest.approx(kept * SPEC) and c.extra["attempts"] == 2
