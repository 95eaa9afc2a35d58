"""``testbed doctor``: what this machine can do for the testbed, each gap with its exact fix.

Kernel features are probed by trying them in a scratch namespace
(:func:`traffic_control.capabilities.probe_kernel`), tools by running them,
Python packages by importing them.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from typing import Any

from traffic_control.capabilities import Capability, probe_kernel

TOOLS = {
    "iperf3": "apt install iperf3",
    "ping": "apt install iputils-ping",
    "ethtool": "apt install ethtool",
    "ip": "apt install iproute2",
    "tc": "apt install iproute2",
    "mnexec": "apt install mininet",
    "iptables": "apt install iptables",
}
#: Python packages come from the project's own installer, never from a hand-run pip.
BOOTSTRAP_FIX = "sudo scripts/bootstrap.sh (installs the project's Python dependencies into .venv)"
PY_MODULES = {
    "mininet": "apt install mininet, and make the venv with --system-site-packages (scripts/bootstrap.sh)",
    "pyroute2": BOOTSTRAP_FIX,
    "torch": "scripts/bootstrap.sh (TORCH_VARIANT=cpu|cuda)",
    "networkx": BOOTSTRAP_FIX,
    "scipy": BOOTSTRAP_FIX,
    "matplotlib": BOOTSTRAP_FIX,
    "yaml": BOOTSTRAP_FIX,
    "psutil": BOOTSTRAP_FIX,
    "sklearn": BOOTSTRAP_FIX,
    "pydantic": BOOTSTRAP_FIX,  # every spec is validated by it
    "rich": BOOTSTRAP_FIX,  # live progress on a terminal
}


def _tool(name: str, fix: str) -> Capability:
    path = shutil.which(name)
    return Capability(name, path is not None, path or "not found", "" if path else fix)


def _module(name: str, fix: str) -> Capability:
    try:
        mod = importlib.import_module(name)
        return Capability(f"python:{name}", True, str(getattr(mod, "__version__", "importable")))
    except Exception as e:
        return Capability(f"python:{name}", False, f"{type(e).__name__}: {e}", fix)


def _ovs() -> Capability:
    vsctl = shutil.which("ovs-vsctl")
    if not vsctl:
        return Capability("ovs", False, "ovs-vsctl not found (optional: Linux bridges are the default)",
                          "apt install openvswitch-switch && modprobe openvswitch (only for switch: ovs)")
    try:
        r = subprocess.run([vsctl, "--timeout=2", "show"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Capability("ovs", False, str(e), "systemctl start openvswitch-switch")
    if r.returncode != 0:
        return Capability("ovs", False, r.stderr.strip()[:200], "systemctl start openvswitch-switch && modprobe openvswitch")
    return Capability("ovs", True, "ovs-vswitchd answers")


def _cuda() -> Capability:
    try:
        import torch
    except Exception as e:
        return Capability("cuda", False, f"torch not importable: {e}", "scripts/bootstrap.sh")
    if torch.cuda.is_available():
        return Capability("cuda", True, f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
    return Capability("cuda", False, f"torch {torch.__version__}: no CUDA device (trainers use the CPU; optional)",
                      "on a GPU machine: TORCH_VARIANT=cuda scripts/bootstrap.sh")


def _docker() -> Capability:
    """runtime: docker hosts: the daemon, debootstrap (the image builder) and the testbed's image."""
    from testbed.network import docker_hosts

    ok, why = docker_hosts.available()
    fix = "sudo WITH_DOCKER=1 scripts/bootstrap.sh (installs docker.io and debootstrap, starts the daemon)"
    if not ok:
        return Capability("docker", False, f"{why} (optional: only for runtime: docker)", fix)
    if shutil.which("debootstrap") is None:
        return Capability("docker", False, f"{why}; debootstrap missing (the image builder needs it)", fix)
    iid = docker_hosts.image_id(docker_hosts.DEFAULT_IMAGE)
    image = f"{docker_hosts.DEFAULT_IMAGE} {iid[7:19]}" if iid else f"no {docker_hosts.DEFAULT_IMAGE} yet"
    return Capability("docker", iid is not None, f"{why}; {image}", "" if iid else "testbed image build")


def _lab() -> Capability:
    try:
        from testbed.lab import lab_available  # type: ignore[attr-defined]
    except ImportError:
        return Capability("kernel-lab", False, "testbed.lab not importable", "reinstall the project")
    ok, reason = lab_available()
    return Capability("kernel-lab", bool(ok), reason,
                      "" if ok else "apt install qemu-system-x86 busybox-static cpio kmod (scripts/bootstrap.sh)")


def _userspace() -> Capability:
    try:
        from traffic_control.userspace import available  # type: ignore[attr-defined]
    except ImportError:
        return Capability("userspace-impairment", False, "traffic_control.userspace not importable",
                          "reinstall the project")
    ok, reason = available()
    return Capability("userspace-impairment", bool(ok), reason,
                      "" if ok else "apt install iptables libnetfilter-queue1 (scripts/bootstrap.sh)")


def host_firewall() -> dict[str, Any]:
    """The root namespace's filtering of forwarded and bridged traffic (read only, never changed)."""
    out: dict[str, Any] = {"forward_policy": None, "bridge_nf_call_iptables": None, "dockerd": False}
    if shutil.which("iptables"):
        try:
            r = subprocess.run(["iptables", "-w", "-S", "FORWARD"], capture_output=True, text=True, timeout=10)
            first = r.stdout.splitlines()[0].split() if r.stdout else []
            if first[:2] == ["-P", "FORWARD"]:
                out["forward_policy"] = first[2]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            pass
    try:
        with open("/proc/sys/net/bridge/bridge-nf-call-iptables") as fh:
            out["bridge_nf_call_iptables"] = int(fh.read().strip())
    except (OSError, ValueError):
        pass  # br_netfilter not loaded: bridged frames never see iptables
    try:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/comm") as fh:
                        if fh.read().strip() == "dockerd":
                            out["dockerd"] = True
                            break
                except OSError:
                    continue
    except OSError:
        pass
    return out


def _firewall() -> Capability:
    fw = host_firewall()
    filtering = fw["forward_policy"] == "DROP" and fw["bridge_nf_call_iptables"] == 1
    detail = (f"root namespace: FORWARD policy {fw['forward_policy'] or '?'}, bridge-nf-call-iptables "
              f"{fw['bridge_nf_call_iptables'] if fw['bridge_nf_call_iptables'] is not None else 'off (no br_netfilter)'}"
              f"{', dockerd running' if fw['dockerd'] else ''}")
    if filtering:
        detail += (" -- this drops every frame bridged in the root namespace (what Docker's daemon sets up); "
                   "the testbed is unaffected: its switches live in their own namespaces, and it never changes "
                   "the host's firewall")
    else:
        detail += " (the testbed does not depend on it: its switches live in their own namespaces)"
    return Capability("host-firewall", True, detail)


def _tcp() -> Capability:
    """The hosts' default TCP congestion control (cubic) can be set in their namespaces."""
    from topologies.model import DEFAULT_CONGESTION_CONTROL
    from traffic_control.capabilities import congestion_control_problem, tcp_congestion_controls

    available, allowed, default = tcp_congestion_controls()
    problem = congestion_control_problem(DEFAULT_CONGESTION_CONTROL)
    detail = (f"hosts run {DEFAULT_CONGESTION_CONTROL} unless a topology says otherwise; this machine's default "
              f"{default}, available {' '.join(available)}, allowed in namespaces {' '.join(allowed)}")
    if problem is None:
        return Capability("tcp-congestion-control", True, detail)
    return Capability("tcp-congestion-control", False, f"{detail}: {problem.split('; fix: ')[0]}",
                      problem.partition("; fix: ")[2])


def run_doctor() -> dict[str, Any]:
    caps: list[Capability] = []
    root = os.geteuid() == 0
    caps.append(Capability("root", root, "uid 0" if root else f"uid {os.geteuid()}", "" if root else "run with sudo"))
    kernel = probe_kernel()
    caps.extend(kernel.values())
    caps.append(_ovs())
    caps.extend(_tool(n, f) for n, f in TOOLS.items())
    caps.extend(_module(n, f) for n, f in PY_MODULES.items())
    caps.append(_cuda())
    caps.append(_docker())
    caps.append(_lab())
    caps.append(_userspace())
    caps.append(_firewall())
    caps.append(_tcp())
    netem = kernel.get("netem")
    if netem is not None and not netem.ok:
        netem.fix += ("; on this machine: `testbed lab -- CMD` runs CMD under a stock kernel that has netem, "
                      "and `--impairment userspace` emulates delay/loss without it")
    optional = {"ovs", "cuda", "docker", "tbf", "ifb", "netem_seed", "host-firewall"}
    required_ok = all(c.ok for c in caps if c.name not in optional and not c.name.startswith("kernel-lab")
                      and c.name not in ("netem", "netem_seed", "userspace-impairment"))
    delay_ok = any(c.ok for c in caps if c.name in ("netem", "userspace-impairment"))
    return {"ok": required_ok and delay_ok, "uname": os.uname().release,
            "capabilities": [c.to_dict() | {"optional": c.name in optional} for c in caps]}


def format_doctor(report: dict[str, Any]) -> str:
    lines = [f"kernel {report['uname']}"]
    for c in report["capabilities"]:
        mark = "ok " if c["ok"] else ("-- " if c["optional"] else "NO ")
        lines.append(f"  [{mark}] {c['name']:22} {c['detail']}")
        if not c["ok"] and c["fix"]:
            lines.append(f"         fix: {c['fix']}")
    lines.append("ready" if report["ok"] else "NOT ready: see the fixes above")
    return "\n".join(lines)
