"""Open vSwitch switches (``switch: ovs``), for users whose kernels have the module.

Linux bridges are the default (no controller, no OVS kernel module); with
``switch: ovs`` each DC switch is an OVS bridge in standalone fail mode, i.e. a
learning switch without a controller.  Bridges are named ``tb-<dc>`` like the
Linux ones, so cleanup finds them.  Not exercised on the development machine,
whose kernel has no openvswitch module: ``require()`` says so and how to fix it.
"""

from __future__ import annotations

import shutil
import subprocess

from traffic_control.errors import CapabilityMissing

from . import naming

FIX = "apt install openvswitch-switch && modprobe openvswitch && systemctl start openvswitch-switch; or use switch: bridge"


def _vsctl(*args: str) -> str:
    r = subprocess.run(["ovs-vsctl", "--timeout=5", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ovs-vsctl {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def require() -> None:
    if shutil.which("ovs-vsctl") is None:
        raise CapabilityMissing("Open vSwitch (ovs-vsctl)", FIX)
    try:
        _vsctl("show")
    except RuntimeError as e:
        raise CapabilityMissing(f"a running Open vSwitch ({e})", FIX) from None


def add_bridge(name: str) -> None:
    _vsctl("--may-exist", "add-br", name, "--", "set-fail-mode", name, "standalone")


def add_port(bridge: str, port: str) -> None:
    _vsctl("--may-exist", "add-port", bridge, port)


def remove_all() -> list[str]:
    """Delete every ``tb-*`` OVS bridge (nothing when OVS is absent)."""
    if shutil.which("ovs-vsctl") is None:
        return []
    try:
        names = _vsctl("list-br").split()
    except RuntimeError:
        return []
    gone = []
    for n in names:
        if naming.is_ours(n):
            try:
                _vsctl("--if-exists", "del-br", n)
                gone.append(n)
            except RuntimeError:
                pass
    return gone
