"""Find and remove everything the testbed created — and nothing else.

Works from the system's state alone (no state file needed), so it also
cleans up after a builder killed with SIGKILL half-way: processes whose
environment carries ``TESTBED_OWNER=tb`` or that live in a ``tb-*``
namespace (trainers, the detached userspace-impairment daemons, anything
started with ``net exec`` or ``ip netns exec``), named namespaces ``tb-*``
(nodes, DC switches ``tb-<dc>-sw``, ``net verify``'s probe endpoints
``tb-<dc>-vp``; their links, bridges and rules go with them), root-namespace
links ``tb-*`` (OVS switches only), cgroups ``tb-*``, capability-probe
namespaces, userspace-impairment rules in the root namespace (library use),
shape mode's routing rule, table and marked FORWARD accepts (``testbed.cluster.shaper``),
and the state directory.  Nothing else in the root namespace's firewall is touched.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

from pyroute2 import IPRoute, netns

from traffic_control.capabilities import cleanup_probes

from . import cgroups, docker_hosts, naming


def _our_netns_inodes() -> set[int]:
    out = set()
    for n in netns.listnetns():
        if naming.is_ours(n):
            try:
                out.add(os.stat(os.path.join(netns.NETNS_RUN_DIR, n)).st_ino)
            except OSError:
                pass
    return out


def owned_pids() -> list[int]:
    """PIDs of processes the testbed owns: marked in their environment, or living in a tb-* namespace.

    The second rule also catches what a user started with ``ip netns exec
    tb-<node> ...`` and daemons started through nsenter, which would otherwise
    keep a removed namespace alive.
    """
    marker = f"{naming.OWNER_ENV}={naming.PREFIX}".encode()
    inodes = _our_netns_inodes()
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if inodes and os.stat(f"/proc/{entry}/ns/net").st_ino in inodes:
                pids.append(int(entry))
                continue
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if marker in env.split(b"\0"):
            pids.append(int(entry))
    return pids


def kill_owned(timeout: float = 2.0) -> list[int]:
    pids = owned_pids()
    _terminate(pids, timeout)
    return pids


def kill_in_netns(name: str, timeout: float = 2.0) -> list[int]:
    """End every process living in the named namespace ``name`` (before that namespace is removed)."""
    try:
        ino = os.stat(os.path.join(netns.NETNS_RUN_DIR, name)).st_ino
    except OSError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino == ino:
                    pids.append(int(entry))
            except OSError:
                continue
    _terminate(pids, timeout)
    return pids


def _terminate(pids: list[int], timeout: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.02)
        if not any(_alive(p) for p in pids):
            return


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # zombies of our own children count as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def owned_netns() -> list[str]:
    return sorted(n for n in netns.listnetns() if naming.is_ours(n) and not n.startswith("tb-probe-"))


def owned_links() -> list[str]:
    with IPRoute() as ipr:
        names = [m.get_attr("IFLA_IFNAME") for m in ipr.get_links()]
    return sorted(n for n in names if n and naming.is_ours(n))


def remove_links(names: list[str]) -> None:
    with IPRoute() as ipr:
        # ports first (deleting a veth end removes its peer), then bridges
        for name in sorted(names, key=lambda n: n.count("-"), reverse=True):
            idx = ipr.link_lookup(ifname=name)
            if idx:
                try:
                    ipr.link("del", index=idx[0])
                except Exception:
                    pass


def cleanup(verbose: bool = False) -> dict[str, list[str]]:
    """Remove all testbed state; returns what was removed, by kind."""
    report: dict[str, list[str]] = {}
    report["processes"] = [str(p) for p in kill_owned()]
    report["containers"] = docker_hosts.remove_all()  # before their namespaces' names go
    try:
        from traffic_control.userspace import cleanup as uq_cleanup  # type: ignore[attr-defined]

        n_rules = uq_cleanup()  # marked rules in this namespace; returns how many went
        if n_rules:
            report["impairment"] = [f"{n_rules} userspace-impairment rule(s)"]
    except ImportError:
        pass
    ns_names = owned_netns()
    for n in ns_names:
        try:
            netns.remove(n)
        except OSError:
            pass
    report["netns"] = ns_names
    try:  # shape mode's rule, routing table and FORWARD accepts (its namespace went above); never in the way
        from ..cluster import shaper  # of the namespaces' removal, which comes first

        shaped = shaper.root_leftovers()
        if shaped:
            shaper.remove_root_objects()
            report["shape"] = shaped
    except Exception as e:
        report["shape"] = [f"not cleaned: {type(e).__name__}: {e}"]
    from .ovs import remove_all as remove_ovs

    report["ovs"] = remove_ovs()
    links = owned_links()
    remove_links(links)
    report["links"] = links
    report["cgroups"] = cgroups.remove_all()
    report["probes"] = cleanup_probes()
    from ..images.builder import remove_stale_work

    report["image_work"] = remove_stale_work()  # a killed `testbed image build`'s tree (mounts first)
    state = Path(naming.STATE_DIR)
    if state.exists():
        shutil.rmtree(state, ignore_errors=True)
        report["state"] = [str(state)]
    return {k: v for k, v in report.items() if v}


def leftovers() -> dict[str, list[str]]:
    """What cleanup would remove now (empty when the machine is clean)."""
    out = {"processes": [str(p) for p in owned_pids()], "netns": owned_netns(), "links": owned_links(),
           "containers": docker_hosts.owned()}
    out["cgroups"] = [str(p) for p in cgroups.find_all()]
    try:
        from ..cluster import shaper

        out["shape"] = shaper.root_leftovers()
    except Exception as e:
        out["shape"] = [f"unreadable: {type(e).__name__}: {e}"]
    return {k: v for k, v in out.items() if v}
