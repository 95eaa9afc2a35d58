"""Glue between the network builder and the netem jitter driver (:mod:`traffic_control.jitter_driver`).

Under the netem backend every netem leaf with jitter and order kept (WAN
directions, and LAN node egress) has its delay moved through the defined
process by one detached driver per network, so the netem backend gives the
distribution the userspace backend gives (README "Jitter, defined").  Like
the userspace daemons, the driver belongs to the network, not to the
command that built it: started detached, marked with ``TESTBED_OWNER`` (so
``testbed clean`` ends it), its state under ``/run/geo-testbed/jitter/``;
``net set`` rewrites the leaf file and signals it (starting it if the
network had no driven leaf before).  Each leaf's process is seeded like
the userspace daemon at the same place (``impairment.seed_for``), so a
network seed gives the same delays on either backend.  ``read_back`` (the
tc state in a manifest) shows a driven leaf at one interval's delay with
netem's jitter 0: the spec's jitter is in the driver's leaf file and health.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from traffic_control.jitter_driver import HEALTH_FILE, driven, write_leaves
from traffic_control.shape import shape_dict

from . import naming
from .impairment import seed_for

JITTER_DIR = Path(naming.STATE_DIR) / "jitter"
LEAVES_FILE = JITTER_DIR / "leaves.json"
#: Seconds the driver may take to write its first health file (pyroute2's import; minutes under TCG).
READY_TIMEOUT_S = float(os.environ.get("TESTBED_NODE_START_TIMEOUT", "60" if os.environ.get("GEO_TESTBED_IN_LAB") == "1"
                                       else "15"))


def leaves_of(net: Any) -> list[dict[str, Any]]:
    """Every netem leaf of ``net`` that needs the driver, with its current shape and seed."""
    out = []
    for _, _, node, ifn, shape in net.wan_directions():  # a part's tunnel ends too (several servers)
        if driven(shape):
            out.append({"netns": naming.netns_name(node), "ifname": ifn, "shape": shape_dict(shape),
                        "seed": seed_for(net.seed, f"{node}.{ifn}"), "qdisc_seed": net._qdisc_seed(node, ifn)})
    for node in net.plan.nodes.values():
        for ifc in node.ifaces:
            if not ifc.peer_node and ifc.egress is not None and driven(ifc.egress):
                out.append({"netns": naming.netns_name(node.name), "ifname": ifc.name,
                            "shape": shape_dict(ifc.egress), "seed": seed_for(net.seed, f"{node.name}.{ifc.name}"),
                            "qdisc_seed": net._qdisc_seed(node.name, ifc.name)})
    return out


def health() -> dict[str, Any] | None:
    """The driver's last health record (None when none was ever started)."""
    try:
        return json.loads((JITTER_DIR / HEALTH_FILE).read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def running_pid() -> int | None:
    h = health()
    if h and h.get("state") == "running" and _alive(int(h["pid"])):
        return int(h["pid"])
    return None


def sync(net: Any) -> dict[str, Any] | None:
    """Make the driver match ``net``'s driven leaves: start it, signal it, or leave it idle.

    Returns its health once it runs (None when no leaf needs it).  Raises
    ``RuntimeError`` naming the cause when it does not start.
    """
    leaves = leaves_of(net)
    pid = running_pid()
    generation = int((health() or {}).get("generation", 0)) + 1
    JITTER_DIR.mkdir(parents=True, exist_ok=True)
    write_leaves(LEAVES_FILE, generation, leaves)
    if pid is not None:
        os.kill(pid, signal.SIGHUP)
        return _acknowledged(pid, generation)
    if not leaves:
        return None
    (JITTER_DIR / HEALTH_FILE).unlink(missing_ok=True)
    env = dict(os.environ, **{naming.OWNER_ENV: naming.PREFIX})
    log = open(JITTER_DIR / "driver.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen([sys.executable, "-m", "traffic_control.jitter_driver", "--leaves", str(LEAVES_FILE),
                                 "--state-dir", str(JITTER_DIR)], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=env, start_new_session=True, close_fds=True)
    finally:
        log.close()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        h = health()
        if h and h.get("pid") == proc.pid:
            return h
        if proc.poll() is not None:
            tail = (JITTER_DIR / "driver.log").read_text(errors="replace")[-500:]
            raise RuntimeError(f"the netem jitter driver exited ({proc.returncode}): {tail}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the netem jitter driver wrote no health within {READY_TIMEOUT_S:g} s")


def _acknowledged(pid: int, generation: int) -> dict[str, Any] | None:
    """Wait until the driver has read leaf file ``generation`` (after that it never touches a leaf it
    dropped, so the caller may reshape it); its health then."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        h = health() or {}
        if h.get("pid") == pid and int(h.get("generation", 0)) >= generation:
            return h
        if not _alive(pid):
            return health()  # it exited: it touches nothing any more either
        time.sleep(0.02)
    raise RuntimeError(f"the netem jitter driver (pid {pid}) did not read its new leaves within {READY_TIMEOUT_S:g} s")


def stop() -> None:
    """End the driver (the namespaces go with the network; cleanup would end it too)."""
    pid = running_pid()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
