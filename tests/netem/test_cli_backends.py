"""The network as a user runs it: `testbed net up` in one process, probed and changed from others.

Every test runs once per impairment backend (``netem`` inside the kernel lab
or wherever the kernel has sch_netem, ``userspace`` natively), through the
command line as separate processes: ``net up`` returns, then pings run from
the test process (``ip netns exec``) or through ``testbed net exec``, and
``net set`` changes links of the network the exited command left up.

The network (three DCs, LAN delay in ``a`` only)::

    a (2 hosts, LAN 20 ms) --(50 Mbit/s, 20 ms each way)-- b (1 host)   link a-b
    a --(rate only, 100 Mbit/s)-- c (1 host)                             link a-c

Tolerances: minimum RTT of 20 pings within the kernel-lab issue's bar (1 ms +
5 %, ``tests/netem/bars.py``; inside the lab the upper bound has the emulated
CPU's slack on top, measured there).  The LAN delay is 20 ms, not 1 ms, so the
constant the lab's emulated CPU adds to every hop stays small beside it:
measured there, idle, a path with no delay at all (host -> its router) had a
0.68 ms minimum RTT; with 1 ms of LAN delay host -> host in ``a`` read 3.08 ms
for 2 ms; with 10 ms, 21.5-22.2 ms for 20 ms and 63.5 ms for 60 ms (10 pings);
in CI, c-h1 -> a-h1 read 43.10 ms for 40 ms.  Doubled LAN delay (the defect)
would show as 80 ms for 40 ms.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import yaml

from testbed.network import cleanup
from tests.conftest import run_cli
from tests.netem.bars import IN_LAB, rtt_within_bar

pytestmark = [pytest.mark.netem, pytest.mark.root]


#: Bound on one CLI command (a hang bound, not a timing claim).  Inside the lab every command
#: starts a Python process under QEMU TCG: `net set` takes 1.7 s natively and once ran past 60 s
#: there on a loaded CI machine (the first bound), failing a test whose links were fine.
CLI_TIMEOUT_S = 300 if IN_LAB else 120

LAN = 0.020  # one-way LAN delay in a
TOPO = {
    "name": "clibk",
    "dcs": [{"name": "a", "hosts": 2, "lan": {"delay": f"{LAN * 1e3:g}ms"}}, {"name": "b", "hosts": 1},
            {"name": "c", "hosts": 1}],
    "links": [{"a": "a", "b": "b", "rate": "50Mbit", "delay": "20ms"},
              {"a": "a", "b": "c", "rate": "100Mbit"}],
}
A1, A2, B1, C1 = "10.1.0.1", "10.1.0.2", "10.2.0.1", "10.3.0.1"


def _usable(backend: str) -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "needs root"
    if backend == "netem":
        from traffic_control.capabilities import probe_kernel

        cap = probe_kernel()["netem"]
        return cap.ok, cap.detail + "; runs inside the kernel lab (`make test` does that)"
    if IN_LAB:
        return False, "the userspace backend is tested natively; the lab is for netem"
    from traffic_control.userspace import available

    return available()


@contextmanager
def _net_up(backend: str, tmp_path) -> Iterator[str]:
    """`testbed net up` of TOPO with one backend, run as its own process; `net down` afterwards."""
    ok, why = _usable(backend)
    if not ok:
        pytest.skip(f"{backend} backend not usable here ({why})")
    assert not cleanup.owned_netns(), "a testbed network is already up"
    path = tmp_path / "topo.yaml"
    path.write_text(yaml.safe_dump(TOPO))
    r = run_cli("net", "up", str(path), "--impairment", backend, "--seed", "7", timeout=2 * CLI_TIMEOUT_S + 60)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"impairment: {backend}" in r.stderr
        yield backend
    finally:
        d = run_cli("net", "down", timeout=CLI_TIMEOUT_S)
        assert d.returncode == 0, d.stderr
        assert cleanup.leftovers() == {}


@pytest.fixture(params=["netem", "userspace"])
def up(request, tmp_path):
    with _net_up(request.param, tmp_path) as backend:
        yield backend


@pytest.fixture
def up_userspace(tmp_path):
    with _net_up("userspace", tmp_path) as backend:
        yield backend


def ping(node: str, ip: str, count: int = 20, interval: float = 0.05) -> dict:
    """Ping from ``node`` in a process of its own (not the one that built the network)."""
    r = subprocess.run(["ip", "netns", "exec", f"tb-{node}", "ping", "-n", "-c", str(count), "-i", str(interval),
                        "-W", "1", ip], capture_output=True, text=True, timeout=count * interval + 30)
    rtts = [float(x) / 1e3 for x in re.findall(r"time=([0-9.]+) ms", r.stdout)]
    m = re.search(r"(\d+) packets transmitted, (\d+) received", r.stdout)
    return {"sent": int(m.group(1)), "received": int(m.group(2)), "min": min(rtts) if rtts else None,
            "rtts": rtts}


def show() -> tuple[int, dict]:
    r = run_cli("net", "show", "--json", timeout=CLI_TIMEOUT_S)
    return r.returncode, json.loads(r.stdout)


def _msg(p: dict, expected: float) -> str:
    return f"min RTT {p['min'] * 1e3 if p['min'] else float('nan'):.2f} ms over {p['received']}/{p['sent']}, " \
           f"expected {expected * 1e3:.2f} ms"


# --------------------------------------------------------- defect 1: latency after net up returns
def test_delays_stay_after_net_up_returns(up):
    """net up returned; the spec's delays hold for traffic from other processes, LAN and WAN."""
    cases = [("a-h1", B1, 2 * LAN + 0.040),     # a's LAN once each way, the WAN 20 ms each way
             ("a-h1", A2, 2 * LAN),             # same DC: one LAN delivery each way
             ("b-h1", C1, 0.040),               # relayed b -> a -> c; the rate-only link adds nothing
             ("c-h1", A1, 2 * LAN)]
    for src, ip, expected in cases:
        p = ping(src, ip)
        print(f"MEASURED [{up}] {src} -> {ip}: {_msg(p, expected)}")
        assert p["received"] >= 16, _msg(p, expected)
        assert rtt_within_bar(p["min"], expected), f"{src} -> {ip}: {_msg(p, expected)}"
    rc, d = show()
    assert rc == 0, d
    assert d["state"]["impairment"]["backend"] == up and not d["state"]["impairment"]["skipped"]
    assert d["state"]["seed"] == 7
    link = d["links"]["a->b"]
    assert link["tc"]["shape"]["rate_bps"] == pytest.approx(50e6)
    if up == "userspace":
        assert link["userspace"]["alive"] and link["userspace"]["shape"]["delay_s"] == pytest.approx(0.020)
        lan = [h for h in d["impairment_health"] if h["realises"] == "lan:a"]
        assert len(lan) == 1 and lan[0]["alive"] and lan[0]["node"] == "a-sw"  # held in a's switch
    else:
        from traffic_control.capabilities import probe_kernel

        assert link["tc"]["shape"]["delay_s"] == pytest.approx(0.020, abs=2e-6)
        assert d["links"]["a->c"]["tc"]["shape"]["leaf"] == "netem"  # ready to take a delay in place
        # seeded where netem takes a seed (Linux >= 6.7), and said so where it does not
        seedable = probe_kernel()["netem_seed"].ok
        assert d["state"]["impairment"]["netem_seeded"] is seedable
        assert ("unseeded" in d["state"]["impairment"]["randomness"]) is not seedable


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_impairment_fails_its_link_closed_and_net_show_says_so(up_userspace, sig):
    """After net up returned: a daemon killed (or terminated: a signal alone never opens the link)."""
    _, d = show()
    daemon = d["links"]["a->b"]["userspace"]
    assert daemon["alive"]
    os.kill(daemon["pid"], sig)
    time.sleep(1.0)
    p = ping("a-h1", B1, count=10, interval=0.05)
    assert p["received"] == 0, f"{p['received']} of 10 pings crossed a link whose impairment died 1 s before"
    rc, d = show()
    assert rc == 1
    dead = d["links"]["a->b"]["userspace"]
    assert not dead["alive"] and dead["fail_closed"]
    text = run_cli("net", "show", timeout=CLI_TIMEOUT_S)
    assert text.returncode == 1 and "DEAD: link fails closed" in text.stdout
    assert ping("a-h1", A2, count=3)["received"] == 3  # the rest of the network is untouched
    r = run_cli("net", "set", "a", "b", "--one-way", "--delay", "25ms", timeout=CLI_TIMEOUT_S)
    assert r.returncode == 1 and "a-r:w-b" in r.stderr  # a dead daemon cannot take a change: said, not ignored


# --------------------------------------------------------- defect 5: live changes, any backend
def test_rate_only_link_takes_delay_and_loss_and_drops_them_again_in_place(up, tmp_path):
    """net set from another process: a link without impairments gets delay, then loss, then none."""
    base = ping("a-h1", C1)
    assert rtt_within_bar(base["min"], 2 * LAN), _msg(base, 2 * LAN)
    # a ping stream across every change: in place means no gap (nothing lost while loss is 0)
    # (it runs until interrupted: each `net set` takes seconds under the lab's emulated CPU; its output
    # goes to a file, since a pipe nobody reads fills up and stalls ping)
    log = tmp_path / "stream.txt"
    with log.open("w") as fh:
        stream = subprocess.Popen(["ip", "netns", "exec", "tb-a-h1", "ping", "-n", "-i", "0.02", C1],
                                  stdout=fh, stderr=subprocess.STDOUT, text=True,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(1.0)
        r = run_cli("net", "set", "a", "c", "--delay", "15ms", timeout=CLI_TIMEOUT_S)
        assert r.returncode == 0, r.stderr
        assert "a->c: 100Mbit, delay 15ms" in r.stdout and "c->a: 100Mbit, delay 15ms" in r.stdout
        time.sleep(2.0)
        r = run_cli("net", "set", "a", "c", "--delay", "0", timeout=CLI_TIMEOUT_S)
        assert r.returncode == 0, r.stderr
        time.sleep(1.0)
        stream.send_signal(signal.SIGINT)  # ping prints its summary and exits
        stream.wait(timeout=60)
        out = log.read_text()
    finally:
        if stream.poll() is None:
            stream.kill()
            stream.wait()
    rtts = [float(x) / 1e3 for x in re.findall(r"time=([0-9.]+) ms", out)]
    sent = int(re.search(r"(\d+) packets transmitted", out).group(1))
    assert sent - len(rtts) <= 2, f"{sent - len(rtts)} of {sent} pings lost across in-place changes"
    assert max(rtts) >= 2 * LAN + 0.030 - 0.001, "the 15 ms each way never showed"
    assert min(rtts[-20:]) < 2 * LAN + 0.015, "the delay never went away again"
    p = ping("a-h1", C1)
    assert rtt_within_bar(p["min"], 2 * LAN), "delay removed: " + _msg(p, 2 * LAN)
    r = run_cli("net", "set", "a", "c", "--loss", "100%", "--one-way", timeout=CLI_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    assert ping("a-h1", C1, count=5)["received"] == 0
    r = run_cli("net", "set", "a", "c", "--loss", "0%", "--rate", "20Mbit", timeout=CLI_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    assert ping("a-h1", C1, count=5)["received"] == 5
    _, d = show()
    assert d["links"]["a->c"]["tc"]["shape"]["rate_bps"] == pytest.approx(20e6)
    assert d["state"]["links"]["a->c"]["rate_bps"] == pytest.approx(20e6)


def test_set_takes_every_link_field_from_another_process(up):
    """net set --reorder-probability/--reorder-gap, --distribution, --gilbert-elliott, --limit, --duplicate:
    applied in place (net show reads them back), measured where a ping can see it (half the pings sent at once
    skip the 20 ms one way), refused by the backend that cannot do it (exit 2, nothing changed), and undone.
    Four CLI calls under netem: each takes ~25 s in the kernel lab."""
    r = run_cli("net", "set", "a", "b", "--one-way", "--reorder-probability", "50%", timeout=CLI_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    assert "reorder 50% gap 1" in r.stdout
    p = ping("a-h1", B1, count=40, interval=0.1)
    full = 2 * 0.020 + 2 * LAN  # 20 ms each way over a-b, and the LAN of a once each way
    fast = sum(1 for x in p["rtts"] if x < full - 0.015)
    assert 8 <= fast <= 32 and p["received"] == 40, (fast, p["rtts"])  # Binomial(40, 0.5): 99.9 % within
    # per-packet jitter (--reorder): under netem a Gilbert-Elliott chain cannot share a leaf with the jitter
    # driver (tests/unit/test_loss_models.py); duplicate is netem's only
    flags = ["--jitter", "4ms", "--distribution", "pareto", "--reorder", "--reorder-gap", "5", "--gilbert-elliott",
             "1%,25%", "--limit", "500", *(["--duplicate", "1%"] if up == "netem" else [])]
    r = run_cli("net", "set", "a", "b", "--one-way", *flags, timeout=CLI_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    assert "reorder 50% gap 5" in r.stdout and "Gilbert-Elliott" in r.stdout and "limit 500" in r.stdout
    if up == "userspace":
        assert "distribution pareto" in r.stdout  # the daemon's shape (netem never dumps its table)
        bad = run_cli("net", "set", "a", "b", "--duplicate", "1%", timeout=CLI_TIMEOUT_S)
        assert bad.returncode == 2 and "--duplicate" in bad.stderr and "cannot duplicate" in bad.stderr, bad.stderr
    _, d = show()
    st = d["state"]["links"]["a->b"]
    assert (st["jitter_distribution"], st["reorder_pct"], st["reorder_gap"], st["ge_p_pct"], st["limit"]) == \
        ("pareto", 50, 5, 1, 500)
    assert st.get("duplicate_pct", 0) == (1 if up == "netem" else 0)
    tc = d["links"]["a->b"]["tc"]["shape"]
    assert tc["limit"] == 500
    if up == "netem":
        assert (tc["reorder_pct"], tc["reorder_gap"]) == (pytest.approx(50), 5)
        assert tc["duplicate_pct"] == pytest.approx(1)
    r = run_cli("net", "set", "a", "b", "--one-way", "--jitter", "0", "--no-reorder", "--reorder-probability", "0",
                "--gilbert-elliott", "off", "--limit", "auto", *(["--duplicate", "0%"] if up == "netem" else []),
                timeout=CLI_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("a->b:"))
    assert "reorder" not in line and "Gilbert-Elliott" not in line and "limit 500" not in line, line
    p = ping("a-h1", B1, count=20, interval=0.05)
    assert p["received"] == 20 and min(p["rtts"]) >= full - 0.002, p["rtts"]  # nothing sent at once any more


def test_down_and_up_from_another_process(up):
    assert ping("a-h1", B1, count=3)["received"] == 3
    r = run_cli("net", "set", "a", "b", "--down", timeout=CLI_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    assert "DOWN" in r.stdout
    assert ping("a-h1", B1, count=3)["received"] == 0
    r = run_cli("net", "set", "a", "b", "--up", timeout=CLI_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    p = ping("a-h1", B1, count=20)
    assert p["received"] >= 16 and rtt_within_bar(p["min"], 2 * LAN + 0.040), _msg(p, 2 * LAN + 0.040)


def test_exec_runs_in_the_node_and_returns_its_status(up):
    r = subprocess.run([*_cli(), "net", "exec", "b-h1", "--", "sh", "-c", "ip -o -4 addr show eth0; exit 3"],
                       capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=_env())
    assert r.returncode == 3
    assert B1 in r.stdout
    r = subprocess.run([*_cli(), "net", "exec", "b-h1", "--", "cat"], input="through stdin\n",
                       capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=_env())
    assert r.returncode == 0 and r.stdout == "through stdin\n"
    r = subprocess.run([*_cli(), "net", "exec", "nosuch", "--", "true"], capture_output=True, text=True,
                       timeout=CLI_TIMEOUT_S, env=_env())
    assert r.returncode == 2 and "a-h1" in r.stderr


def _cli() -> list[str]:
    import sys

    return [sys.executable, "-m", "testbed.cli"]


def _env() -> dict[str, str]:
    from tests.conftest import cli_env

    return cli_env()
