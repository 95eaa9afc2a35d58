"""Each server's wall-clock offset from the launcher's, measured over its SSH connection.

Spans carry wall-clock nanoseconds (``time.time_ns`` mapped onto the monotonic clock, see
:mod:`testbed.collect.recorder`), so records from two servers line up only once each server's offset is
known.  The exchange is NTP's, over a pipe to a small Python loop on the server (the same interpreter and
clock the trainers use there): the launcher stamps ``t0``, the server answers its ``time.time_ns()``, the
launcher stamps ``t3``.  If the server's stamp was taken midway, its offset is ``ts - (t0 + t3) / 2``; whatever
the asymmetry, the error is at most ``(t3 - t0) / 2``.  Of many exchanges the one with the shortest round trip
is kept (the least queueing), and its half round trip is reported as the bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .remote import Remote, RemoteError

#: the server's side: one stamp per line read, until stdin closes
_ECHO = ("import sys,time\n"
         "w=sys.stdout.write\n"
         "for _ in sys.stdin:\n"
         "    w('%d\\n' % time.time_ns()); sys.stdout.flush()\n")


@dataclass(frozen=True)
class ClockOffset:
    server: str
    offset_ns: int  # server clock - launcher clock
    bound_ns: int  # |error| <= bound (half the best round trip)
    rtt_ns: int
    samples: int

    def to_dict(self) -> dict[str, Any]:
        return {"server": self.server, "offset_ns": self.offset_ns, "bound_ns": self.bound_ns,
                "rtt_ns": self.rtt_ns, "samples": self.samples}


def measure(remote: Remote, samples: int = 64, warmup: int = 8, timeout: float = 30.0) -> ClockOffset:
    """The server's offset from this machine's clock (``samples`` exchanges after ``warmup``)."""
    proc = remote.popen([remote.server.python, "-u", "-c", _ECHO])
    assert proc.stdin is not None and proc.stdout is not None
    best: tuple[int, int] | None = None  # (rtt, offset)
    deadline = time.monotonic() + timeout
    try:
        for i in range(warmup + samples):
            if time.monotonic() > deadline:
                raise RemoteError(remote.server, f"clock exchange took over {timeout:.0f} s",
                                  "check the server's load and its link to the launcher")
            t0 = time.time_ns()
            proc.stdin.write("\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            t3 = time.time_ns()
            if not line:
                err = proc.stderr.read() if proc.stderr else ""
                raise RemoteError(remote.server, f"the clock echo ended: {err.strip()[-200:] or 'no output'}",
                                  f"check that {remote.server.python!r} runs on the server")
            if i < warmup:
                continue
            ts = int(line)
            rtt = t3 - t0
            if best is None or rtt < best[0]:
                best = (rtt, ts - (t0 + t3) // 2)
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=10)
        except Exception:
            proc.kill()
            proc.wait()
    assert best is not None
    return ClockOffset(remote.server.name, best[1], (best[0] + 1) // 2, best[0], samples)
