"""The UDP probes' receivers must not take a stalled sender for the stream's end.

Under the kernel lab's emulated CPU (and on a loaded machine) a sender can be
descheduled mid-stream for longer than the receiver's idle timeout; a receiver
whose idle clock ran from the first packet reported 92 of 4000 datagrams and
failed CI's duplicate test.  Every probe's idle clock now starts when the
caller closes the receiver's stdin, after the sender exited: the netem tests'
``udp_probe.py``, and the package's trains that ``net verify --delays``
(``owd_train.py``) and each trial's self-test (``udp_train.py``) run.
Each is stopped with SIGSTOP mid-stream for several idle timeouts here; on
the old receivers every case below fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PY = [sys.executable, "-I", "-S"]  # as the package runs its trains: lone scripts, no site packages


@dataclass(frozen=True)
class Probe:
    script: Path
    ready: str
    idle_s: float
    recv_args: list[str]  # after "recv 127.0.0.1 0"
    send_args: list[str]  # after "send 127.0.0.1 PORT"

    def recv(self) -> list[str]:
        return [*PY, str(self.script), "recv", "127.0.0.1", "0", *self.recv_args]

    def send(self, port: int) -> list[str]:
        return [*PY, str(self.script), "send", "127.0.0.1", str(port), *self.send_args]


PROBES = {
    # 400 datagrams in bursts of 10, 10 ms apart (>= 0.4 s); EXPECTED 400, idle 0.5 s
    "udp_probe": Probe(REPO / "tests" / "netem" / "udp_probe.py", "READY", 0.5, ["400", "0.5"], ["400", "10", "0.01"]),
    # 400 datagrams 5 ms apart (2 s); the whole wait 60 s
    "owd_train": Probe(REPO / "testbed" / "network" / "owd_train.py", "ready", 0.5, ["60"], ["400", "0.005"]),
    # 2 s of 1514-byte frames at 4 Mbit/s (~330 frames), no burst; skip none
    "udp_train": Probe(REPO / "testbed" / "network" / "udp_train.py", "ready", 0.15, ["60", "0"], ["4e6", "2", "0"]),
}


def _imported_idle(name: str) -> float:
    if name == "udp_probe":
        return 0.5  # its IDLE_S is an argument
    from testbed.network import owd_train, udp_train

    return {"owd_train": owd_train.IDLE_END_S, "udp_train": udp_train.IDLE_END_S}[name]


@pytest.mark.parametrize("name", PROBES)
def test_a_sender_paused_longer_than_the_idle_timeout_loses_nothing(name: str):
    probe = PROBES[name]
    assert probe.idle_s == _imported_idle(name)
    rx = subprocess.Popen(probe.recv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    tx = None
    try:
        assert rx.stdout.readline().strip() == probe.ready
        tx = subprocess.Popen(probe.send(_bound_port(rx.pid)), stdout=subprocess.PIPE, text=True)
        time.sleep(0.25)  # mid-stream
        tx.send_signal(signal.SIGSTOP)
        time.sleep(max(1.0, 4 * probe.idle_s))  # four idle timeouts with nothing sent
        tx.send_signal(signal.SIGCONT)
        sent = json.loads(tx.communicate(timeout=60)[0])["sent"]
        out, _ = rx.communicate(timeout=60)
    finally:
        for p in (rx, tx):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    got = json.loads(out)["received"]
    assert sent > 100
    assert got == sent, f"{name}: the receiver stopped at {got} of {sent}"


@pytest.mark.parametrize("name", PROBES)
def test_the_receiver_stops_idle_s_after_the_sender_is_done(name: str):
    probe = PROBES[name]
    recv = probe.recv()
    if name == "udp_probe":
        recv[-2] = "5"  # EXPECTED: more than will come
    rx = subprocess.Popen(recv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == probe.ready
        tx = subprocess.run(probe.send(_bound_port(rx.pid))[:-len(probe.send_args)] + _short(name),
                            capture_output=True, text=True, timeout=60)
        assert tx.returncode == 0, tx.stderr
        time.sleep(1.0)
        assert rx.poll() is None, "the receiver gave up before the caller said the sender was done"
        t0 = time.monotonic()
        out, _ = rx.communicate(timeout=30)
        waited = time.monotonic() - t0
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    assert json.loads(out)["received"] >= 1
    assert probe.idle_s * 0.8 <= waited < 10


def test_a_receiver_whose_stdin_cannot_say_falls_back_to_the_idle_gap():
    """Over ssh (``net exec --until-eof``) a probe's stdin is /dev/null: it ends an idle gap after the
    last datagram, as it did before, rather than waiting out its whole WAIT_S."""
    probe = PROBES["owd_train"]
    rx = subprocess.Popen(probe.recv(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == probe.ready
        subprocess.run(probe.send(_bound_port(rx.pid))[:-2] + ["20", "0.001"], capture_output=True, timeout=60,
                       check=True)
        out, _ = rx.communicate(timeout=20)  # WAIT_S is 60
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    assert json.loads(out)["received"] == 20


def _short(name: str) -> list[str]:
    """A few datagrams only."""
    return {"udp_probe": ["3", "1", "0"], "owd_train": ["3", "0.001"], "udp_train": ["4e6", "0.05", "0"]}[name]


def _bound_port(pid: int) -> int:
    """The UDP port the receiver (bound to port 0) got, from its socket in /proc/net/udp."""
    inodes = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
        f = line.split()
        if f"socket:[{f[9]}]" in inodes and f[1].startswith("0100007F:"):
            return int(f[1].split(":")[1], 16)
    raise AssertionError("the receiver's socket is not in /proc/net/udp")
