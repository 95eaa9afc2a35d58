"""TCP counters of a network namespace: retransmissions, timeouts, losses (``/proc/net/snmp``, ``netstat``).

A measured time that reads 200 ms high once in a while is usually a TCP
retransmission timeout (Linux's minimum RTO is 200 ms), not the scheme:
benchmarks read these counters before and after a run, so such an outlier
is explained by a number in the output instead of a guess.  The files are
per network namespace: a process reads its own namespace's directly, another
namespace's through a child started in it (``ip netns exec``), so the caller
never switches namespaces itself.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

#: What is reported, as (file section, counter) -> name in the result.
COUNTERS = {
    ("Tcp", "RetransSegs"): "retrans_segs",
    ("Tcp", "OutSegs"): "out_segs",
    ("TcpExt", "TCPTimeouts"): "timeouts",
    ("TcpExt", "TCPLostRetransmit"): "lost_retransmits",
    ("TcpExt", "TCPFastRetrans"): "fast_retrans",
    ("TcpExt", "TCPSpuriousRTOs"): "spurious_rtos",
}


def parse_proc_net(text: str) -> dict[tuple[str, str], int]:
    """``/proc/net/snmp``-style text (pairs of header and value lines) as (section, counter) -> value."""
    out: dict[tuple[str, str], int] = {}
    lines = [ln for ln in text.splitlines() if ":" in ln]
    for head, vals in zip(lines[::2], lines[1::2]):
        sec, names = head.split(":", 1)
        sec2, values = vals.split(":", 1)
        if sec != sec2:
            continue
        for k, v in zip(names.split(), values.split()):
            try:
                out[(sec, k)] = int(v)
            except ValueError:
                continue
    return out


def counters(netns: str | None = None) -> dict[str, int]:
    """The :data:`COUNTERS` of ``netns`` (``None``: the calling process's namespace); missing ones read 0."""
    if netns is None:
        text = "\n".join(Path(f).read_text() for f in ("/proc/net/snmp", "/proc/net/netstat"))
    else:
        res = subprocess.run(["ip", "netns", "exec", netns, "cat", "/proc/net/snmp", "/proc/net/netstat"],
                             capture_output=True, text=True, timeout=10)
        if res.returncode != 0:
            raise RuntimeError(f"cannot read TCP counters in {netns}: {res.stderr.strip()}")
        text = res.stdout
    raw = parse_proc_net(text)
    return {name: raw.get(key, 0) for key, name in COUNTERS.items()}


def delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Counter increase between two readings of :func:`counters`."""
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}


def summed(readings: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Sum of per-namespace readings (e.g. the deltas of every host)."""
    out: dict[str, int] = {}
    for r in readings.values():
        for k, v in r.items():
            out[k] = out.get(k, 0) + v
    return out
