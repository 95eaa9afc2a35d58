"""CPU saturation during a trial: the machine's, and each userspace impairment daemon's.

Every emulated host shares this machine's cores, and the userspace backend's
delay is a Python daemon per link direction: when either runs out of CPU, the
network stops being what the spec says (packets wait for a core, not for the
link) and compute stretches, while nothing in the training records shows it.
So each trial samples, every ``interval_s`` (0.5 s), the machine's busy
fraction from ``/proc/stat`` (all cores together; iowait counts as idle) and
each daemon's CPU from ``/proc/<pid>/stat`` (a fraction of one core: a daemon
is one thread).  A sample is *saturated* at >= 95 %; a trial with more than
10 % of its samples saturated, machine or any daemon, is marked unfaithful
(the network-fidelity issue's rule), with the fractions in its manifest.

Only the samples taken wholly after the trial's start barrier are judged
(:meth:`CpuSaturation.record` with ``from_ns``): before it every trainer
imports torch and loads its data at once, which fills both cores for 8-14 s
on this machine whatever the network does, and no scheme is charged for
that time (the fair clock starts at the barrier).  Judged over every sample,
that fixed burst alone marked short trials unfaithful and long ones not
(the 4-DC lr search of 2026-12-07: 9-15 % saturated in trials that gave up
at 61-68 s, 2-4 % in the 300 s ones, the same workers at the same rate).
The start-up's own summary stays in the record, under ``startup``.

Across servers each other server samples its own CPU (``testbed.cluster.sampling``) and
sends its samples, timed as seconds after the trial's t0 (:meth:`CpuSaturation.samples`),
with its last line; the launcher, which alone knows when the barrier was once the records
are in, judges them from there as it judges its own (:meth:`CpuSaturation.from_samples`).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

SATURATED = 0.95
MAX_SATURATED_FRACTION = 0.10
INTERVAL_S = 0.5
_TICK = os.sysconf("SC_CLK_TCK")


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot; iowait counts as idle."""
    with open("/proc/stat") as fh:
        parts = [int(x) for x in fh.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    total = sum(parts[:8])  # guest time is already inside user
    return total - idle, total


def process_ticks(pid: int) -> int | None:
    """utime + stime of ``pid`` in clock ticks; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


def summarise(samples: list[float]) -> dict[str, Any]:
    """Mean, saturated fraction and verdict of busy-fraction samples."""
    n = len(samples)
    sat = sum(1 for s in samples if s >= SATURATED)
    frac = sat / n if n else 0.0
    return {"samples": n, "mean": round(sum(samples) / n, 4) if n else None,
            "saturated_fraction": round(frac, 4), "saturated": n > 0 and frac > MAX_SATURATED_FRACTION}


class CpuSaturation:
    """Samples the machine and the given daemons (``{name: pid}``) in a thread until :meth:`stop`."""

    def __init__(self, daemons: dict[str, int] | None = None, interval_s: float = INTERVAL_S) -> None:
        self.daemons = dict(daemons or {})
        self.interval_s = interval_s
        self.cores = os.cpu_count()  # the sampled machine's (another server's, from_samples)
        # each sample as (when its interval began, wall-clock ns; busy fraction)
        self.machine: list[tuple[int, float]] = []
        self.per_daemon: dict[str, list[tuple[int, float]]] = {name: [] for name in self.daemons}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-saturation", daemon=True)

    def start(self) -> CpuSaturation:
        self._thread.start()
        return self

    def _run(self) -> None:
        busy0, total0 = machine_ticks()
        last = {name: process_ticks(pid) for name, pid in self.daemons.items()}
        t_last = time.monotonic()
        began_ns = time.time_ns()
        while not self._stop.wait(self.interval_s):
            busy, total = machine_ticks()
            now = time.monotonic()
            if total > total0:
                self.machine.append((began_ns, (busy - busy0) / (total - total0)))
            busy0, total0 = busy, total
            for name, pid in self.daemons.items():
                ticks = process_ticks(pid)
                if ticks is not None and last[name] is not None and now > t_last:
                    self.per_daemon[name].append((began_ns, (ticks - last[name]) / _TICK / (now - t_last)))
                last[name] = ticks
            t_last = now
            began_ns = time.time_ns()

    def halt(self) -> None:
        """End sampling (again: a no-op); :meth:`record` judges what was sampled."""
        self._stop.set()
        self._thread.join(timeout=5)

    def samples(self, t0_ns: int) -> dict[str, Any]:
        """The samples themselves, each as [seconds after ``t0_ns`` its interval began, busy fraction]: what
        another server sends the launcher, which judges them (:meth:`from_samples`)."""
        def rel(series: list[tuple[int, float]]) -> list[list[float]]:
            return [[round((t - t0_ns) / 1e9, 4), round(v, 4)] for t, v in series]

        return {"interval_s": self.interval_s, "cores": self.cores, "machine": rel(self.machine),
                "impairment_daemons": {name: rel(s) for name, s in self.per_daemon.items()}}

    @classmethod
    def from_samples(cls, sent: dict[str, Any], t0_ns: int) -> CpuSaturation:
        """Samples another server took (:meth:`samples`), placed on this side's ``t0_ns`` (never started:
        :meth:`record` judges them)."""
        out = cls({}, interval_s=float(sent["interval_s"]))
        out.cores = sent.get("cores")

        def absolute(series: list[list[float]]) -> list[tuple[int, float]]:
            return [(t0_ns + round(rel * 1e9), float(v)) for rel, v in series]

        out.machine = absolute(sent.get("machine") or [])
        out.per_daemon = {name: absolute(s) for name, s in (sent.get("impairment_daemons") or {}).items()}
        return out

    def stop(self, from_ns: int | None = None) -> dict[str, Any]:
        """End sampling; the record the manifest keeps (see :meth:`record`)."""
        self.halt()
        return self.record(from_ns)

    def record(self, from_ns: int | None = None) -> dict[str, Any]:
        """The verdict over the samples whose interval began at or after ``from_ns`` (wall-clock ns: the
        start barrier), every sample when None; ``saturated`` holds the reasons, empty when none."""
        def judged(samples: list[tuple[int, float]]) -> list[float]:
            return [v for t, v in samples if from_ns is None or t >= from_ns]

        machine = summarise(judged(self.machine))
        daemons = {name: summarise(judged(s)) for name, s in self.per_daemon.items()}
        reasons = []
        if machine["saturated"]:
            reasons.append(f"machine CPU >= {SATURATED:.0%} in {machine['saturated_fraction']:.0%} of samples "
                           f"(cores: {self.cores})")
        reasons += [f"impairment daemon {name} CPU >= {SATURATED:.0%} of a core in {d['saturated_fraction']:.0%} "
                    "of samples" for name, d in daemons.items() if d["saturated"]]
        out: dict[str, Any] = {"interval_s": self.interval_s, "threshold": SATURATED,
                               "max_saturated_fraction": MAX_SATURATED_FRACTION,
                               "judged": "every sample" if from_ns is None else "after the start barrier",
                               "machine": machine, "impairment_daemons": daemons, "saturated": reasons}
        if from_ns is not None:  # what the start-up did to the machine, kept but not judged
            out["startup"] = {"machine": summarise([v for t, v in self.machine if t < from_ns])}
        return out
