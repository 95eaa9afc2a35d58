"""Each server's cores, and how much of them other jobs use, measured where the cluster file does not give them.

Automatic placement balances emulated nodes per free core: on a shared machine every node's processes take
their share of its cores, so a 32-core server carries four times the nodes of an 8-core one at the same
fidelity -- and a server whose cores are half taken by someone else's job carries half.  One probe, run the same
way here and over ssh (:data:`PROBE`), reads the cores this process may run on (``Cpus_allowed_list``, which
honours affinity and cgroup cpusets, as ``nproc`` does) and those cores' counters in ``/proc/stat`` twice,
:data:`WINDOW_S` apart: the busy share of each allowed core, summed, is the cores' worth other jobs use
(``Server.busy``; the testbed runs nothing there yet when a placement is made).  A server counts for its cores
less that, at least ``model.MIN_FREE`` of a core (``Server.free``).  Every server is probed at once; the result
is read once per command that builds a network and handed to every placement it makes, so the placement shown,
built and recorded is one.

A ``cpus:`` given in the file is taken as the cores the testbed may use there, other jobs already allowed for:
that server is not probed.  Measured only where it matters: an automatic placement in emulate mode (a given
placement, or shape mode with one server per DC, places nothing by load).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from topologies.model import Topology

from .model import Cluster, Server
from .remote import Remote, RemoteError

#: How long each server's CPU counters are watched for other jobs' use.
WINDOW_S = 1.0
#: The probe: allowed cores, then every core's counters, WINDOW_S apart.
PROBE = ("grep Cpus_allowed_list /proc/self/status && grep '^cpu[0-9]' /proc/stat && sleep {w} && echo -- && "
         "grep '^cpu[0-9]' /proc/stat")


@dataclass(frozen=True)
class Load:
    """A server's cores and the cores' worth of them other jobs used during the probe."""

    cores: int
    busy: float


def cpu_list(text: str) -> set[int]:
    """``0-3,6`` -> {0, 1, 2, 3, 6}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if "-" in part:
            a, b = part.split("-")
            out.update(range(int(a), int(b) + 1))
        elif part:
            out.add(int(part))
    return out


def _counters(lines: list[str]) -> dict[int, tuple[int, int]]:
    """cpuN -> (busy, total) jiffies (idle and iowait are not busy; guest time is inside user already)."""
    out = {}
    for ln in lines:
        f = ln.split()
        if not f or not f[0].startswith("cpu") or not f[0][3:].isdigit():
            continue
        v = [int(x) for x in f[1:9]]
        out[int(f[0][3:])] = (sum(v) - v[3] - v[4], sum(v))
    return out


def parse(text: str) -> Load:
    """What :data:`PROBE` printed, as a Load; ValueError when it is not that."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("Cpus_allowed_list:") or "--" not in lines:
        raise ValueError(f"not the CPU probe's output: {text[:200]!r}")
    allowed = cpu_list(lines[0].split(":", 1)[1])
    cut = lines.index("--")
    before, after = _counters(lines[1:cut]), _counters(lines[cut + 1:])
    busy = 0.0
    for cpu in allowed:
        if cpu in before and cpu in after and after[cpu][1] > before[cpu][1]:
            busy += (after[cpu][0] - before[cpu][0]) / (after[cpu][1] - before[cpu][1])
    if not allowed:
        raise ValueError(f"no allowed cores in {lines[0]!r}")
    return Load(len(allowed), round(busy, 2))


def probe_here(window_s: float = WINDOW_S) -> Load:
    cp = subprocess.run(["sh", "-c", PROBE.format(w=window_s)], capture_output=True, text=True, timeout=30 + window_s)
    return parse(cp.stdout)


def probe(server: Server, cluster: Cluster, window_s: float = WINDOW_S) -> Load:
    """One remote server's Load, over ssh; RemoteError when it cannot be asked or answers nonsense."""
    with Remote(server, cluster) as r:
        said = r.run(PROBE.format(w=window_s), timeout=max(30.0, cluster.connect_timeout * 2) + window_s).stdout
    try:
        return parse(said)
    except ValueError as e:
        raise RemoteError(server, f"the CPU probe said {said[:120]!r}, not cores and counters ({e})",
                          "give servers[].cpus in the file") from None


def measure_loads(cluster: Cluster, log: Callable[[str], None] | None = None) -> dict[str, Load]:
    """Cores and other jobs' use of every server whose ``cpus`` the file leaves out, all probed at once;
    RemoteError (the first server's, in file order) when one cannot be asked."""
    todo = [s for s in cluster.servers if s.cpus is None]
    if not todo:
        return {}

    def one(s: Server) -> Load:
        return probe_here() if s.name == cluster.launcher else probe(s, cluster)

    with ThreadPoolExecutor(max_workers=min(16, len(todo))) as pool:
        futures = {s.name: pool.submit(one, s) for s in todo}
        out = {name: f.result() for name, f in futures.items()}
    if log is not None:
        log("cores measured: " + ", ".join(
            f"{n}: {v.cores}" + (f" ({v.busy:.1f} busy with other jobs)" if v.busy >= 0.1 else "")
            for n, v in out.items()))
    return out


def places_by_load(cluster: Cluster) -> bool:
    """Whether the cluster's placement depends on cores: an automatic one in emulate mode."""
    return cluster.mode == "emulate" and cluster.placement is None


def measured(cluster: Cluster, log: Callable[[str], None] | None = None) -> Cluster:
    """The cluster with every server's cores known, where an automatic emulate-mode placement needs them."""
    if not places_by_load(cluster):
        return cluster
    loads = measure_loads(cluster, log)
    return cluster.with_cpus({n: v.cores for n, v in loads.items()}, {n: v.busy for n, v in loads.items()})


def for_build(topo: Topology, cluster: Cluster, log: Callable[[str], None] | None = None) -> Cluster:
    """What a command that builds across servers places with: a placement that cannot fit is refused first
    (exit 2, nothing contacted: the limits do not depend on cores), then the cores are measured."""
    if not places_by_load(cluster):
        return cluster
    from .placement import place

    place(topo, cluster)
    return measured(cluster, log)
