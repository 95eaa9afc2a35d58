"""tests/stall.py: a measurement during which the machine stopped is taken again, once."""

from __future__ import annotations

import sys
import time

from tests.stall import STALL_S, StallWatch, measure


def _stop_the_world(seconds: float) -> None:
    """Hold the interpreter so the watch thread cannot tick (as a stopped machine would not)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    try:
        t = time.monotonic()
        while time.monotonic() - t < seconds:
            pass
    finally:
        sys.setswitchinterval(old)


def test_a_stall_is_seen_and_the_measurement_taken_again(capsys) -> None:
    calls: list[int] = []

    def fn() -> int:
        calls.append(1)
        if len(calls) == 1:
            _stop_the_world(2 * STALL_S)
        return len(calls)

    assert measure(fn, "a test") == 2
    assert "STALL" in capsys.readouterr().out


def test_a_quiet_measurement_runs_once() -> None:
    calls: list[int] = []
    with StallWatch() as w:
        time.sleep(0.1)
    assert w.longest < STALL_S
    assert measure(lambda: calls.append(1) or len(calls), "a test") == 1


def test_the_last_attempt_is_returned_even_when_it_stalled() -> None:
    def fn() -> str:
        _stop_the_world(2 * STALL_S)
        return "measured"

    assert measure(fn, "a test", attempts=2) == "measured"  # the caller's assertions then decide
