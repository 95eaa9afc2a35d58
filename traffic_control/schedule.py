"""Time-varying links: a CSV trace of shape changes and down/up events, played in real time.

Format (header required; empty cells keep the current value)::

    time,link,rate,delay,jitter,loss,state
    0,east->west,100Mbit,20ms,,,
    10,east->west,20Mbit,,,,
    15,east-west,,,,,down      # 'a-b' = both directions; state: up | down
    17,east-west,,,,,up

``time`` is seconds from the start of playback (units allowed: ``1.5s``,
``500ms``).  Rows must be in time order.  Shape changes are applied with
``tc ... change`` (no gap for open connections); ``state`` events take the
link's interfaces down or up.  The player is independent of what it drives:
it calls ``apply(event)`` at each event's time, so a real NIC, a Mininet
network or a test can be driven alike.
"""

from __future__ import annotations

import csv
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .errors import ValidationError
from .fields import Duration, Percent, Rate, SpecModel, unit_field, validate


@dataclass(frozen=True)
class LinkEvent:
    time_s: float
    src: str
    dst: str
    both: bool  # 'a-b': both directions
    changes: dict[str, Any]  # LinkShape field -> value (rate_bps, delay_s, jitter_s, loss_pct)
    state: str | None = None  # "up" | "down" | None

    def directions(self) -> list[tuple[str, str]]:
        return [(self.src, self.dst), (self.dst, self.src)] if self.both else [(self.src, self.dst)]


def _link(value: str, field: str) -> tuple[str, str, bool]:
    v = value.strip()
    if "->" in v:
        a, b = v.split("->", 1)
        both = False
    elif "-" in v:
        a, b = v.split("-", 1)
        both = True
    else:
        raise ValidationError(field, f"bad link {value!r}", "write 'a->b' (one direction) or 'a-b' (both)")
    if not a or not b:
        raise ValidationError(field, f"bad link {value!r}", "name two DCs")
    return a.strip(), b.strip(), both


class ScheduleRow(SpecModel):
    """One row of a link schedule (every cell but time and link may be empty: unchanged)."""

    time: Duration = unit_field(..., ge=0, fix="seconds from the start, e.g. 10 or 1.5s")
    link: str = unit_field(..., pattern=r"^\s*[^-\s>]+\s*(->|-)\s*[^-\s>]+\s*$",
                           fix="write 'a->b' (one direction) or 'a-b' (both)")
    rate: Rate | None = unit_field(None, fix="e.g. 20Mbit")
    delay: Duration | None = unit_field(None, fix="e.g. 20ms")
    jitter: Duration | None = unit_field(None, fix="e.g. 2ms")
    loss: Percent | None = unit_field(None, fix="e.g. 1%")
    state: Literal["up", "down"] | None = unit_field(None, fix="use up or down")


COLUMNS = tuple(ScheduleRow.model_fields)


def parse_schedule(text: str, source: str = "schedule") -> list[LinkEvent]:
    rows = list(csv.DictReader(line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")))
    events: list[LinkEvent] = []
    last = 0.0
    for i, raw in enumerate(rows):
        f = f"{source}[row {i + 2}]"
        cells = {str(k): (v.strip() if isinstance(v, str) else v) for k, v in raw.items()}
        cells = {k: v for k, v in cells.items() if v not in ("", None)}
        if "state" in cells:
            cells["state"] = str(cells["state"]).lower()
        row = validate(ScheduleRow, cells, f)
        if row.time < last:
            raise ValidationError(f"{f}.time", f"time {row.time} goes backwards (previous {last})", "sort rows by time")
        last = row.time
        a, b, both = _link(row.link, f"{f}.link")
        ch: dict[str, Any] = {}
        for key, name in (("rate", "rate_bps"), ("delay", "delay_s"), ("jitter", "jitter_s"), ("loss", "loss_pct")):
            if getattr(row, key) is not None:
                ch[name] = getattr(row, key)
        if not ch and row.state is None:
            raise ValidationError(f, "row changes nothing", "give a rate/delay/jitter/loss or a state")
        events.append(LinkEvent(row.time, a, b, both, ch, row.state))
    return events


def load_schedule(path: str | Path) -> list[LinkEvent]:
    p = Path(path)
    try:
        return parse_schedule(p.read_text(), p.name)
    except OSError as e:
        raise ValidationError(str(path), f"cannot read: {e.strerror}", "check the path") from None


def origin_of(t0_ns: int | None) -> float | None:
    """A wall-clock instant (``time.time_ns()``, a trial's t0) as a ``time.monotonic()`` reading."""
    if t0_ns is None:
        return None
    return time.monotonic() - (time.time_ns() - t0_ns) / 1e9


class SchedulePlayer:
    """Plays events in a background thread; ``apply(event)`` errors are collected, not raised."""

    def __init__(self, events: list[LinkEvent], apply: Callable[[LinkEvent], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.events = events
        self.apply = apply
        self.clock = clock
        self.errors: list[str] = []
        self.applied: list[tuple[float, LinkEvent]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="link-schedule", daemon=True)
        self.start_time = 0.0

    def start(self, origin: float | None = None) -> SchedulePlayer:
        """Start playing; event times (and ``applied`` times) count from ``origin`` on ``clock`` (default:
        now).  A trial passes its t0 (:func:`origin_of`), so the schedule and the records share one zero."""
        self.start_time = self.clock() if origin is None else origin
        self._thread.start()
        return self

    def _run(self) -> None:
        for ev in self.events:
            wait = self.start_time + ev.time_s - self.clock()
            if wait > 0 and self._stop.wait(wait):
                return
            try:
                self.apply(ev)
                self.applied.append((self.clock() - self.start_time, ev))
            except Exception as e:
                self.errors.append(f"t={ev.time_s:g}s {ev.src}->{ev.dst}: {e}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def wait(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()
