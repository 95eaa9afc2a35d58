"""Start a trial's processes, watch them, stop them all when one fails.

Reusable by any launcher: :class:`Supervisor` takes the processes as
:class:`ProcSpec` s and *how to start one* as a callable returning a
Popen-like object (``poll()``, ``wait(timeout)``, ``terminate()``,
``kill()``, ``pid``), e.g. ``subprocess.Popen`` on loopback or a Mininet
host's ``popen`` in the emulated network.

Rules (why: a crashed worker leaves the others blocked in a collective or
waiting on the server forever, so waiting for them is never right):

* a process that exits non-zero (or cannot be started) fails the run: every
  other process gets SIGTERM at once, SIGKILL after ``grace_s``; the run
  ends within ``grace_s`` + ``poll_s`` of the failure;
* the run succeeds when every process exited 0;
* once all ``primary`` processes (workers) exited 0, the others (the
  parameter server) get ``drain_s`` to exit by themselves, else the run
  fails ("did not exit");
* ``timeout_s`` bounds the whole run;
* ``stall_s`` bounds how long a primary process may go without progress
  (``progress(name)`` returns a marker that changes whenever it does, e.g.
  the size of its span file): a run with a stalled process fails naming it,
  first the processes that are stopped (SIGSTOP: state ``T``), then the
  one that progressed last the longest time ago (in a collective every
  peer of a hung process stalls with it, a few spans later).

Records are never touched: each process flushes its own on SIGTERM, and
the launcher keeps the logs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class PopenLike(Protocol):
    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


@dataclass
class ProcSpec:
    name: str  # "<host>.<role>.<rank>"
    role: str = "worker"
    primary: bool = True  # the run is done when all primary processes exited 0
    payload: Any = None  # whatever the start callable needs (job path, host object, ...)


@dataclass
class ProcResult:
    name: str
    role: str
    pid: int | None
    returncode: int | None
    started_s: float | None  # seconds since the supervisor started
    ended_s: float | None
    stopped: bool = False  # terminated/killed by the supervisor


@dataclass
class SupervisionResult:
    ok: bool
    reason: str
    first_failure: str | None
    wall_s: float
    procs: list[ProcResult] = field(default_factory=list)

    def returncodes(self) -> dict[str, int | None]:
        return {p.name: p.returncode for p in self.procs}


class Supervisor:
    def __init__(self, specs: Sequence[ProcSpec], start: Callable[[ProcSpec], PopenLike], *,
                 timeout_s: float | None = None, grace_s: float = 3.0, drain_s: float = 15.0,
                 poll_s: float = 0.05, on_event: Callable[[str], None] | None = None,
                 stall_s: float | None = None, progress: Callable[[str], Any] | None = None) -> None:
        self.specs = list(specs)
        self.start = start
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        self.drain_s = drain_s
        self.poll_s = poll_s
        self.on_event = on_event or (lambda msg: None)
        self.stall_s = stall_s
        self.progress = progress
        self._marks: dict[str, tuple[Any, float]] = {}  # name -> (last progress marker, when it changed)
        self._stall_checked = 0.0
        self._t0 = 0.0
        self._procs: dict[str, PopenLike] = {}
        self._results: dict[str, ProcResult] = {}
        self._stop_reason: str | None = None

    def request_stop(self, reason: str) -> None:
        """Ask a running ``run()`` (from another thread or a signal handler) to stop everything."""
        self._stop_reason = reason

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _record_exit(self, name: str, rc: int | None) -> None:
        r = self._results[name]
        if r.ended_s is None:
            r.returncode, r.ended_s = rc, self._now()

    def _stop_all(self) -> None:
        alive = {n: p for n, p in self._procs.items() if p.poll() is None}
        for name, p in alive.items():
            self._results[name].stopped = True
            try:
                p.terminate()
            except OSError:
                pass
        deadline = time.monotonic() + self.grace_s
        for _name, p in alive.items():
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - TimeoutExpired or a Popen-like's own error
                pass
        for _name, p in alive.items():
            if p.poll() is None:
                try:
                    p.kill()
                    p.wait(timeout=self.grace_s)
                except Exception:  # noqa: BLE001
                    pass
        for name, p in self._procs.items():
            self._record_exit(name, p.poll())

    def run(self) -> SupervisionResult:
        self._t0 = time.monotonic()
        failure: str | None = None
        reason = "ok"
        for spec in self.specs:
            self._results[spec.name] = ProcResult(spec.name, spec.role, None, None, None, None)
            try:
                proc = self.start(spec)
            except Exception as exc:  # noqa: BLE001 - any start failure fails the run
                failure, reason = spec.name, f"{spec.name} could not be started: {exc}"
                break
            self._procs[spec.name] = proc
            self._results[spec.name].pid = getattr(proc, "pid", None)
            self._results[spec.name].started_s = self._now()
            self.on_event(f"started {spec.name} pid {getattr(proc, 'pid', '?')}")
        try:
            failure, reason = self._watch(failure, reason)
        except BaseException:  # Ctrl-C or a bug here: never leave processes behind
            self._stop_all()
            raise
        if failure is not None:
            self.on_event(f"failed: {reason}; stopping the others")
            self._stop_all()
        return SupervisionResult(failure is None, reason, failure, self._now(),
                                 [self._results[s.name] for s in self.specs if s.name in self._results])

    def _stalled(self, primaries: set[str], done: set[str]) -> tuple[str, str] | None:
        """(culprit, reason) when a running primary process made no progress for ``stall_s``."""
        if self.stall_s is None or self.progress is None:
            return None
        now = self._now()
        if now - self._stall_checked < min(1.0, self.stall_s / 4):
            return None
        self._stall_checked = now
        running = [n for n in self._procs if n not in done]
        for name in running:
            try:
                marker = self.progress(name)
            except Exception:  # noqa: BLE001 - an unreadable marker is no progress
                marker = None
            prev = self._marks.get(name)
            if prev is None or (marker is not None and prev[0] != marker):
                self._marks[name] = (marker, now)
        idle = {n: now - self._marks[n][1] for n in running if n in primaries}
        if not idle or max(idle.values()) <= self.stall_s:
            return None
        states = {n: process_state(getattr(self._procs[n], "pid", None)) for n in running}
        stopped = sorted(n for n, st in states.items() if st == "T")
        waiting = sorted((n for n in idle if idle[n] > self.stall_s), key=lambda n: -idle[n])
        culprit = stopped[0] if stopped else waiting[0]
        why = (f"{', '.join(stopped)} {'is' if len(stopped) == 1 else 'are'} stopped (state T: SIGSTOP/SIGTSTP)"
               if stopped else f"{culprit} made no progress for {idle[culprit]:.0f} s (the longest)")
        others = [n for n in waiting if n != culprit]
        reason = (f"stalled: no progress for {self.stall_s:g} s (stall limit): {why}"
                  + (f"; stalled with it: {', '.join(others)}" if others else ""))
        return culprit, reason

    def _watch(self, failure: str | None, reason: str) -> tuple[str | None, str]:
        primaries = {s.name for s in self.specs if s.primary}
        drain_since: float | None = None
        while failure is None:
            for name, p in self._procs.items():
                rc = p.poll()
                if rc is None or self._results[name].ended_s is not None:
                    continue
                self._record_exit(name, rc)
                self.on_event(f"{name} exited with {rc}")
                if rc != 0 and failure is None:
                    failure, reason = name, f"{name} exited with status {rc}"
            if failure is not None:
                break
            done = {n for n, r in self._results.items() if r.ended_s is not None}
            if done >= set(self._results):
                break
            if primaries <= done:
                drain_since = drain_since if drain_since is not None else time.monotonic()
                if time.monotonic() - drain_since > self.drain_s:
                    left = sorted(set(self._results) - done)
                    failure, reason = left[0], f"{', '.join(left)} did not exit after the workers finished"
                    break
            if self._stop_reason is not None:
                failure, reason = "supervisor", self._stop_reason
                break
            if self.timeout_s is not None and self._now() > self.timeout_s:
                failure, reason = "supervisor", f"timeout after {self.timeout_s:g} s"
                break
            stalled = self._stalled(primaries, done)
            if stalled is not None:
                failure, reason = stalled
                break
            time.sleep(self.poll_s)
        return failure, reason


def process_state(pid: int | None) -> str | None:
    """The kernel's one-letter state of ``pid`` (R, S, D, T, Z...), None if it is gone."""
    if pid is None:
        return None
    try:
        stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115 - one read
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]
