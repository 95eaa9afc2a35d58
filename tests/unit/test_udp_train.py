"""The self-test's rate probe: its estimator, and the two ends talking over loopback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testbed.network import udp_train
from testbed.network.selftest import TRAIN_SCRIPT


def _stamps(rate_bps: float, n: int, burst: int = 0, t0_ns: int = 10**12) -> list[int]:
    """Arrivals at ``rate_bps`` of 1514-byte frames, the first ``burst`` of them 10x faster (HTB's burst)."""
    gap = 1514 * 8 / rate_bps * 1e9
    out, t = [], float(t0_ns)
    for i in range(n):
        out.append(int(t))
        t += gap / 10 if i < burst else gap
    return out


def test_the_estimate_is_the_release_rate_after_the_burst() -> None:
    est = udp_train.estimate(_stamps(100e6, 1200, burst=200), skip=200)
    assert est["rate_bps"] == pytest.approx(100e6, rel=2e-3)
    assert est["used"] == 900 and est["received"] == 1200  # the burst and a tenth of the rest skipped
    # with nothing skipped, the burst would have read as a faster link
    st = _stamps(100e6, 1200, burst=200)
    assert (len(st) - 1) * 1514 * 8 / ((st[-1] - st[0]) / 1e9) > 1.15 * 100e6
    assert udp_train.estimate([1, 2, 3])["rate_bps"] is None  # too few to say anything


def test_a_window_where_the_queue_ran_dry_does_not_pull_the_estimate_down() -> None:
    st = _stamps(100e6, 1000)
    stalled = st[:500] + [t + 20_000_000 for t in st[500:]]  # the link idled 20 ms once (sender descheduled)
    est = udp_train.estimate(stalled)
    assert est["rate_bps"] == pytest.approx(100e6, rel=2e-3)
    assert est["overall_bps"] < 0.85 * 100e6  # what a single span would have said


def test_sender_and_receiver_over_loopback() -> None:
    py = [sys.executable, "-I", "-S", TRAIN_SCRIPT]
    rx = subprocess.Popen([*py, "recv", "127.0.0.1", "5298", "3", "20"], stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == "ready"
        tx = subprocess.run([*py, "send", "127.0.0.1", "5298", "50e6", "0.2", "20"], capture_output=True,
                            text=True, timeout=30)
        sent = json.loads(tx.stdout)
        got = json.loads(rx.communicate(timeout=30)[0])
    finally:
        if rx.poll() is None:
            rx.kill()
    assert sent["sent"] > 100 and sent["burst"] == 20 and got["received"] > 100
    # unshaped loopback: the receiver sees what the sender paced (kernel stamps), within pacing noise
    assert got["rate_bps"] == pytest.approx(sent["send_rate_bps"], rel=0.35)
    assert udp_train.main(["bogus"]) == 2
