"""Measuring only while the machine runs: a watch for stalls of the whole machine (or its host).

A delay or queue measurement assumes the clock and the packets move together.  When the machine
stops for a while (its host deschedules it, a memory compaction, a burst of other work), packets held
in a daemon or a queue come out late by that much, and a 10 ms link reads 56 ms on average from
a few seconds-late datagrams (seen once in CI: median 9.98 ms, mean 56.6 ms).  That measures the
machine, not the link.  :func:`measure` reruns a measurement, once, when a thread that should wake
every 10 ms found a gap longer than ``STALL_S`` while it ran, and says so; the second result is
asserted as usual, so a link that is really slow still fails.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

TICK_S = 0.01
STALL_S = 0.25
"""A gap this long between 10 ms ticks: the machine stopped (far above a loaded machine's wake-up
latency of a few ms, far below the measurements' own lengths)."""


class StallWatch:
    """Context manager: ``longest`` is the longest gap between its thread's 10 ms ticks."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(TICK_S):
            now = time.monotonic()
            self.longest = max(self.longest, now - last - TICK_S)
            last = now

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def measure(fn: Callable[[], T], what: str, attempts: int = 2) -> T:
    """``fn()``, run again (up to ``attempts`` in all) when the machine stalled while it ran."""
    for k in range(attempts):
        with StallWatch() as w:
            out = fn()
        if w.longest < STALL_S or k == attempts - 1:
            return out
        print(f"STALL: the machine stopped for {w.longest:.2f} s while measuring {what}; measuring again")
    raise AssertionError("unreachable")
