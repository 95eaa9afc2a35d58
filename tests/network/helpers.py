"""Helpers for tests that bring up ``tb-*`` networks (root)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from testbed.network.emulation import EmulatedNetwork
from topologies import Topology


def require_root_tools(*tools: str) -> None:
    import shutil

    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces and tc)")
    for t in ("mnexec", *tools):
        if shutil.which(t) is None:
            pytest.skip(f"needs {t}")
    try:
        import mininet  # noqa: F401
    except ImportError:
        pytest.skip("needs Mininet (apt install mininet; venv with --system-site-packages)")


@contextmanager
def network(topo: Topology, **kw: Any) -> Iterator[EmulatedNetwork]:
    """An up network that is always torn down (the builder's own stop + cleanup)."""
    kw.setdefault("impairment", "none")
    kw.setdefault("allow_missing_netem", True)
    net = EmulatedNetwork(topo, **kw)
    net.start()
    try:
        yield net
    finally:
        net.stop()


def run(net: EmulatedNetwork, node: str, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    p = net.popen(node, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        raise
    return subprocess.CompletedProcess(argv, p.returncode, out, "")


def ping_ok(net: EmulatedNetwork, src: str, dst_ip: str, count: int = 1, wait: float = 2.0, ttl: int | None = None
            ) -> tuple[bool, str]:
    argv = ["ping", "-n", "-c", str(count), "-i", "0.2", "-W", str(wait)]
    if ttl is not None:
        argv += ["-t", str(ttl)]
    r = run(net, src, [*argv, dst_ip], timeout=count * 0.2 + wait + 10)
    return r.returncode == 0, r.stdout


def reply_ttl(text: str) -> int:
    m = re.search(r"ttl=(\d+)", text)
    assert m, text
    return int(m.group(1))


def ping_all(net: EmulatedNetwork, sources: list[str], targets: dict[str, str]) -> dict[tuple[str, str], bool]:
    """One ping from every source to every target (in parallel per source); (src, dst) -> ok."""
    results: dict[tuple[str, str], bool] = {}
    for src in sources:
        dsts = [(n, ip) for n, ip in targets.items() if n != src]
        # addresses come from our own plan, never from a spec
        script = "\n".join(f"(ping -n -c 1 -W 3 {ip} >/dev/null 2>&1 && echo OK {n} || echo FAIL {n}) &"
                            for n, ip in dsts) + "\nwait"
        r = run(net, src, ["sh", "-c", script], timeout=60)
        seen = dict(line.split()[::-1] for line in r.stdout.split("\n") if line.startswith(("OK ", "FAIL ")))
        for n, _ in dsts:
            results[(src, n)] = seen.get(n) == "OK"
    return results


def iperf3_live(net: EmulatedNetwork, sender: str, receiver: str, sender_ip: str, seconds: float,
                interval: float = 0.5, port: int = 5211) -> tuple[subprocess.Popen[str], subprocess.Popen[str]]:
    """Bulk TCP sender -> receiver; the caller waits for the client with :func:`iperf3_finish`.

    The iperf3 client runs on the *receiver* in reverse mode (``-R``), so its
    per-interval report counts bytes that arrived, not bytes the sender wrote
    into its (large) socket buffer.
    """
    srv = net.popen(sender, ["iperf3", "-s", "-1", "-p", str(port), "-B", sender_ip],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    argv = ["iperf3", "-c", sender_ip, "-p", str(port), "-t", str(seconds), "-i", str(interval), "-J", "-R"]
    cli = net.popen(receiver, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return srv, cli


def iperf3_finish(srv: subprocess.Popen[str], cli: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    try:
        out, err = cli.communicate(timeout=timeout)
    finally:
        srv.kill()
        srv.wait()
    assert cli.returncode == 0, f"iperf3 failed ({cli.returncode}): {err} {out[-500:]}"
    data = json.loads(out)
    assert "error" not in data, data["error"]
    return data


def interval_bps(data: dict[str, Any], t0: float, t1: float) -> float:
    """Mean rate over the iperf3 client's intervals that lie within [t0, t1] seconds."""
    vals = [iv["sum"]["bits_per_second"] for iv in data["intervals"]
            if iv["sum"]["start"] >= t0 - 1e-6 and iv["sum"]["end"] <= t1 + 1e-6 and not iv["sum"].get("omitted")]
    assert vals, f"no intervals within [{t0}, {t1}]"
    return sum(vals) / len(vals)
