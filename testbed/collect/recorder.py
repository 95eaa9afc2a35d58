"""Span recorder used by every process that runs inside a host.

One recorder per process writes ``events/<host>.<role>.<rank>.jsonl``: one
JSON object per line, ``{"ts", "dur", "host", "dc", "rank", "role", "phase",
"step", ...extra}`` with ``ts`` in ns since the trial's ``t0`` (see
docs/CONTRACTS.md).

Why it looks like this:

* **Cheap enough to leave on.**  A span costs two ``perf_counter_ns`` reads,
  one small dict and a list append; JSON encoding and the write happen in
  batches.  Timestamps come from the monotonic clock mapped once onto the
  wall clock (``time.time_ns`` at start), so spans never jump when NTP
  steps the clock and still line up with ``t0`` taken by the runner.
* **Buffered, yet little is lost on a crash.**  Records are flushed when the
  buffer reaches ``max_buffer`` lines, by a daemon thread every
  ``flush_interval_s`` (which also covers a process blocked in a C call such
  as a gloo collective, since those release the GIL), at ``close()``, and
  from an ``atexit`` hook (normal exit, ``sys.exit``, uncaught exception,
  SIGTERM turned into ``SystemExit`` by the entry point).  Only SIGKILL can
  lose the last ``flush_interval_s`` of records.
* **Standard library only**, so it imports nothing heavy and never Mininet.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["Recorder", "Span", "events_path"]


def events_path(out_dir: str | os.PathLike[str], host: str, role: str, rank: int) -> Path:
    """Where a process's spans go: ``<out_dir>/events/<host>.<role>.<rank>.jsonl``."""
    return Path(out_dir) / "events" / f"{host}.{role}.{rank}.jsonl"


class Span:
    """A running span; add keys with ``sp["bytes"] = n`` or ``sp.set(...)`` before it ends."""

    __slots__ = ("phase", "step", "extra", "start_ns")

    def __init__(self, phase: str, step: int | None, extra: dict[str, Any], start_ns: int) -> None:
        self.phase = phase
        self.step = step
        self.extra = extra
        self.start_ns = start_ns

    def __setitem__(self, key: str, value: Any) -> None:
        self.extra[key] = value

    def set(self, **extra: Any) -> None:
        self.extra.update(extra)


class Recorder:
    """Buffered JSON-lines span writer for one process.

    ``with rec.span("compute", step=s) as sp: ...`` times a block;
    ``rec.emit("wait", start_ns, dur_ns, step=s)`` records a span measured
    otherwise (``start_ns`` from :meth:`now_ns`, i.e. ns since ``t0``).
    With ``path=None`` the lines are kept in ``self.lines`` instead of a file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        host: str,
        role: str,
        rank: int,
        dc: str | None = None,
        t0_ns: int | None = None,
        max_buffer: int = 512,
        flush_interval_s: float = 0.5,
        static: dict[str, Any] | None = None,
        offset_ns: int | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.t0_ns = time.time_ns() if t0_ns is None else int(t0_ns)
        self.start_ns = 0  # the trial's start barrier, in ns since t0 (0 until it is known)
        # perf_counter_ns + offset = wall-clock ns, fixed once (monotonic afterwards).  ``offset_ns``: one
        # mapping shared by every process of a trial on this machine (clock_anchor); read here, a process
        # started seconds later than another would map with another offset wherever the wall clock is
        # being slewed or stepped (measured: 5 ms/s for 25 s on these machines, 32-38 ms between processes)
        self._offset = time.time_ns() - time.perf_counter_ns() if offset_ns is None else int(offset_ns)
        self._base = {"host": host, "dc": dc, "rank": rank, "role": role, **(static or {})}
        self._buf: list[str] = []
        self._lock = threading.Lock()
        self._max = max_buffer
        self._closed = False
        self._fh = None
        self.count = 0
        self.lines: list[str] = []  # only used when path is None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        atexit.register(self.close)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if flush_interval_s > 0 and self._fh is not None:
            self._thread = threading.Thread(
                target=self._flusher, args=(flush_interval_s,), name="span-flush", daemon=True
            )
            self._thread.start()

    # -- time ---------------------------------------------------------------
    def now_ns(self) -> int:
        """ns since t0 on the recorder's monotonic-mapped clock."""
        return time.perf_counter_ns() + self._offset - self.t0_ns

    def wall_s(self) -> float:
        """Seconds since t0."""
        return self.now_ns() / 1e9

    def set_start(self, start_ns: int) -> None:
        """Fix the training clock's zero: the moment the trial's start barrier released (ns since t0)."""
        self.start_ns = int(start_ns)

    def train_s(self) -> float:
        """Seconds on the training clock: since the start barrier (since t0 before it is known).

        Spans keep ``ts`` since t0, so start-up stays visible in the trace;
        metrics rows, time-to-target and the wall-clock stop rule use this
        clock, so a scheme is never charged for its processes' start-up.
        """
        return (self.now_ns() - self.start_ns) / 1e9

    # -- recording ------------------------------------------------------------
    @contextmanager
    def span(self, phase: str, step: int | None = None, **extra: Any) -> Iterator[Span]:
        """Time the enclosed block as one span; the span is written even if the block raises."""
        sp = Span(phase, step, extra, self.now_ns())
        try:
            yield sp
        finally:
            self.emit(sp.phase, sp.start_ns, self.now_ns() - sp.start_ns, step=sp.step, **sp.extra)

    def emit(self, phase: str, ts_ns: int, dur_ns: int, step: int | None = None, **extra: Any) -> None:
        """Record a span that started at ``ts_ns`` (ns since t0) and lasted ``dur_ns``."""
        rec = {"ts": int(ts_ns), "dur": max(0, int(dur_ns)), **self._base, "phase": phase, "step": step}
        if extra:
            rec.update(extra)
        line = json.dumps(rec, separators=(",", ":"), default=_jsonable)
        with self._lock:
            if self._closed:
                return
            self._buf.append(line)
            self.count += 1
            full = len(self._buf) >= self._max
        if full:
            self.flush()

    # -- output ---------------------------------------------------------------
    def flush(self) -> None:
        with self._lock:
            if not self._buf:
                return
            if self._fh is None:  # in-memory recorder (tests, embedded use)
                self.lines.extend(self._buf)
                self._buf.clear()
                return
            data = "\n".join(self._buf) + "\n"
            self._buf.clear()
            try:
                self._fh.write(data)
                self._fh.flush()
            except (OSError, ValueError):  # disk full or file closed under us: records are best effort
                pass

    def _flusher(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.flush()

    def close(self) -> None:
        """Flush and close; safe to call twice (also runs at interpreter exit)."""
        if self._closed:
            return
        self._stop.set()
        self.flush()
        with self._lock:
            self._closed = True
            if self._fh is not None:
                try:
                    self._fh.close()
                except OSError:
                    pass
        try:
            atexit.unregister(self.close)
        except Exception:  # pragma: no cover - interpreter shutting down
            pass

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _jsonable(obj: Any) -> Any:
    """Numpy/torch scalars and paths in span extras become plain JSON values."""
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


def boot_id() -> str | None:
    """This kernel's boot id (one per machine and boot; containers and namespaces share it)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def clock_anchor() -> dict[str, Any]:
    """One wall-from-monotonic mapping for every process of a trial on this machine: ``perf_counter_ns()``
    (CLOCK_MONOTONIC, one clock for the whole kernel) plus ``offset_ns`` is wall-clock ns.  Processes on
    another machine (another boot id) cannot use it and read their own."""
    return {"boot_id": boot_id(), "offset_ns": time.time_ns() - time.perf_counter_ns()}


def anchored_offset(anchor: dict[str, Any] | None) -> int | None:
    """The anchor's offset where this process runs on the anchor's machine, else None (read your own)."""
    if not anchor or anchor.get("boot_id") is None or anchor.get("boot_id") != boot_id():
        return None
    return int(anchor["offset_ns"])
