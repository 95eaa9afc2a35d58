"""Delay, jitter, reordering, loss, queue sizing and run-time changes under a kernel that has sch_netem.

Every test runs once per impairment backend: ``netem`` where the kernel has
sch_netem (``make test`` runs this module inside the kernel lab, a stock
Debian kernel under QEMU TCG, where everything is slow: the network is built
once per backend, pings are few, iperf3 runs short), and ``userspace`` (the
NFQUEUE backend) natively, on kernels without netem too — the same
behaviour is asked of both.  A backend that cannot run here is skipped.

The network (one host in a, b, c; routers only in d, e, f)::

    a --(50M, 20 ms)-- b --(50M, 10 ms b->c / 30 ms c->b)-- c
                       |--(100M, 10 ms +-4 ms, in order)--- d
                       |--(100M, 10 ms +-4 ms, reorder)---- e
                       |--(100M, 2 ms, 2 % loss b->f only)- f
                       |--(100M, 2 ms, Gilbert-Elliott b->g)- g   (p 1 %, r 25 %: 3.85 % lost in runs of 4)
                       |--(100M, 10 ms, pareto sd 4 ms, in order)- h
                       `--(100M, 10 ms, pareto sd 4 ms, reorder)-- i

Tolerances: minimum RTT within the kernel-lab issue's bar (1 ms + 5 %, what
``testbed net verify`` checks; inside the lab with the emulated CPU's one-sided
slack above, ``tests/netem/bars.py``); loss within
4 binomial standard deviations; jitter statistics within generous factors of
what uniform +-jitter implies (named at each assertion).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from testbed.network.measure import TCP_PAYLOAD_FRACTION, iperf3, ping
from tests.netem.bars import IN_LAB, TCG_SLACK_S, bar_text, rtt_within_bar
from tests.stall import measure
from topologies import from_dict
from traffic_control.jitter_driver import driven

pytestmark = [pytest.mark.netem, pytest.mark.root]


HERE = Path(__file__).resolve().parent
PROBE = str(HERE / "udp_probe.py")

SPEC = {
    "name": "netem_lab",
    "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}, {"name": "c", "hosts": 1},
            {"name": "d", "hosts": 0}, {"name": "e", "hosts": 0}, {"name": "f", "hosts": 0}, {"name": "g", "hosts": 0},
            {"name": "h", "hosts": 0}, {"name": "i", "hosts": 0}],
    "links": [
        {"a": "a", "b": "b", "rate": "50Mbit", "delay": "20ms"},
        {"a": "b", "b": "c", "rate": "50Mbit", "forward": {"delay": "10ms"}, "reverse": {"delay": "30ms"}},
        {"a": "b", "b": "d", "rate": "100Mbit", "delay": "10ms", "jitter": "4ms"},
        {"a": "b", "b": "e", "rate": "100Mbit", "delay": "10ms", "jitter": "4ms", "reorder": True},
        {"a": "b", "b": "f", "rate": "100Mbit", "delay": "2ms", "forward": {"loss": "2%"}},
        {"a": "b", "b": "g", "rate": "100Mbit", "delay": "2ms", "forward": {"gilbert_elliott": {"p": "1%", "r": "25%"}}},
        {"a": "b", "b": "h", "rate": "100Mbit", "delay": "10ms", "jitter": "4ms", "distribution": "pareto"},
        {"a": "b", "b": "i", "rate": "100Mbit", "delay": "10ms", "jitter": "4ms", "distribution": "pareto",
         "reorder": True},
    ],
}


def _netem_ok() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "needs root"
    from traffic_control.capabilities import probe_kernel

    cap = probe_kernel()["netem"]
    return cap.ok, cap.detail


def _userspace_ok() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "needs root"
    if IN_LAB:
        return False, "the userspace backend is tested natively; the lab is for netem"
    from traffic_control.userspace import available

    return available()


@pytest.fixture(scope="module", params=["netem", "userspace"])
def net(request):
    backend = request.param
    ok, why = _netem_ok() if backend == "netem" else _userspace_ok()
    if not ok:
        pytest.skip(f"{backend} backend not usable here ({why})"
                    + ("; run inside the kernel lab (`testbed lab -- python -m pytest -m netem tests/netem`)"
                       if backend == "netem" else ""))
    from testbed.network.emulation import EmulatedNetwork

    n = EmulatedNetwork(from_dict(SPEC), impairment=backend, with_ps=False)
    n.start()
    try:
        assert n.impairment.backend == backend and not n.impairment.skipped
        yield n
    finally:
        n.stop()


def daemon_shape(net, node: str, ifname: str):
    """The shape the userspace daemon on node:ifname applies."""
    return next(imp.shape for imp in net.userspace if imp.node == node and imp.ifname == ifname)


# ----------------------------------------------------------------- helpers
def wan(net, a: str, b: str):
    return next(w for w in net.plan.wans if {w.a, w.b} == {a, b})


def router(dc: str) -> str:
    return f"{dc}-r"


def peer_ip(net, src: str, dst: str) -> str:
    """dst router's address on the src-dst link."""
    w = wan(net, src, dst)
    return w.b_ip if w.a == src else w.a_ip


def host_ip(net, dc: str) -> str:
    return net.plan.nodes[f"{dc}-h1"].ip


def resolve_path(net, src: str, dst_ip: str, tries: int = 20) -> None:
    """Ping ``dst_ip`` from ``src`` until an echo comes back, so every hop has its neighbour.

    A stream's first datagram otherwise starts ARP on its first hop, and while that waits the
    kernel holds only ``unres_qlen_bytes`` (212992) of datagrams, 92 of the 1042-byte frames,
    and drops the rest.  On a link that corrupts or loses a share of its frames the ARP reply can
    be one of them (retried after 1 s): a 4000-datagram stream then arrives as its first 92, as
    CI's duplicate test saw twice.  The ping is retried for the same reason.
    """
    for _ in range(tries):
        if ping(net, src, dst_ip, count=1, timeout=30).received:
            return
    pytest.fail(f"{src} cannot reach {dst_ip}: no echo in {tries} pings")


def probe(net, src: str, dst: str, dst_ip: str, count: int, burst: int, gap_s: float,
          idle_s: float = 3.0, port: int = 7700, size: int = 64, expect: int | None = None) -> dict[str, Any]:
    """UDP stream of ``count`` datagrams of ``size`` bytes src -> dst (nodes), after the path's
    neighbours are resolved; the receiver's report (order, one-way delays).  The receiver stops at
    ``expect`` datagrams (default ``count``) or when idle after the sender is done."""
    resolve_path(net, src, dst_ip)
    rx = net.popen(dst, [sys.executable, PROBE, "recv", dst_ip, str(port), str(expect or count), str(idle_s)],
                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == "READY", rx.stderr.read()
        tx = net.popen(src, [sys.executable, PROBE, "send", dst_ip, str(port), str(count), str(burst), str(gap_s),
                             str(size)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = tx.communicate(timeout=300)
        assert tx.returncode == 0, err
        assert json.loads(out)["sent"] == count
        out, err = rx.communicate(timeout=120)
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    assert rx.returncode == 0, err
    return json.loads(out)


def netem_stats(net, node: str, ifname: str) -> dict[str, Any]:
    from traffic_control import netlink as tcnl

    info = tcnl.show(ifname, netns=net.netns(node))
    # netem's queue; with the userspace backend the HTB leaf (pfifo) is where the queue sits
    q = next(q for q in info["qdiscs"] if q["kind"] == "netem" or (q["kind"] == "pfifo" and q["parent"] == "1:1"))
    return {**q["stats"], "limit": q["limit"]}


def drain(net, node: str, ifname: str, timeout: float = 10.0) -> None:
    """Wait until the netem queue on ``ifname`` is empty (after a bulk flow)."""
    deadline = time.monotonic() + timeout
    while netem_stats(net, node, ifname)["backlog_pkts"] and time.monotonic() < deadline:
        time.sleep(0.1)


def report(what: str, text: str) -> None:
    """Measured values, visible with ``pytest -s`` (the lab's drift report reads them)."""
    print(f"MEASURED {what}: {text}", flush=True)


def _rtt_msg(measured: float, expected: float) -> str:
    return f"min RTT {measured * 1e3:.2f} ms, expected {expected * 1e3:.2f} ms ({bar_text()})"


# ------------------------------------------------------------ delay per direction
def test_read_back_matches_the_spec(net):
    rb = net.read_back()
    for w in net.plan.wans:
        for node, ifn, shape in ((w.a_router, w.a_if, w.forward), (w.b_router, w.b_if, w.reverse)):
            got = rb[f"{node}:{ifn}"]["shape"]
            if net.impairment.backend == "userspace":
                assert got["rate_bps"] == pytest.approx(shape.rate_bps)  # HTB stays in the kernel
                assert got["limit"] == shape.netem_limit
                d = daemon_shape(net, node, ifn)
                assert (d.delay_s, d.jitter_s, d.loss_pct, d.reorder, d.ge_p_pct, d.ge_r_pct) == pytest.approx(
                    (shape.delay_s, shape.jitter_s, shape.loss_pct, shape.reorder, shape.ge_p_pct, shape.ge_r_pct))
                continue
            if driven(shape):  # the jitter driver holds one interval's delay, netem's own jitter off
                lo, hi = -1.0, 1.0  # uniform; a table's extremes otherwise
                if shape.jitter_distribution != "uniform":
                    from traffic_control.delay_dist import SCALE, table

                    lo, hi = min(table(shape.jitter_distribution)) / SCALE, max(table(shape.jitter_distribution)) / SCALE
                assert max(0.0, shape.delay_s + lo * shape.jitter_s) - 2e-6 <= got["delay_s"] \
                    <= shape.delay_s + hi * shape.jitter_s + 2e-6
                assert got["jitter_s"] == 0 and got["reorder"] is False
            else:
                assert got["delay_s"] == pytest.approx(shape.delay_s, abs=2e-6)
                assert got["jitter_s"] == pytest.approx(shape.jitter_s, abs=2e-6)
                if shape.jitter_s:
                    assert got["reorder"] == shape.reorder
            assert got["loss_pct"] == pytest.approx(shape.loss_pct, abs=1e-6)
            assert (got["reorder_pct"], got["reorder_gap"]) == (pytest.approx(shape.reorder_pct), shape.reorder_gap)
            for k in ("ge_p_pct", "ge_r_pct", "ge_loss_bad_pct", "ge_loss_good_pct"):
                assert got.get(k, 100.0 if k == "ge_loss_bad_pct" else 0.0) == pytest.approx(getattr(shape, k), abs=1e-6), k
            assert got["limit"] == shape.netem_limit
            assert got["rate_bps"] == pytest.approx(shape.rate_bps)


@pytest.mark.parametrize("a,b", [("a", "b"), ("b", "c")], ids=["symmetric", "asymmetric"])
def test_min_rtt_over_a_link(net, a, b):
    w = wan(net, a, b)
    expected = w.forward.delay_s + w.reverse.delay_s
    pr = ping(net, router(a), peer_ip(net, a, b), count=10, interval=0.1)
    report(f"link {a}-{b}", _rtt_msg(pr.min_s, expected))
    assert pr.received >= 8
    assert rtt_within_bar(pr.min_s, expected), _rtt_msg(pr.min_s, expected)


def test_min_rtt_over_a_relayed_path(net):
    t = net.topo
    assert t.path("a", "c") == ["a", "b", "c"]
    expected = t.expected_rtt("a", "c")
    assert expected == pytest.approx(0.020 + 0.010 + 0.030 + 0.020)
    pr = ping(net, "a-h1", host_ip(net, "c"), count=10, interval=0.1)
    report("relayed a-b-c", _rtt_msg(pr.min_s, expected))
    assert pr.received >= 8
    assert rtt_within_bar(pr.min_s, expected), _rtt_msg(pr.min_s, expected)


@pytest.mark.parametrize("src,dst,delay", [("b", "c", 0.010), ("c", "b", 0.030)], ids=["forward", "reverse"])
def test_one_way_delay_per_direction(net, src, dst, delay):
    # the two directions of b-c differ (10 ms vs 30 ms): each shape must sit on its own egress
    r = probe(net, router(src), router(dst), peer_ip(net, src, dst), count=20, burst=1, gap_s=0.02, port=7701)
    assert r["received"] == 20
    owd = min(r["owd_ms"]) / 1e3
    report(f"one-way {src}->{dst}", f"min {owd * 1e3:.2f} ms, expected {delay * 1e3:.1f} ms")
    # Timestamps are taken in Python on both ends (under QEMU TCG that alone costs ~1 ms), hence
    # 2 ms + 5 % above; netem never releases a packet early, hence 0.2 ms below.  10 ms vs 30 ms
    # per direction is what this test tells apart.
    assert delay - 0.2e-3 <= owd <= delay + 2e-3 + 0.05 * delay + TCG_SLACK_S / 2, \
        f"min one-way delay {owd * 1e3:.2f} ms, expected {delay * 1e3:.1f} ms"


# ------------------------------------------------------------------ jitter
def test_jitter_spread(net):
    """RTT over b-d: 2 x 10 ms + U(-4, 4) + U(-4, 4) ms; pings 30 ms apart are never reordered or held.

    200 pings (``ping`` reports each RTT up to 200): the interquartile range of n samples of that
    triangular law has a sampling sd of about 5.6 ms / sqrt(n), 0.40 ms here, so the 0.6 x bar
    (1.9 ms below the expected 4.69 ms) sits 4.7 sd away.  With 80 pings it sat 3 sd away, and a
    CI run measured 2.80 ms against a 2.81 ms bar.
    """
    w = wan(net, "b", "d")
    j = w.forward.jitter_s
    pr = ping(net, router("b"), peer_ip(net, "b", "d"), count=200, interval=0.03)
    rtts = pr.rtts_s
    assert len(rtts) >= 190
    base = w.forward.delay_s + w.reverse.delay_s
    # RTT - base is the sum of two uniforms on [-j, j]: triangular on [-2j, 2j], median 0,
    # stdev j*sqrt(2/3), interquartile range 4j(1 - 1/sqrt(2)).  Median and IQR are used as
    # the checks because a few scheduling hiccups (QEMU TCG) must not decide the outcome.
    med = statistics.median(rtts)
    q = statistics.quantiles(rtts, n=4)
    iqr = q[2] - q[0]
    iqr_expected = 4 * j * (1 - 1 / math.sqrt(2))
    sd, sd_expected = statistics.stdev(rtts), j * math.sqrt(2 / 3)
    report("jitter b-d", f"RTT median {med * 1e3:.2f} ms (expected {base * 1e3:.1f}), IQR {iqr * 1e3:.2f} ms "
           f"(expected {iqr_expected * 1e3:.2f}), stdev {sd * 1e3:.2f} ms (expected {sd_expected * 1e3:.2f}), "
           f"min {min(rtts) * 1e3:.2f}, max {max(rtts) * 1e3:.2f}")
    assert base - 1e-3 - 0.1 * base <= med <= base + 1e-3 + 0.1 * base + TCG_SLACK_S, \
        f"median RTT {med * 1e3:.2f} ms, expected {base * 1e3:.1f} ms"
    assert 0.6 * iqr_expected <= iqr <= 1.5 * iqr_expected + TCG_SLACK_S, \
        f"RTT IQR {iqr * 1e3:.2f} ms; uniform +-{j * 1e3:g} ms each way implies {iqr_expected * 1e3:.2f} ms"
    assert sd >= 0.6 * sd_expected, f"RTT stdev {sd * 1e3:.2f} ms: less spread than +-{j * 1e3:g} ms jitter gives"
    assert min(rtts) >= base - 2 * j - 0.5e-3, "an RTT below the jitter's lower bound"
    assert max(rtts) >= base + 0.5 * j, "no RTT in the upper part of the spread: jitter not applied?"


def test_jitter_in_order_gives_bulk_traffic_the_defined_distribution(net):
    """README "Jitter, defined": a dense one-way train over b->d (10 ms +- 4 ms, order kept) sees mean and sd as
    defined (the delay process: netem moved by the jitter driver, or the userspace daemon).  A per-packet draw with
    order kept (a running maximum) reads ~12.9 ms and a quarter of the spread: it fails the mean and sd rows."""
    from testbed.network.delay_check import SPACING_S, checks_for, run_train, train_seconds

    w = wan(net, "b", "d")
    shape = w.forward if w.a == "b" else w.reverse
    spacing = 0.002 if IN_LAB else SPACING_S  # a Python sender under TCG: fewer, later stamps
    count = int(train_seconds(shape) / spacing)
    sent, got = daemon_train(net, router("b"), "w-d", lambda: run_train(net, router("b"), router("d"),
                             peer_ip(net, "b", "d"), count, spacing, shape.delay_s + shape.jitter_s),
                             "the dense jitter train b->d", count)
    rows = {c.kind: c for c in checks_for("b->d", shape, sent, got)}
    report("jitter b->d (dense train)", ", ".join(f"{k} {c.measured} (expected {c.expected}) {c.status}"
                                                  for k, c in rows.items()))
    if net.impairment.backend == "netem":
        from testbed.network import jitter_control

        h = jitter_control.health()
        report("jitter driver", json.dumps(h))
        assert h and h["state"] == "running" and h["errors"] == 0 and h["changes"] > 10
    mean, mean_exp = rows["delay_mean"].measured, rows["delay_mean"].expected
    # the row's bar, plus (in the lab) half the emulated CPU's one-sided slack: stamps taken in Python
    tol = 0.0005 + 0.05 * mean_exp + 3 * rows["delay_sd"].expected / math.sqrt(rows["delay_mean"].extra["intervals"])
    assert mean_exp - tol <= mean <= mean_exp + tol + (TCG_SLACK_S / 2 if IN_LAB else 0), rows["delay_mean"]
    assert rows["delay_sd"].status == "pass", rows["delay_sd"]
    assert rows["reordering"].status == "pass" and rows["loss"].status == "pass"


#: A release this late is the machine's, not the emulation's: the daemon was not running when packets were due
#: (its lateness histogram: bucket k counts release turns late by [2^(k-1), 2^k) us; from 8.2 ms up).  A turn
#: releases every packet then due, and packets that reached the queue while the daemon was stopped are
#: stamped when it wakes, so one late turn can stand for a whole stopped spell (measured: SIGSTOP of the
#: daemon for 0.3 s in a 1 ms-spaced train counted 1 late turn).
LATE_US_BUCKET = 14


def daemon_late(net, node: str, ifname: str) -> int:
    """Release turns of the userspace daemon on node:ifname that came >= 8.2 ms late, so far (0 without one)."""
    imp = next((i for i in net.userspace if i.node == node and i.ifname == ifname), None)
    if imp is None:
        return 0
    time.sleep(0.25)  # its heartbeat (every 0.1 s) has counted what was released
    hist = imp.health().stats.get("late_hist_log2_us") or []
    return int(sum(hist[LATE_US_BUCKET:]))


def daemon_train(net, node: str, ifname: str, train, what: str, packets: int, attempts: int = 3):
    """``train()`` (stall-watched) measured again, up to ``attempts`` times, while the daemon that holds its
    packets had a release turn >= 8.2 ms late during it: the machine stopped the daemon (CI read p99 45 and
    70 ms for 10 +- 4 ms that way, two tests of one run, with no stall of the test process itself), which
    no bar should absorb.  Natively the daemon releases within tens of microseconds (README "Delay without
    netem"); a daemon that is late every time fails on the last train as before."""
    for attempt in range(attempts):
        before = daemon_late(net, node, ifname)
        out = measure(train, what)
        late = daemon_late(net, node, ifname) - before
        if not late or attempt == attempts - 1:
            return out
        print(f"LATE: the daemon on {node}:{ifname} had {late} release turn(s) >= 8.2 ms late during {what} "
              f"(~{packets} packets; the machine stopped it, not the emulation); measuring again")
    raise AssertionError("unreachable")


MIN_DRAWS = 56  # an order-kept train holds 100 draws natively; 8 % of the pareto table lies past 1.5 sd: 0.92^56 = 0.9 % to miss


def driver_draws() -> float:
    """The jitter driver's changes per leaf so far: its health, written every 0.5 s, so a count read before a
    train and one read after are both up to 0.5 s old (the two errors cancel on average)."""
    from testbed.network import jitter_control

    h = jitter_control.health() or {}
    return float(h.get("changes", 0)) / max(1, int(h.get("leaves", 1)))


def driver_train(train, count: int, what: str, attempts: int = 2, max_count: int = 8000):
    """``train(count)`` measured while counting the driver's draws; again, longer by the draws missing (up to
    ``max_count`` datagrams, ``attempts`` trains in all), while it drew fewer than :data:`MIN_DRAWS`.  Under
    the lab's one emulated CPU the driver makes ~6 changes a second per leaf (4 leaves), not 25.  Returns the
    train's (sent, got) and the draws it held."""
    for attempt in range(attempts):
        before = driver_draws()
        sent, got = measure(lambda n=count: train(n), what)
        drawn = int(driver_draws() - before)
        if drawn >= MIN_DRAWS or attempt == attempts - 1 or count >= max_count:
            return sent, got, drawn
        count = min(max_count, int(count * 1.3 * MIN_DRAWS / max(drawn, 1)))
        print(f"STARVED: the jitter driver made {drawn} draws during {what}; measuring again with {count}")
    raise AssertionError("unreachable")


@pytest.mark.parametrize("dc", ["h", "i"])
def test_pareto_jitter_gives_the_tables_distribution(net, dc):
    """distribution: pareto (traffic_control/delay_dist.py), order kept (h: the jitter driver or the daemon's
    per-interval draws) and per packet (i: netem's own draws from the table sent in TCA_NETEM_DELAY_DIST, or the
    daemon's).  Mean and sd within net verify's bars; and the shape: a long right tail (p99 at the table's 4 sd
    clip, 26 ms; uniform +-4 ms never passes 14 ms) and a median below the mean (a symmetric draw has them equal).
    In order, a train holds only 100 draws (4 s at the default 40 ms interval) (8 % of the table lies past 1.5 sd, 4 % past 2.5 sd: the tail bar is
    1.5 sd there, missed by chance with probability 0.92^100 = 0.02 %); per packet it holds 1000-2000."""
    from testbed.network.delay_check import SPACING_S, checks_for, run_train, train_seconds

    w = wan(net, "b", dc)
    shape = w.forward if w.a == "b" else w.reverse
    assert shape.jitter_distribution == "pareto"
    spacing = 0.002 if IN_LAB else SPACING_S
    count = int(train_seconds(shape) / spacing)
    by_driver = net.impairment.backend == "netem" and driven(shape)

    def train(n: int):
        return run_train(net, router("b"), router(dc), peer_ip(net, "b", dc), n, spacing,
                         shape.delay_s + 4 * shape.jitter_s)

    tail = 2.5 if shape.reorder else 1.5
    if by_driver:
        # the driver's draws are the sample: when the lab's one emulated CPU starves it, the train holds a few
        # (CI once read sd 0.69 ms and p99 9.4 ms for 10 +- 4 ms: a handful of draws, not 100); measured again.
        # Its draws are also unevenly spaced there (it runs up to 40 ms late), so a train of ~60 draws missed
        # the tail once in CI (p99 15.07 ms for a 16 ms bar, sd 1.96 ms): a train that misses it is measured
        # again, 3 trains in all, each one new draws; a driver that never draws the tail still fails
        for attempt in range(3):
            sent, got, drawn = driver_train(train, count, f"the pareto train b->{dc}")
            if drawn < MIN_DRAWS or got["p99_s"] >= shape.delay_s + tail * shape.jitter_s or attempt == 2:
                break
            print(f"TAIL MISSED: p99 {got['p99_s']} over {drawn} driver draws on b->{dc}; measuring again")
    else:
        sent, got = daemon_train(net, router("b"), f"w-{dc}", lambda: train(count), f"the pareto train b->{dc}",
                                 count)
    rows = {c.kind: c for c in checks_for(f"b->{dc}", shape, sent, got)}
    report(f"pareto b->{dc} ({'reorder' if shape.reorder else 'in order'})",
           ", ".join(f"{k} {c.measured} (expected {c.expected}) {c.status}" for k, c in rows.items())
           + f"; p50 {got['p50_s']}" + (f"; driver draws {drawn}" if by_driver else ""))
    mean, mean_exp = rows["delay_mean"].measured, rows["delay_mean"].expected
    k = rows["delay_mean"].extra["intervals"] or count
    if by_driver:
        k = min(k, max(drawn, 1))  # the standard error over the draws the train really held
    tol = 0.0005 + 0.05 * mean_exp + 3 * rows["delay_sd"].expected / math.sqrt(k)
    assert mean_exp - tol <= mean <= mean_exp + tol + (TCG_SLACK_S / 2 if IN_LAB else 0), rows["delay_mean"]
    if by_driver and drawn < MIN_DRAWS:
        report(f"pareto b->{dc}", f"tail not asserted: the driver made {drawn} draws in the train (the lab starved it)")
        return
    assert got["p99_s"] >= shape.delay_s + tail * shape.jitter_s, f"p99 {got['p99_s']}: no pareto tail"
    if IN_LAB and not shape.reorder:
        # the lab's jitter driver runs up to 40 ms late under TCG (its health says so), so the order-kept
        # process it moves is not the defined one there: sd 3.13, 6.62 and 2.19 ms for 3.85, the median once
        # at the mean.  Natively (the daemon's draws) sd 3.90-4.17; per packet (netem's own draws from the
        # table, link i) the lab reads the table's shape
        report(f"pareto b->{dc} in the lab", "sd and skew not asserted: the driver's lateness under TCG decides them")
        return
    assert rows["delay_sd"].status == "pass", rows["delay_sd"]
    assert got["p50_s"] <= mean - 0.15 * shape.jitter_s, f"median {got['p50_s']} vs mean {mean}: not skewed"
    assert rows["loss"].status == "pass"


def test_reorder_probability_sends_a_share_at_once_and_clears(net):
    """reorder_probability 25 %, gap 5 on a->b (20 ms): a share 1 / (4 + 4) = 12.5 % of the packets is sent at
    once, overtaking the held ones (netem's reorder, or the daemon's same rule); cleared by a change, none is."""
    w = wan(net, "a", "b")
    old = w.forward if w.a == "a" else w.reverse
    new = old.with_changes(reorder_pct=25.0, reorder_gap=5)
    n = 1600

    def fast_share(port: int) -> tuple[float, dict[str, Any]]:
        r = probe(net, router("a"), router("b"), peer_ip(net, "a", "b"), count=n, burst=16, gap_s=0.004, port=port)
        assert r["received"] == n
        return sum(1 for d in r["owd_ms"] if d < old.delay_s * 1e3 / 2) / n, r

    net.change_link("a", "b", new)
    try:
        share, r = fast_share(7710)
    finally:
        net.change_link("a", "b", old)
    after, r_after = fast_share(7711)
    f = new.immediate_share
    bound = 4 * math.sqrt(f * (1 - f) / n)
    report("reorder 25 % gap 5", f"{share:.3f} of {n} at once (expected {f:.3f} +- {bound:.3f}), "
           f"{r['out_of_order']} out of order; after clearing: {after:.3f}, {r_after['out_of_order']} out of order")
    assert abs(share - f) <= bound
    assert r["out_of_order"] >= 0.5 * f * n
    assert after == 0 and r_after["out_of_order"] == 0


def test_cross_traffic_delivers_its_rates_beside_a_measured_flow(net, tmp_path):
    """Cross traffic (testbed/network/cross_traffic.py) on a-b (50 Mbit/s, 20 ms): a paced 10 Mbit/s TCP flow
    and a 15 Mbit/s UDP flow a->b beside iperf3 a->b.  The UDP flow is unresponsive and delivers its rate;
    the paced TCP flow is congestion-controlled and shares with iperf3 (natively 9.08 of 9.65 Mbit/s, in the
    lab 6.29: a greedy flow beside it fills the queue); together they fill the link, iperf3 does not alone."""
    from testbed.network.cross_traffic import CrossTraffic, parse_cross_traffic

    flows = parse_cross_traffic([{"from": "a", "to": "b", "pattern": "constant", "rate": "10Mbit"},
                                 {"from": "a", "to": "b", "pattern": "constant", "rate": "15Mbit",
                                  "protocol": "udp"}], ["a", "b"])
    cross = CrossTraffic(net, flows, tmp_path).start()
    try:
        time.sleep(1.0)
        left = iperf3(net, "a-h1", "b-h1", host_ip(net, "b"), seconds=3, port=5311)["bps"]
    finally:
        summary = cross.stop()
    tcp, udp = summary["flows"]
    report("cross traffic a->b", f"TCP {tcp['goodput_bps'] / 1e6:.2f} Mbit/s (10 x 1448/1500 = 9.65), UDP "
           f"{udp['goodput_bps'] / 1e6:.2f} (15 x 1468/1500 = 14.68), iperf3 beside them {left / 1e6:.2f} "
           f"(50 - 25 = 25 x 1448/1514 = 23.9)")
    assert summary["errors"] == []
    # in the lab the Python sender shares one emulated CPU with everything else (0.89 and 0.93 of the UDP
    # rate seen there), and the three flows together reached 36.6-47.8 of 50 Mbit/s: the emulated CPU, not
    # the link, so the lab asserts the flows ran and shared, natively also that they filled the link
    assert udp["goodput_bps"] >= (0.7 if IN_LAB else 0.85) * 15e6 * 1468 / 1500
    assert tcp["goodput_bps"] >= (0.1 if IN_LAB else 0.3) * 10e6 * 1448 / 1500
    assert left <= 0.75 * 50e6 * TCP_PAYLOAD_FRACTION  # the link's 50 Mbit/s is shared, not all iperf3's
    if not IN_LAB:
        assert tcp["goodput_bps"] + udp["goodput_bps"] + left >= 0.85 * 50e6 * TCP_PAYLOAD_FRACTION


def test_jitter_keeps_order_unless_reorder_is_asked(net):
    """Documented choice (shape.py): reorder=False keeps packet order under jitter; reorder=True does not."""
    kept = probe(net, router("b"), router("d"), peer_ip(net, "b", "d"), count=1500, burst=50, gap_s=0.005,
                 port=7702)
    assert kept["received"] == 1500
    assert kept["out_of_order"] == 0, f"{kept['out_of_order']} packets reordered on a reorder=false link"
    # held packets still see the jitter's lower bound: nothing leaves early
    assert min(kept["owd_ms"]) >= (0.010 - 0.004) * 1e3 - 0.5
    mixed = probe(net, router("b"), router("e"), peer_ip(net, "b", "e"), count=1500, burst=50, gap_s=0.005,
                  port=7703)
    assert mixed["received"] == 1500
    report("reorder", f"in-order link: {kept['out_of_order']} of 1500 out of order; "
           f"reorder link: {mixed['out_of_order']} of 1500")
    assert mixed["out_of_order"] >= 15, f"only {mixed['out_of_order']} reordered with reorder=true"


def test_reorder_switch_changes_in_place(net):
    w = wan(net, "b", "d")
    old = w.forward
    key = f"{w.a_router}:{w.a_if}"
    def reorder() -> bool:
        if net.impairment.backend == "userspace":
            return daemon_shape(net, w.a_router, w.a_if).reorder
        return net.read_back()[key]["shape"]["reorder"]

    net.change_link("b", "d", old.with_changes(reorder=True))
    try:
        assert reorder() is True
    finally:
        net.change_link("b", "d", old)
    assert reorder() is False


# -------------------------------------------------------------------- loss
def test_loss_within_binomial_bound(net):
    """2 % loss, 2000 datagrams: the count lost within 4 sigma.  Under TCG a probe process can be starved for
    seconds (CI once read 1731 of 2000 lost: the receiver gave up on a 3 s silence mid-stream), so a train
    outside the bound is sent again, up to 3 trains with new draws; a link that really loses the wrong share
    fails all three."""
    n, p = 2000, 0.02
    sigma = math.sqrt(n * p * (1 - p))
    for attempt in range(3):
        r = probe(net, router("b"), router("f"), peer_ip(net, "b", "f"), count=n, burst=20, gap_s=0.004,
                  port=7704 + 10 * attempt)
        lost = n - r["unique"]
        report("loss b->f", f"lost {lost} of {n}, expected {n * p:.0f} +- {4 * sigma:.1f} (train {attempt + 1})")
        if abs(lost - n * p) <= 4 * sigma:
            break
    assert abs(lost - n * p) <= 4 * sigma, f"lost {lost} of {n}; expected {n * p:.0f} +- {4 * sigma:.1f} (4 sigma)"
    # the reverse direction has no loss: a short stream arrives whole
    back = probe(net, router("f"), router("b"), peer_ip(net, "f", "b"), count=200, burst=20, gap_s=0.004,
                 port=7705)
    assert back["unique"] == 200


def loss_runs(seqs: list[int], n: int) -> list[int]:
    """Lengths of the runs of consecutive lost sequence numbers among 0..n-1."""
    got = set(seqs)
    runs, c = [], 0
    for q in range(n):
        if q not in got:
            c += 1
        elif c:
            runs.append(c)
            c = 0
    return runs + ([c] if c else [])


def test_gilbert_elliott_loss_comes_in_bursts(net):
    """b->g loses p/(p+r) = 3.85 % of packets in runs of mean 1/r = 4 (independent loss at that rate:
    runs of ~1.04, which fails the run bar).  Bounds: the lost count's sd with bursts is
    sqrt(E[bursts] x E[run^2]) (~52 of ~385 at n = 10000), 4 of them; the mean run within [2.5, 6] (its sd ~0.35)."""
    n = 10000
    w = wan(net, "b", "g")
    shape = w.forward if w.a == "b" else w.reverse
    r = probe(net, router("b"), router("g"), peer_ip(net, "b", "g"), count=n, burst=20, gap_s=0.004, port=7708)
    runs = loss_runs(r["seqs"], n)
    lost, expected = sum(runs), n * shape.expected_loss_pct / 100
    p, q = shape.ge_p_pct / 100, shape.ge_r_pct / 100
    bursts = n * p * (1 - shape.expected_loss_pct / 100)
    sd = math.sqrt(bursts * ((1 - q) / q ** 2 + 1 / q ** 2))
    mean_run = lost / max(1, len(runs))
    report("Gilbert-Elliott b->g", f"lost {lost} of {n} (expected {expected:.0f} +- {4 * sd:.0f}) in {len(runs)} runs "
           f"of mean {mean_run:.2f} (expected {1 / q:.1f})")
    assert abs(lost - expected) <= 4 * sd, (lost, expected, sd)
    assert 2.5 <= mean_run <= 6, f"mean loss run {mean_run:.2f}: not bursty (independent loss gives ~1.04)"
    back = probe(net, router("g"), router("b"), peer_ip(net, "g", "b"), count=200, burst=20, gap_s=0.004, port=7709)
    assert back["unique"] == 200


# ------------------------------------------------------------ queue sizing
def test_bulk_tcp_reaches_the_rate_with_a_bdp_sized_queue(net):
    """A queue of >= 2 BDP lets one bulk TCP flow fill the link without netem drops.  The flow is
    measured again (3 tries in all) when it fell short: in the lab one emulated CPU carries iperf3, both
    routers and the shaper, and CI saw 0.886 x ideal with 0 drops and 0 retransmits (the CPU, not the
    queue).  Every try must keep netem's drops under 2 %: that is the queue's claim."""
    w = wan(net, "a", "b")
    shape = w.forward
    bdp_pkts = shape.rate_bps / 8 * (shape.delay_s + w.reverse.delay_s) / shape.mtu
    ideal = shape.rate_bps * TCP_PAYLOAD_FRACTION
    best = 0.0
    for attempt in range(3):
        before = netem_stats(net, w.a_router, w.a_if)
        assert before["limit"] >= 2 * bdp_pkts
        res = iperf3(net, "a-h1", "b-h1", host_ip(net, "b"), seconds=6, omit=2)
        after = netem_stats(net, w.a_router, w.a_if)
        pkts = after["packets"] - before["packets"]
        drops = after["drops"] - before["drops"]
        report(f"bulk a->b (try {attempt + 1})", f"goodput {res['bps'] / ideal:.3f} x ideal, netem drops {drops} "
               f"of {pkts} packets, limit {after['limit']}, retransmits {res.get('retransmits')}")
        assert pkts > 0
        assert drops <= 0.02 * pkts, f"netem dropped {drops} of {pkts} packets (limit {after['limit']})"
        best = max(best, res["bps"])
        if best >= 0.9 * ideal:
            break
    assert best >= 0.9 * ideal, f"best goodput of 3 tries {best / 1e6:.2f} Mbit/s < 0.9 x {ideal / 1e6:.2f}"


# ------------------------------------------------------- run-time changes
def test_change_delay_and_rate_on_a_live_connection(net):
    from tests.network.helpers import interval_bps, iperf3_finish, iperf3_live

    w = wan(net, "a", "b")
    fwd, rev = w.forward, w.reverse
    srv, cli = iperf3_live(net, "a-h1", "b-h1", host_ip(net, "a"), seconds=8, interval=0.5, port=5231)
    try:
        time.sleep(3.0)
        net.change_link("a", "b", fwd.with_changes(delay_s=0.040, rate_bps=25e6))
        net.change_link("b", "a", rev.with_changes(delay_s=0.040))
        data = iperf3_finish(srv, cli, timeout=60)
        assert len(data["start"]["connected"]) == 1
        assert data["end"]["sum_sent"]["seconds"] >= 7.5
        after = interval_bps(data, 5.5, 8.0)
        report("live change", f"rate after {after / 1e6:.2f} Mbit/s (expected ~{25 * TCP_PAYLOAD_FRACTION:.2f})")
        # Under QEMU TCG, HTB behind netem overshoots after a change (runs read 1.22x and 1.38x
        # the new rate: timers of an emulated CPU); there only the direction and the rough size
        # of the change are checked.  Natively (either backend) the bar is 15 %.
        assert after == pytest.approx(25e6 * TCP_PAYLOAD_FRACTION, rel=0.5 if IN_LAB else 0.15)
        drain(net, w.a_router, w.a_if)  # the flow's standing queue must not count as delay
        pr = ping(net, router("a"), peer_ip(net, "a", "b"), count=10, interval=0.1)
        assert rtt_within_bar(pr.min_s, 0.080), _rtt_msg(pr.min_s, 0.080)
        got = net.read_back()[f"{w.a_router}:{w.a_if}"]["shape"]
        assert got["rate_bps"] == pytest.approx(25e6)
        if net.impairment.backend == "userspace":
            assert daemon_shape(net, w.a_router, w.a_if).delay_s == pytest.approx(0.040)
        else:
            assert got["delay_s"] == pytest.approx(0.040, abs=2e-6)
    finally:
        if cli.poll() is None:
            cli.kill()
        net.change_link("a", "b", fwd)
        net.change_link("b", "a", rev)
    pr = ping(net, router("a"), peer_ip(net, "a", "b"), count=10, interval=0.1)
    assert rtt_within_bar(pr.min_s, 0.040), _rtt_msg(pr.min_s, 0.040)


def test_link_down_and_up(net):
    pr = ping(net, "a-h1", host_ip(net, "b"), count=2, interval=0.2)
    assert pr.received == 2
    net.set_link_up("a", "b", False)
    try:
        pr = ping(net, "a-h1", host_ip(net, "b"), count=2, interval=0.2)
        assert pr.received == 0
    finally:
        net.set_link_up("a", "b", True)
    # The first ping after the link comes back resolves the routers' neighbours again (its RTT
    # carries an ARP round trip over the delayed link); the minimum of 10 stands for the link.
    # Three pings were too few under the lab's emulated CPU on a busy host: their minimum read
    # 43.86 ms for a 40 ms path once (the bar is 40 ms + 1 ms + 5 %).
    pr = ping(net, "a-h1", host_ip(net, "b"), count=10, interval=0.1)
    report("link down/up", _rtt_msg(pr.min_s, 0.040))
    assert pr.received >= 8
    assert rtt_within_bar(pr.min_s, 0.040), _rtt_msg(pr.min_s, 0.040)


# ------------------------------------------------------------------- torch
@pytest.mark.torch
@pytest.mark.slow
def test_gloo_allreduce_time_grows_with_rtt(net, tmp_path):
    """Two DCs, one gloo all-reduce per phase; the link's delay is raised between phases.

    Under the kernel lab (QEMU TCG) ``import torch`` alone takes minutes, so
    the lab run (GEO_TESTBED_IN_LAB=1) skips it unless TESTBED_LAB_TORCH=1.
    """
    if os.environ.get("GEO_TESTBED_IN_LAB") == "1" and os.environ.get("TESTBED_LAB_TORCH") != "1":
        pytest.skip("torch under QEMU TCG takes minutes to import; set TESTBED_LAB_TORCH=1 to run it in the lab")
    pytest.importorskip("torch")
    w = wan(net, "a", "b")
    fwd, rev = w.forward, w.reverse
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    master = host_ip(net, "a")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
    argv = [sys.executable, str(HERE / "allreduce.py")]
    procs = [net.popen(f"{dc}-h1", [*argv, str(rank), master, "29511", str(ctl), "2", "5", "65536"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for rank, dc in enumerate(("a", "b"))]
    try:
        (ctl / "go0").touch()
        deadline = time.monotonic() + 600
        while not (ctl / "done0").exists():
            assert time.monotonic() < deadline, "phase 0 did not finish"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.1)
        net.change_link("a", "b", fwd.with_changes(delay_s=0.060))
        net.change_link("b", "a", rev.with_changes(delay_s=0.060))
        (ctl / "go1").touch()
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        net.change_link("a", "b", fwd)
        net.change_link("b", "a", rev)
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    t_low, t_high = json.loads(outs[0][0].strip().splitlines()[-1])
    report("gloo all-reduce", f"{t_low * 1e3:.1f} ms at RTT 40 ms, {t_high * 1e3:.1f} ms at RTT 120 ms")
    rtt_low, rtt_high = 0.040, 0.120
    # a 2-rank ring all-reduce waits for at least one round trip; more delay, more time
    assert t_low >= 0.5 * rtt_low, f"all-reduce {t_low * 1e3:.1f} ms at RTT 40 ms: traffic not on the link?"
    assert t_high - t_low >= 0.5 * (rtt_high - rtt_low), \
        f"all-reduce {t_low * 1e3:.1f} ms at RTT 40 ms vs {t_high * 1e3:.1f} ms at RTT 120 ms"
