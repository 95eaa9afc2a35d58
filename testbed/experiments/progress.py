"""Live progress of long work: trials k/N, steps done/total, ETA; plain lines when not a terminal.

On a terminal (stderr is a TTY) a ``rich`` progress display fits itself to the
terminal's width: the overall bar (trials done, plus the running trial's share
of its steps), the running trial's steps with its loss, elapsed time and ETA.
Log lines (``log``) print above it and stay.  Elsewhere (CI, ``2> file``, a
pipe) nothing is redrawn: one plain line per trial start and end, and a status
line at most every ``interval_s`` seconds, so logs stay readable and small.

Everything goes to stderr: stdout stays for results (tables, ``--json``).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, TextIO

from traffic_control.errors import ValidationError
from traffic_control.units import parse_time

ETA_AFTER_S = 5.0
"""No ETA before this much of the run has passed: the first status would extrapolate from nothing."""

PLAIN_INTERVAL_S = 10.0


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "-"
    m, s = divmod(int(seconds + 0.5), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Progress of ``total`` trials; ``heading`` prefixes every line (a sweep's ``point 2/8``)."""

    def __init__(self, total: int, heading: str = "", stream: TextIO | None = None,
                 live: bool | None = None, interval_s: float = PLAIN_INTERVAL_S) -> None:
        self.total = max(0, total)
        self.done = 0
        self.heading = heading
        self.stream = stream or sys.stderr
        self.interval_s = interval_s
        self.name = ""
        self.steps_total: int | None = None
        self.wall_s: float | None = None  # the running trial's training-time bound
        self.step = 0
        self.loss = ""
        self._t_trial = self._t0 = time.monotonic()
        self._last_plain = -math.inf  # not 0: time.monotonic() counts from boot, and a machine up for less
        # than interval_s would never print the first status (seen on a freshly booted CI machine)
        self._rich: Any = None
        if live if live is not None else self._isatty():
            self._start_rich(force=live is True)

    # -- lifecycle ---------------------------------------------------------------------------------
    def _isatty(self) -> bool:
        try:
            return bool(self.stream.isatty())
        except (AttributeError, ValueError):
            return False

    def _start_rich(self, force: bool = False) -> None:
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress
        except ImportError:  # plain lines then
            return
        console = Console(file=self.stream, highlight=False, force_terminal=True if force else None)
        self._rich = RichProgress(
            TextColumn("{task.description}"), BarColumn(bar_width=None), MofNCompleteColumn(),
            TextColumn("{task.fields[extra]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=console, transient=True, expand=True)
        self._rich.start()
        what = f"{self.heading} trials" if self.heading else "trials"
        self._overall = self._rich.add_task(what, total=self.total or 1, extra="")
        self._trial = self._rich.add_task("", total=1, extra="", visible=False)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the runner and the trial report ------------------------------------------------------------
    def start_trial(self, name: str, steps_total: int | None, wall_s: float | str | None = None) -> None:
        """A trial starts; it ends after ``steps_total`` steps or ``wall_s`` of training, whichever first
        (both feed the ETA: a run bounded by time, with a huge step count, gets a sane one)."""
        self.name, self.steps_total, self.step, self.loss = name, steps_total, 0, ""
        try:
            self.wall_s = parse_time(wall_s, "stop.wall_s") if wall_s is not None else None
        except (ValueError, ValidationError):
            self.wall_s = None
        self._t_trial = time.monotonic()
        if self._rich is not None:
            self._rich.reset(self._trial, total=steps_total or 1, completed=0, visible=True,
                             description=f"  {name} steps", extra="")
        self._refresh()

    def update(self, msg: str | None = None, *, step: int | None = None, loss: str | None = None) -> None:
        """The running trial's progress (``step`` = steps done by rank 0); ``msg`` = free text."""
        if step is not None:
            self.step = max(self.step, int(step))
        if loss:
            self.loss = str(loss)
        self._refresh(msg)

    def finish_trial(self) -> None:
        self.done += 1
        self.steps_total = self.wall_s = None
        if self._rich is not None:
            self._rich.update(self._trial, visible=False)
        self._refresh()

    def log(self, msg: str) -> None:
        """A line that stays (trial started/ended, warnings), printed above the live display."""
        if self._rich is not None:
            self._rich.console.print(msg, markup=False, highlight=False, soft_wrap=True)
        else:
            print(msg, file=self.stream, flush=True)

    # -- arithmetic -------------------------------------------------------------------------------
    def fraction(self) -> float:
        """Trials done plus the running trial's share of its steps, over all trials."""
        part = 0.0
        if self.steps_total:
            part = min(1.0, self.step / self.steps_total)
        if self.wall_s:  # the trial's time bound (its own start-up counts too: capped below 1)
            part = max(part, min(0.99, (time.monotonic() - self._t_trial) / self.wall_s))
        return (self.done + part) / max(1, self.total)

    def eta_s(self) -> float | None:
        """Seconds left, from the rate so far (None before any progress)."""
        f = self.fraction()
        if f <= 0 or time.monotonic() - self._t0 < ETA_AFTER_S:  # too early for a rate
            return None
        return (time.monotonic() - self._t0) * (1 - f) / f

    def status(self) -> str:
        head = f"{self.heading} " if self.heading else ""
        steps = f"step {self.step}/{self.steps_total}" if self.steps_total else f"step {self.step}"
        loss = f"  loss {self.loss}" if self.loss else ""
        return (f"{head}trial {min(self.done + 1, self.total)}/{self.total} {self.name}: {steps}{loss}  "
                f"{time.monotonic() - self._t_trial:.0f} s  ETA {_fmt_eta(self.eta_s())}")

    def _refresh(self, msg: str | None = None) -> None:
        if self._rich is not None:
            extra = f"loss {self.loss}" if self.loss else (msg or "")
            self._rich.update(self._overall, completed=self.fraction() * (self.total or 1))
            self._rich.update(self._trial, completed=self.step, extra=extra)
            return
        now = time.monotonic()
        if self.name and now - self._last_plain >= self.interval_s:
            self._last_plain = now
            print(self.status(), file=self.stream, flush=True)
