"""Boot the kernel lab for real: netem works there, statuses and faults come back.

Each test boots one VM (about 4-10 s under TCG on 2 shared cores), so the
file stays under two minutes.  The RTT bound is the issue's "1 ms + 5 % of the
spec": across 10 boots with netem 25 ms each way the minimum RTT sat 0.5-1.0 ms
above the 50 ms spec (never below it), and the excess did not grow with the
delay (0.4-1.0 ms from 1 to 100 ms each way), so the bound holds with margin
while still catching a missing or doubled delay.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from testbed.lab import lab_available, run_in_lab
from testbed.lab.errors import GuestPanic

REPO = Path(__file__).resolve().parents[2]
_OK, _WHY = lab_available()
pytestmark = [
    pytest.mark.lab,
    pytest.mark.slow,
    pytest.mark.skipif(not _OK, reason=f"kernel lab unavailable: {_WHY}"),
    pytest.mark.skipif(os.environ.get("GEO_TESTBED_IN_LAB") == "1", reason="no lab inside the lab"),
]

VETH_PING = r"""
set -e
ip netns add x
ip netns exec x ip link set lo up
ip netns exec x tc qdisc add dev lo root netem delay 10ms
ip netns exec x tc qdisc show dev lo > "$LAB_OUT/lo-qdisc.txt"
ip netns add a; ip netns add b
ip link add va netns a type veth peer name vb netns b
ip -n a addr add 10.9.0.1/24 dev va; ip -n b addr add 10.9.0.2/24 dev vb
ip -n a link set va up; ip -n b link set vb up
ip netns exec a tc qdisc add dev va root netem delay 20ms
ip netns exec b tc qdisc add dev vb root netem delay 20ms
ip netns exec a ping -c 2 -q 10.9.0.2 > /dev/null
ip netns exec a ping -c 20 -i 0.1 -q 10.9.0.2 | tee "$LAB_OUT/ping.txt"
"""


def _lab_qemus(marker: str) -> list[int]:
    """PIDs of live QEMU processes whose command line mentions ``marker``."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"qemu-system" in cmd and marker.encode() in cmd and state != "Z":
            pids.append(int(d.name))
    return pids


@pytest.fixture
def ctl_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put the lab's control dirs under tmp_path, so leftovers can be found precisely."""
    base = tmp_path / "ctl"
    base.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    return base


def _assert_clean(ctl_base: Path) -> None:
    assert _lab_qemus(str(ctl_base)) == [], "a lab VM outlived its run"
    assert list(ctl_base.glob("geo-lab-*")) == [], "a control dir was left behind"


def test_netem_works_and_veth_rtt_matches(tmp_path: Path, ctl_base: Path) -> None:
    out = tmp_path / "out"
    r = run_in_lab(["sh", "-c", VETH_PING], timeout=150, out_dir=out)
    assert r.returncode == 0, r.output + r.module_errors
    assert "netem" in (out / "lo-qdisc.txt").read_text()
    m = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/", (out / "ping.txt").read_text())
    assert m, r.output
    rtt_min = float(m.group(1))
    assert 40.0 <= rtt_min <= 40.0 + 1.0 + 0.05 * 40.0, f"min RTT {rtt_min} ms for 2 x 20 ms"
    assert 0 < r.boot_s < 150 and r.run_s > 1.0
    _assert_clean(ctl_base)


def test_exit_status_output_env_and_cwd(tmp_path: Path, ctl_base: Path) -> None:
    work = tmp_path / "work"  # under /tmp: the lab must share it, not hide it under tmpfs
    work.mkdir()
    script = 'echo to-out; echo to-err >&2; echo "probe=$GEO_TESTBED_PROBE"; pwd; echo x > made.txt; exit 7'
    r = run_in_lab(["sh", "-c", script], timeout=120, cwd=work, env={"GEO_TESTBED_PROBE": "42"})
    assert r.returncode == 7 and not r.timed_out
    lines = r.output.splitlines()
    assert {"to-out", "to-err", "probe=42", str(work)} <= set(lines), r.output
    assert (work / "made.txt").read_text() == "x\n"
    _assert_clean(ctl_base)


def test_hanging_command_is_killed_at_timeout(ctl_base: Path) -> None:
    t0 = time.monotonic()
    r = run_in_lab(["sh", "-c", "echo started; sleep 600"], timeout=30)
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.returncode == 124
    assert elapsed < 30 + 15
    if r.boot_s < 25:  # the command got to start before the limit
        assert "started" in r.output
    _assert_clean(ctl_base)


def test_guest_panic_is_reported(ctl_base: Path) -> None:
    with pytest.raises(GuestPanic, match="panicked") as e:
        run_in_lab(["sh", "-c", "echo c > /proc/sysrq-trigger; sleep 600"], timeout=120)
    assert "sysrq" in str(e.value) and "Call Trace" in e.value.detail
    _assert_clean(ctl_base)


def test_cli_ctrl_c_powers_the_vm_off(tmp_path: Path) -> None:
    base = tmp_path / "ctl"
    base.mkdir()
    env = {**os.environ, "TMPDIR": str(base), "PYTHONPATH": str(REPO)}
    # As from a terminal: SIGINT at its default.  A shell without job control starts background
    # jobs (`make test &`, nohup, some CI runners) with SIGINT ignored, and Python then keeps it
    # ignored: the Ctrl-C this test sends would never arrive.
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed.lab", "--quiet", "--timeout", "120", "--",
         "sh", "-c", "echo started; sleep 600"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # streamed as soon as the guest prints it
        assert line == b"started\n", line + proc.stderr.read() if proc.stderr else line
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=20)
        print(f"MEASURED lab Ctrl-C: VM off and exit {time.monotonic() - t0:.2f} s after SIGINT")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 130
    assert b"powered off" in (proc.stderr.read() if proc.stderr else b"")
    _assert_clean(base)
