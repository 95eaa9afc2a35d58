#!/usr/bin/env python3
"""The fidelity issue's figures, measured the way a user meets them, spec and measurement side by side.

Each row runs the testbed from the command line as separate processes (the
network left up by ``net up`` and probed from another process), on this
machine, with every impairment backend the kernel allows:

* ``net up`` then ping from another process: minimum RTT vs the spec, per backend;
  a killed impairment daemon: pings lost on its link 1 s later (fail closed);
* ``cpu:`` shares: CPU-seconds per wall second of a busy loop started through
  ``net exec`` and through the builder's ``popen``, vs the share;
* LANs behind the host firewall Docker's daemon leaves (root FORWARD policy
  DROP, bridge netfilter on; restored afterwards): ping loss;
* ``net verify`` goodput / ideal on a chord the routes bypass and on a
  400 Mbit/s, 8 ms link (bar 0.97);
* a rate-only link given 15 ms each way by ``net set``: RTT vs spec;
* LAN delay: same-DC and cross-DC RTT vs the spec's definition;
* seeded loss: the same seed gives the same loss pattern.

    sudo .venv/bin/python benchmarks/fidelity_check.py [--json out.json]

Needs root; takes about two minutes natively.  Inside the kernel lab
(``testbed lab -- ...``) the netem rows run too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from testbed.network.verify import rtt_ok  # noqa: E402

ROWS: list[dict[str, Any]] = []


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("TESTBED_OWNER", None)
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def ping_min(node: str, ip: str, count: int = 20) -> tuple[float | None, int]:
    r = subprocess.run(["ip", "netns", "exec", f"tb-{node}", "ping", "-n", "-c", str(count), "-i", "0.05", "-W", "1",
                        ip], capture_output=True, text=True, timeout=count + 30)
    rtts = [float(x) for x in re.findall(r"time=([0-9.]+) ms", r.stdout)]
    return (min(rtts) / 1e3 if rtts else None), len(rtts)


def row(what: str, spec: str, measured: str, ok: bool) -> None:
    ROWS.append({"what": what, "spec": spec, "measured": measured, "ok": ok})
    print(f"  {'ok ' if ok else 'BAD'}  {what}: spec {spec} | measured {measured}", flush=True)


def write_topo(d: Path, spec: dict[str, Any]) -> str:
    p = d / f"{spec['name']}.yaml"
    p.write_text(yaml.safe_dump(spec))
    return str(p)


def backends() -> list[str]:
    from traffic_control.capabilities import probe_kernel
    from traffic_control.userspace import available

    out = []
    if probe_kernel()["netem"].ok:
        out.append("netem")
    if available()[0] and os.environ.get("GEO_TESTBED_IN_LAB") != "1":
        out.append("userspace")
    return out


def latency_after_net_up(d: Path) -> None:
    topo = write_topo(d, {"name": "lat", "dcs": [{"name": "a", "hosts": 2, "lan": {"delay": "10ms"}},
                                                 {"name": "b", "hosts": 1}, {"name": "c", "hosts": 1}],
                          "links": [{"a": "a", "b": "b", "rate": "50Mbit", "delay": "20ms"},
                                    {"a": "a", "b": "c", "rate": "100Mbit"}]})
    for be in backends():
        r = cli("net", "up", topo, "--impairment", be, "--seed", "1")
        assert r.returncode == 0, r.stderr
        try:
            for src, ip, exp, what in (("a-h1", "10.2.0.1", 0.060, "cross-DC (WAN 2x20 ms + LAN 2x10 ms)"),
                                       ("a-h1", "10.1.0.2", 0.020, "same DC (LAN delay 10 ms, once per delivery)")):
                m, n = ping_min(src, ip)
                row(f"[{be}] net up returned, ping from another process, {what}", f"{exp * 1e3:.1f} ms",
                    f"{m * 1e3:.2f} ms ({n}/20)" if m else "no reply", bool(m) and rtt_ok(m, exp))
            r = cli("net", "set", "a", "c", "--delay", "15ms")
            m, n = ping_min("a-h1", "10.3.0.1")
            row(f"[{be}] rate-only link given 15 ms each way by net set (+ a's LAN)", "50.0 ms",
                f"{m * 1e3:.2f} ms" if m else "no reply", r.returncode == 0 and bool(m) and rtt_ok(m, 0.050))
            if be == "userspace":
                s = json.loads(cli("net", "show", "--json").stdout)
                os.kill(s["links"]["a->b"]["userspace"]["pid"], 9)
                time.sleep(1.0)
                _, n = ping_min("a-h1", "10.2.0.1", count=10)
                shown = cli("net", "show")
                row("[userspace] impairment daemon SIGKILLed after net up returned: pings over its link 1 s later",
                    "0 of 10 (fail closed), net show exit 1", f"{n} of 10, net show exit {shown.returncode}",
                    n == 0 and shown.returncode == 1)
        finally:
            cli("net", "down")


def cpu_shares(d: Path) -> None:
    topo = write_topo(d, {"name": "cpu", "dcs": [{"name": "east", "hosts": 1, "cpu": 0.2}, {"name": "west", "hosts": 1,
                                                                                            "cpu": 0.5}],
                          "links": [{"a": "east", "b": "west", "rate": "100Mbit"}]})
    busy = d / "busy.py"
    busy.write_text("import os,time\nc=os.times();t=time.monotonic()\nwhile time.monotonic()-t<3: pass\n"
                    "e=os.times();print((e.user+e.system-c.user-c.system)/(time.monotonic()-t))\n")
    r = cli("net", "up", topo, "--impairment", "none")
    assert r.returncode == 0, r.stderr
    try:
        for node, share in (("east-h1", 0.2), ("west-h1", 0.5)):
            used = float(cli("net", "exec", node, "--", sys.executable, str(busy)).stdout)
            row(f"cpu share via net exec ({node})", f"{share:.2f} CPU-s/s", f"{used:.3f}",
                abs(used - share) <= 0.1 * share)
    finally:
        cli("net", "down")
    from testbed.network.emulation import EmulatedNetwork
    from topologies import load

    with EmulatedNetwork(load(topo), impairment="none") as net:
        p = net.popen("east-h1", [sys.executable, str(busy)], stdout=subprocess.PIPE, text=True)
        used = float(p.communicate()[0])
        row("cpu share via the builder's popen (trainers, servers, iperf3)", "0.20 CPU-s/s", f"{used:.3f}",
            abs(used - 0.2) <= 0.02)


def docker_firewall() -> None:
    knob = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    if not knob.exists():
        subprocess.run(["modprobe", "br_netfilter"], capture_output=True)
    if not knob.exists():
        row("LANs behind Docker's firewall", "0 % loss", "not measurable: no br_netfilter", True)
        return
    policy = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True).stdout.split()[2]
    nf = knob.read_text().strip()
    before = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    subprocess.run(["iptables", "-w", "-P", "FORWARD", "DROP"], check=True)
    knob.write_text("1\n")
    try:
        r = cli("net", "up", "two_dc", "--impairment", "none", "--allow-missing-netem")
        assert r.returncode == 0, r.stderr
        try:
            lost = []
            for node, ip in (("east-h1", "10.1.0.254"), ("east-h1", "10.1.0.2"), ("east-h1", "10.2.0.1")):
                _, n = ping_min(node, ip, count=10)
                lost.append(100 - 10 * n)
            row("LANs with root FORWARD DROP + bridge-nf-call-iptables=1 (Docker's daemon)",
                "0 % loss (host->router, host->host, cross-DC)", " / ".join(f"{x} %" for x in lost), max(lost) == 0)
        finally:
            cli("net", "down")
    finally:
        subprocess.run(["iptables", "-w", "-P", "FORWARD", policy], check=True)
        knob.write_text(nf + "\n")
    after = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    strip = lambda t: [re.sub(r"\[\d+:\d+\]", "", ln) for ln in t.splitlines() if not ln.startswith("#")]  # noqa: E731
    row("root namespace's iptables rules after the run", "unchanged", "unchanged" if strip(before) == strip(after)
        else "CHANGED", strip(before) == strip(after))


def verify_goodput(d: Path) -> None:
    topo = write_topo(d, {"name": "chord", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 0},
                                                   {"name": "c", "hosts": 1}, {"name": "d", "hosts": 1}],
                          "links": [{"a": "a", "b": "b", "rate": "100Mbit", "delay": "4ms"},
                                    {"a": "b", "b": "c", "rate": "100Mbit", "delay": "4ms"},
                                    {"a": "a", "b": "c", "rate": "100Mbit", "delay": "30ms"},
                                    {"a": "c", "b": "d", "rate": "400Mbit", "delay": "8ms"}]})
    for be in backends():
        r = cli("net", "verify", topo, "--impairment", be, "--json", "--seconds", "4")
        checks = {c["subject"]: c for c in json.loads(r.stdout)["checks"] if c["kind"] == "link_goodput"}
        for subj, what in (("a->c", "chord the routes bypass (pinned), 100 Mbit/s"),
                           ("a->b", "link to a DC without hosts (probe endpoint)"),
                           ("c->d", "400 Mbit/s, 8 ms")):
            ratio = checks[subj]["extra"]["ratio"]
            row(f"[{be}] net verify goodput/ideal {subj}: {what}", ">= 0.97", f"{ratio:.3f}", ratio >= 0.97)


def seeded_loss(d: Path) -> None:
    from testbed.network.emulation import EmulatedNetwork
    from topologies import from_dict

    probe = str(REPO / "tests" / "netem" / "udp_probe.py")
    topo = from_dict({"name": "seed", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
                      "links": [{"a": "a", "b": "b", "rate": "100Mbit", "delay": "1ms", "forward": {"loss": "30%"},
                                 "reverse": {}}]})
    for be in backends():
        patterns = []
        for seed in (5, 5, 6):
            with EmulatedNetwork(topo, impairment=be, with_ps=False, seed=seed) as net:
                rx = net.popen("b-h1", [sys.executable, probe, "recv", "10.2.0.1", "7790", "300", "1.5"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                rx.stdout.readline()
                net.popen("a-h1", [sys.executable, probe, "send", "10.2.0.1", "7790", "300", "1", "0.002"]).wait()
                patterns.append(sorted(set(json.loads(rx.communicate()[0])["seqs"])))
                randomness = net.impairment.randomness
        same, differs = patterns[0] == patterns[1], patterns[0] != patterns[2]
        row(f"[{be}] loss pattern, same seed twice / another seed ({randomness})", "identical / different",
            f"{'identical' if same else 'different'} / {'different' if differs else 'identical'}",
            (same and differs) or "unseeded" in randomness)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the rows here as JSON")
    p.add_argument("--only", help="comma-separated: latency,cpu,firewall,verify,seed")
    opts = p.parse_args()
    if os.geteuid() != 0:
        print("needs root", file=sys.stderr)
        return 2
    parts = {"latency": latency_after_net_up, "cpu": cpu_shares, "firewall": docker_firewall,
             "verify": verify_goodput, "seed": seeded_loss}
    chosen = opts.only.split(",") if opts.only else list(parts)
    with tempfile.TemporaryDirectory() as tmp:
        for name in chosen:
            print(f"== {name}", flush=True)
            fn = parts[name]
            fn() if name == "firewall" else fn(Path(tmp))  # type: ignore[operator]
    if opts.json:
        Path(opts.json).write_text(json.dumps(ROWS, indent=2))
    bad = [r for r in ROWS if not r["ok"]]
    print(f"{len(ROWS) - len(bad)} of {len(ROWS)} rows meet the spec")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
