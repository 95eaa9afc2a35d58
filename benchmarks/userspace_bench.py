"""Measure the userspace impairment backend (and netem where the kernel has it), side by side.

Prints, per scenario and backend: spec RTT, minimum RTT and its error against
the issue's bar (0.5 ms + 2 % of spec), bulk TCP goodput, CPU of the impairment
daemons (percent of one core, and CPU-seconds per Gbit moved), kernel-side
drops and release lateness.  Runs in namespaces named ``uqtb<pid>-*`` and
removes them afterwards.

Backends: ``netlink`` (the default mechanism: raw netlink, GSO whole, batch
verdicts), ``netlink-nogso``, ``netlink-nobatch`` (ablations), ``binding``
(the ``netfilterqueue`` package), ``netem`` (kernel; only where ``sch_netem``
exists, e.g. inside the kernel lab: pass ``--netem`` or it is auto-detected),
``none`` (no delay; the baseline).

    sudo .venv/bin/python benchmarks/userspace_bench.py                 # everything (~3 min)
    sudo .venv/bin/python benchmarks/userspace_bench.py --quick         # fewer, shorter runs
    sudo .venv/bin/python benchmarks/userspace_bench.py --scenarios idle,bulk --backends netlink,binding
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traffic_control.userspace import ImpairmentShape, UserspaceImpairment  # noqa: E402
from traffic_control.userspace.lab import Chain, parse_ping  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
DAEMON_ARGS: list[str] = []
MECH_ARGS = {
    "netlink": [],
    "netlink-nogso": ["--no-gso"],
    "netlink-nobatch": ["--no-batch"],
    "binding": ["--mechanism", "binding"],
}


@dataclass
class Row:
    scenario: str
    backend: str
    spec_rtt_ms: float
    min_rtt_ms: float = math.nan
    avg_rtt_ms: float = math.nan
    goodput_mbps: float = math.nan
    retrans: int = 0
    daemon_cpu_pct: float = math.nan
    cpu_s_per_gbit: float = math.nan
    machine_busy_pct: float = math.nan
    kernel_drops: int = 0
    queued_msgs: int = 0
    late_mean_us: float = math.nan
    late_max_us: float = math.nan
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def bar_ok(self) -> bool | None:
        if math.isnan(self.min_rtt_ms) or self.spec_rtt_ms == 0:
            return None
        return self.spec_rtt_ms <= self.min_rtt_ms <= self.spec_rtt_ms + 0.5 + 0.02 * self.spec_rtt_ms


# ---------------------------------------------------------------- helpers
def proc_cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields_[11]) + int(fields_[12])
        except (OSError, IndexError):
            pass
    return total / TICK


def machine_busy() -> tuple[float, float]:
    vals = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


def netem_available() -> bool:
    with Chain(routers=1, prefix=f"uqtn{os.getpid() % 10000}") as c:
        r = c.run("r1", ["tc", "qdisc", "add", "dev", "right", "root", "netem", "delay", "1ms"], check=False)
        return r.returncode == 0


def tune_tcp(chain: Chain) -> None:
    """Per-namespace TCP buffers large enough for Gbit/s x tens of ms (autotuning ceiling)."""
    for node in ("a", "b"):
        chain.run(node, ["sysctl", "-qw", "net.ipv4.tcp_rmem=4096 131072 134217728"], check=False)
        chain.run(node, ["sysctl", "-qw", "net.ipv4.tcp_wmem=4096 65536 134217728"], check=False)


def set_offload(chain: Chain, on: bool) -> None:
    state = "on" if on else "off"
    for node in chain.nodes:
        links = chain.run(node, ["ip", "-o", "link", "show"]).stdout
        for line in links.splitlines():
            name = line.split(":")[1].strip().split("@")[0]
            if name != "lo":
                chain.run(node, ["ethtool", "-K", name, "tso", state, "gso", state, "gro", state], check=False)


@dataclass
class Backend:
    name: str
    imps: list[UserspaceImpairment]

    @property
    def pids(self) -> list[int]:
        return [imp.pid for imp in self.imps]

    def stats(self) -> list[dict[str, Any]]:
        return [imp.health().stats for imp in self.imps]


@contextmanager
def backend(chain: Chain, name: str, delay_s: float, htb_bps: float | None) -> Iterator[Backend]:
    """Delay every WAN egress of ``chain`` by ``delay_s`` with backend ``name``; HTB rate if given."""
    imps: list[UserspaceImpairment] = []
    try:
        for node, ifname in chain.wan():
            if htb_bps:
                chain.set_htb(node, ifname, htb_bps)
            if name == "netem":
                parent = ["parent", "1:1", "handle", "10:"] if htb_bps else ["root"]
                chain.run(node, ["tc", "qdisc", "replace", "dev", ifname, *parent, "netem",
                                 "delay", f"{delay_s * 1e6:.0f}us", "limit", "100000"])
            elif name != "none":
                imps.append(UserspaceImpairment.start(chain.ns(node), ifname, ImpairmentShape(delay_s=delay_s),
                                                      extra_args=[*MECH_ARGS[name], *DAEMON_ARGS]))
        yield Backend(name, imps)
    finally:
        for imp in imps:
            imp.stop()
        for node, ifname in chain.wan():
            chain.run(node, ["tc", "qdisc", "del", "dev", ifname, "root"], check=False)


def ping(chain: Chain, count: int, interval: float) -> dict[str, float]:
    return chain.ping(count, interval, timeout=count * interval + 30)


def bulk(chain: Chain, seconds: float, streams: int, ping_count: int) -> tuple[dict[str, Any], dict[str, float]]:
    """iperf3 a -> b for ``seconds`` with a ping train alongside; (iperf3 summary, ping summary)."""
    server = chain.popen("b", ["iperf3", "-s", "-1", "-p", "5301"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        interval = max(0.005, (seconds - 1.0) / max(ping_count, 1))
        pinger = chain.popen("a", ["ping", "-q", "-n", "-c", str(ping_count), "-i", f"{interval:.3f}",
                                   chain.addr("b")])
        client = chain.run("a", ["iperf3", "-c", chain.addr("b"), "-p", "5301", "-t", str(seconds),
                                 "-P", str(streams), "-J"], check=False, timeout=seconds + 60)
        pout, _ = pinger.communicate(timeout=seconds + 60)
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
    try:
        end = json.loads(client.stdout)["end"]
        summary = {"bps": end["sum_received"]["bits_per_second"],
                   "bytes": end["sum_received"]["bytes"],
                   "retrans": end["sum_sent"].get("retransmits", 0)}
    except (ValueError, KeyError):
        summary = {"bps": math.nan, "bytes": 0, "retrans": 0, "error": client.stdout[-300:] + client.stderr[-300:]}
    return summary, parse_ping(pout)


# ---------------------------------------------------------------- scenarios
def run_idle(chain: Chain, name: str, label: str, delay_s: float, count: int) -> Row:
    spec = 2 * delay_s * 1e3 * (chain.routers - 1 if chain.routers > 1 else 1)
    with backend(chain, name, delay_s, None) as be:
        r = ping(chain, count, 0.01)
        stats = be.stats()
    row = Row(label, name, spec if name != "none" else 0.0, r["min"], r["avg"])
    fill_stats(row, stats)
    return row


def run_bulk(chain: Chain, name: str, label: str, delay_s: float, seconds: float, streams: int,
             htb_bps: float | None) -> Row:
    spec = 2 * delay_s * 1e3 * (chain.routers - 1 if chain.routers > 1 else 1)
    with backend(chain, name, delay_s, htb_bps) as be:
        ping(chain, 3, 0.05)  # warm: ARP, caches
        cpu0, (busy0, tot0), t0 = proc_cpu_s(be.pids), machine_busy(), time.monotonic()
        summary, r = bulk(chain, seconds, streams, int(seconds * 20))
        cpu1, (busy1, tot1), t1 = proc_cpu_s(be.pids), machine_busy(), time.monotonic()
        stats = be.stats()
    row = Row(label, name, spec if name != "none" else 0.0, r["min"], r["avg"], summary["bps"] / 1e6,
              int(summary["retrans"]))
    wall = t1 - t0
    gbits = summary["bytes"] * 8 / 1e9
    if be.pids:
        row.daemon_cpu_pct = 100 * (cpu1 - cpu0) / wall
        row.cpu_s_per_gbit = (cpu1 - cpu0) / gbits if gbits else math.nan
    row.machine_busy_pct = 100 * (busy1 - busy0) / max(1, tot1 - tot0) * os.cpu_count()  # percent of one core
    row.notes = summary.get("error", "")
    fill_stats(row, stats)
    return row


def fill_stats(row: Row, stats: list[dict[str, Any]]) -> None:
    if not stats:
        return
    row.kernel_drops = sum(s.get("kernel_queue_dropped", 0) + s.get("kernel_user_dropped", 0) for s in stats)
    row.queued_msgs = sum(s.get("recv_msgs", 0) for s in stats)
    lates = [s for s in stats if s.get("late_count")]
    if lates:
        row.late_mean_us = sum(s["late_mean_us"] * s["late_count"] for s in lates) / sum(s["late_count"] for s in lates)
        row.late_max_us = max(s["late_max_us"] for s in lates)
    row.extra["verdict_msgs"] = sum(s.get("verdict_msgs", 0) for s in stats)
    row.extra["sends"] = sum(s.get("sends", 0) for s in stats)


def fmt(row: Row) -> str:
    ok = {None: "  -", True: " ok", False: "BAD"}[row.bar_ok]
    err = row.min_rtt_ms - row.spec_rtt_ms if row.spec_rtt_ms else math.nan
    return (f"{row.scenario:<22} {row.backend:<16} {row.spec_rtt_ms:7.1f} {row.min_rtt_ms:8.3f} {err:+7.3f} {ok} "
            f"{row.avg_rtt_ms:8.2f} {row.goodput_mbps:9.1f} {row.retrans:6d} {row.daemon_cpu_pct:7.1f} "
            f"{row.cpu_s_per_gbit:8.3f} {row.machine_busy_pct:6.0f} {row.kernel_drops:6d} {row.queued_msgs:8d} "
            f"{row.late_mean_us:7.1f} {row.late_max_us:8.0f} {row.notes}")


HEADER = (f"{'scenario':<22} {'backend':<16} {'specRTT':>7} {'minRTT':>8} {'err':>7} bar "
          f"{'avgRTT':>8} {'Mbit/s':>9} {'retx':>6} {'dCPU%':>7} {'cpuS/Gb':>8} {'mach%':>6} "
          f"{'kdrop':>6} {'qmsgs':>8} {'lateUs':>7} {'lateMax':>8}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="netlink,netlink-nogso,netlink-nobatch,binding")
    ap.add_argument("--scenarios", default="idle,relay,bulk,htb100,capacity,nooffload")
    ap.add_argument("--delay-ms", type=float, default=20.0, help="one-way delay per WAN link direction")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each bulk flow")
    ap.add_argument("--netem", choices=("auto", "yes", "no"), default="auto",
                    help="also run netem (needs sch_netem: the kernel lab)")
    ap.add_argument("--quick", action="store_true", help="2 s flows, fewer pings")
    ap.add_argument("--daemon-args", default="", help="extra daemon options, e.g. '--rcvbuf 1048576'")
    ap.add_argument("--json", default=None, help="write all rows here as JSON")
    opts = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    DAEMON_ARGS.extend(opts.daemon_args.split())
    seconds = 2.0 if opts.quick else opts.seconds
    pings = 100 if opts.quick else 300
    backends = ["none", *opts.backends.split(",")]
    has_netem = opts.netem == "yes" or (opts.netem == "auto" and netem_available())
    if has_netem:
        backends.insert(1, "netem")
    print(f"# kernel {os.uname().release}; netem {'present' if has_netem else 'absent (userspace only)'}; "
          f"{os.cpu_count()} cpus; load {os.getloadavg()[0]:.2f}; delay {opts.delay_ms} ms per direction per link")
    scen = opts.scenarios.split(",")
    delay = opts.delay_ms / 1e3
    rows: list[Row] = []
    print(HEADER)

    def emit(row: Row) -> None:
        rows.append(row)
        print(fmt(row), flush=True)

    pid = os.getpid() % 10000
    with Chain(routers=2, prefix=f"uqtb{pid}") as link:
        tune_tcp(link)
        for be in backends:
            if "idle" in scen:
                emit(run_idle(link, be, "idle link", delay, pings))
            if "bulk" in scen:
                emit(run_bulk(link, be, "bulk link unshaped", delay, seconds, 1, None))
            if "htb100" in scen:
                emit(run_bulk(link, be, "bulk link HTB 100M", delay, seconds, 1, 100e6))
            if "capacity" in scen:
                emit(run_bulk(link, be, "capacity -P4", delay, seconds, 4, None))
        if "nooffload" in scen:
            set_offload(link, False)
            for be in backends:
                emit(run_bulk(link, be, "bulk no GSO/TSO/GRO", delay, seconds, 1, None))
            set_offload(link, True)
    if "relay" in scen:
        with Chain(routers=3, prefix=f"uqtc{pid}") as relay:
            tune_tcp(relay)
            for be in backends:
                emit(run_idle(relay, be, "idle relayed (2 links)", delay, pings))
                if "bulk" in scen:
                    emit(run_bulk(relay, be, "bulk relayed unshaped", delay, seconds, 1, None))
    print("\n# ratios against the first delaying backend of each scenario (goodput, min-RTT error)")
    for scenario in dict.fromkeys(r.scenario for r in rows):
        group = [r for r in rows if r.scenario == scenario and r.backend != "none"]
        if len(group) < 2:
            continue
        ref = group[0]
        for r in group[1:]:
            ratio = r.goodput_mbps / ref.goodput_mbps if ref.goodput_mbps else math.nan
            print(f"{scenario:<22} {r.backend:<16} goodput x{ratio:5.2f} of {ref.backend}; "
                  f"min-RTT error {r.min_rtt_ms - r.spec_rtt_ms:+.3f} vs {ref.min_rtt_ms - ref.spec_rtt_ms:+.3f} ms")
    if opts.json:
        Path(opts.json).write_text(json.dumps([asdict(r) | {"bar_ok": r.bar_ok} for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
