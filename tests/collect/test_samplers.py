"""Samplers against a real scratch namespace: veth pair, HTB queue, ping traffic.

Everything created is named ``cltest*`` and removed in ``finally``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.collect.samplers import (
    LinkSampler,
    LinkTarget,
    ProcSampler,
    ProcTarget,
    SamplerSet,
    netns_path,
)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_netns_path_forms() -> None:
    assert netns_path(None) is None
    assert netns_path(123) == "/proc/123/ns/net"
    assert netns_path("/proc/9/ns/net") == "/proc/9/ns/net"
    assert netns_path("blue") == "/var/run/netns/blue"


def test_samplers_stamp_on_the_trials_clock_anchor(tmp_path: Path) -> None:
    """``ts`` is monotonic time mapped by the anchor the trainers' recorders use, not a wall-clock read
    per tick: an anchor 10 s ahead of this process's own mapping moves every sample 10 s later."""
    t0 = time.time_ns()
    own = time.time_ns() - time.perf_counter_ns()
    sset = SamplerSet(tmp_path, t0, procs=[ProcTarget(os.getpid(), "h0", "worker", 0)], rate_hz=20,
                      offset_ns=own + 10_000_000_000)
    assert sset.procs.offset_ns == own + 10_000_000_000
    sset.start()
    time.sleep(0.3)
    sset.stop()
    ts = [r["ts"] for r in _lines(tmp_path / "samples" / "procs.jsonl")]
    assert len(ts) >= 3 and ts == sorted(ts)
    assert all(10e9 <= t <= 10e9 + 5e9 for t in ts), ts  # a per-tick wall read would give 0..5 s
    # without an anchor, one is read once at construction and shared by the set's samplers
    plain = SamplerSet(tmp_path / "b", t0, procs=[], rate_hz=20)
    assert abs(plain.procs.offset_ns - own) < 1e9


def test_proc_sampler_own_process(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<0.6: pass"])
    try:
        ps = ProcSampler(tmp_path / "procs.jsonl", [ProcTarget(os.getpid(), "h0", "worker", 0)],
                         t0_ns=time.time_ns(), rate_hz=20)
        ps.start()
        ps.add(ProcTarget(child.pid, "h1", "server", 1))
        child.wait(timeout=10)
        time.sleep(0.2)
        stats = ps.stop()
    finally:
        child.kill()
        child.wait()
    rows = _lines(tmp_path / "procs.jsonl")
    assert {"ts", "host", "role", "rank", "pid", "cpu_percent", "rss_bytes"} <= set(rows[0])
    busy = [r for r in rows if r["pid"] == child.pid]
    assert busy and max(r["cpu_percent"] for r in busy) > 20  # the child spun a core
    assert all(r["rss_bytes"] > 0 for r in rows)
    assert stats["ticks"] >= 5 and stats["errors"] == {}
    # the exited child is dropped, not reported as an error forever
    assert any(t.pid == child.pid for t in ps.exited)


def test_link_sampler_missing_namespace_raises(tmp_path: Path) -> None:
    s = LinkSampler(tmp_path / "l.jsonl", [LinkTarget("x", "eth0", "a->b", "/nonexistent/ns")])
    with pytest.raises(FileNotFoundError):
        s.start()


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")


@pytest.mark.root
def test_link_sampler_in_namespace(tmp_path: Path) -> None:
    _need_root()
    from pyroute2 import IPRoute, netns

    tag = f"{os.getpid() % 10000:04d}"
    ns, if_a, if_b = f"cltest{tag}", f"cltest{tag}a", f"cltest{tag}b"
    net = f"10.251.{int(tag) % 250}"
    sleeper = None
    netns.create(ns)
    try:
        with IPRoute() as ipr:
            ipr.link("add", ifname=if_a, kind="veth", peer=if_b)
            ipr.link("set", index=ipr.link_lookup(ifname=if_b)[0], net_ns_fd=ns)
            ia = ipr.link_lookup(ifname=if_a)[0]
            ipr.addr("add", index=ia, address=f"{net}.1", prefixlen=24)
            ipr.link("set", index=ia, state="up")
        with IPRoute(netns=ns, flags=0) as nsr:
            ib = nsr.link_lookup(ifname=if_b)[0]
            nsr.addr("add", index=ib, address=f"{net}.2", prefixlen=24)
            nsr.link("set", index=ib, state="up")
            # slow egress in the namespace so ping replies queue up
            nsr.tc("add", "htb", index=ib, handle="1:", default=0x10)
            nsr.tc("add-class", "htb", index=ib, handle="1:10", parent="1:0",
                   rate="300kbit", ceil="300kbit")
        # a process living in the namespace, reached by pid like a Mininet node
        sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "60"])
        deadline = time.time() + 5
        while os.readlink(f"/proc/{sleeper.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            assert time.time() < deadline, "sleeper never entered the namespace"
            time.sleep(0.02)

        t0 = time.time_ns()
        targets = [
            LinkTarget("rootnode", if_a, "A->B", None),
            LinkTarget.for_pid("nsnode", sleeper.pid, if_b, "B->A"),
            LinkTarget("named", if_b, "B->A", ns),
        ]
        sset = SamplerSet(tmp_path, t0, targets, [ProcTarget(sleeper.pid, "nsnode", "worker", 0)],
                          rate_hz=20)
        sset.start()
        try:
            subprocess.run(["ping", "-q", "-c", "40", "-i", "0.02", "-s", "1000", "-w", "8",
                            f"{net}.2"], check=False, capture_output=True, timeout=15)
            time.sleep(0.2)
        finally:
            stats = sset.stop()

        rows = _lines(tmp_path / "samples" / "links.jsonl")
        keys = {"ts", "node", "ifname", "link", "tx_bytes", "tx_packets", "rx_bytes", "rx_packets",
                "drops", "qdisc_backlog_bytes", "qdisc_backlog_pkts", "qdisc_drops"}
        assert all(set(r) == keys for r in rows)
        by_node: dict[str, list[dict]] = {}
        for r in rows:
            by_node.setdefault(r["node"], []).append(r)
        assert set(by_node) == {"rootnode", "nsnode", "named"}
        for recs in by_node.values():
            ts = [r["ts"] for r in recs]
            assert ts == sorted(ts) and ts[0] >= 0
        b = by_node["nsnode"]
        assert b[-1]["tx_bytes"] - b[0]["tx_bytes"] >= 30 * 1000  # the echo replies
        assert by_node["rootnode"][-1]["rx_bytes"] - by_node["rootnode"][0]["rx_bytes"] >= 30 * 1000
        assert max(r["qdisc_backlog_bytes"] for r in b) > 0  # the HTB queue was seen filling
        assert by_node["named"][-1]["tx_bytes"] == pytest.approx(b[-1]["tx_bytes"], rel=0.2)
        procs = _lines(tmp_path / "samples" / "procs.jsonl")
        assert procs and all(p["pid"] == sleeper.pid for p in procs)
        assert stats["links"]["errors"] == {}
        assert json.loads((tmp_path / "samples" / "sampler_stats.json").read_text())["links"]["ticks"] > 5
        print("link sampler overhead:", stats["links"])
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait()
        with IPRoute() as ipr:
            for idx in ipr.link_lookup(ifname=if_a):
                ipr.link("del", index=idx)
        netns.remove(ns)


def test_samplers_as_their_own_process(tmp_path: Path) -> None:
    """``python -m testbed.collect.samplers CONFIG`` samples until SIGTERM, then writes stats."""
    import signal

    cfg = {"trial_dir": str(tmp_path), "t0_ns": time.time_ns(), "rate_hz": 20,
           "links": [], "procs": [{"pid": os.getpid(), "host": "h0", "role": "worker", "rank": 0}]}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    repo = Path(__file__).resolve().parents[2]
    p = subprocess.Popen([sys.executable, "-m", "testbed.collect.samplers", str(tmp_path / "cfg.json")],
                         cwd=repo)
    try:
        deadline = time.time() + 20
        out = tmp_path / "samples" / "procs.jsonl"
        while not (out.exists() and out.read_text().count("\n") >= 3):
            assert time.time() < deadline and p.poll() is None, "sampler process produced nothing"
            time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    stats = json.loads((tmp_path / "samples" / "sampler_stats.json").read_text())
    assert stats["procs"]["ticks"] >= 3 and "links" not in stats
    assert _lines(tmp_path / "samples" / "procs.jsonl")[0]["pid"] == os.getpid()
