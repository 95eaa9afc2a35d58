"""The netem tests' UDP probe: its receiver must not take a stalled sender for the stream's end.

Under the kernel lab's emulated CPU (and on a loaded machine) a sender can be
descheduled mid-stream for longer than the receiver's idle timeout; a receiver
whose idle clock ran from the first packet reported 92 of 4000 datagrams and
failed CI's duplicate test.  The idle clock now starts when the caller closes
the receiver's stdin, after the sender exited.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

PROBE = str(Path(__file__).resolve().parents[1] / "netem" / "udp_probe.py")


def test_a_sender_paused_longer_than_the_idle_timeout_loses_nothing():
    rx = subprocess.Popen([sys.executable, PROBE, "recv", "127.0.0.1", "0", "400", "0.5"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
    tx = None
    try:
        assert rx.stdout.readline().strip() == "READY"
        port = _bound_port(rx.pid)
        tx = subprocess.Popen([sys.executable, PROBE, "send", "127.0.0.1", str(port), "400", "10", "0.01"],
                              stdout=subprocess.PIPE, text=True)
        time.sleep(0.1)  # mid-stream (400 datagrams take >= 0.4 s)
        tx.send_signal(signal.SIGSTOP)
        time.sleep(2.0)  # four idle timeouts with nothing sent
        tx.send_signal(signal.SIGCONT)
        assert json.loads(tx.communicate(timeout=60)[0])["sent"] == 400
        out, _ = rx.communicate(timeout=60)
    finally:
        for p in (rx, tx):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    r = json.loads(out)
    assert r["unique"] == 400, f"the receiver stopped at {r['unique']} of 400"


def test_the_receiver_stops_idle_s_after_the_sender_is_done():
    rx = subprocess.Popen([sys.executable, PROBE, "recv", "127.0.0.1", "0", "5", "0.3"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == "READY"
        time.sleep(1.0)
        assert rx.poll() is None, "the receiver gave up before the caller said the sender was done"
        t0 = time.monotonic()
        out, _ = rx.communicate(timeout=30)
        waited = time.monotonic() - t0
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    assert json.loads(out)["received"] == 0
    assert 0.25 <= waited < 10


def _bound_port(pid: int) -> int:
    """The UDP port the receiver (bound to port 0) got, from its socket in /proc/net/udp."""
    import os

    inodes = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
        f = line.split()
        if f"socket:[{f[9]}]" in inodes and f[1].startswith("0100007F:"):
            return int(f[1].split(":")[1], 16)
    raise AssertionError("the receiver's socket is not in /proc/net/udp")
