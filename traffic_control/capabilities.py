"""What this kernel can do, found by trying it in a scratch namespace.

Reading ``/proc/config.gz`` or ``lsmod`` says what was built, not what loads;
so each feature is probed by creating the real object (a veth pair, a bridge,
an HTB/TBF/netem qdisc, an IFB device) inside a throw-away network namespace
that is always removed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyroute2 import NetNS, netns
from pyroute2.netlink.exceptions import NetlinkError

from .netlink import NETEM_FIX

PROBE_PREFIX = "tb-probe-"


@dataclass
class Capability:
    name: str
    ok: bool
    detail: str = ""
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FIXES = {
    "netns": "run as root on a kernel with CONFIG_NET_NS (any stock Ubuntu/Debian kernel)",
    "veth": "modprobe veth",
    "bridge": "modprobe bridge (and apt install bridge-utils)",
    "htb": "modprobe sch_htb",
    "tbf": "modprobe sch_tbf",
    "netem": NETEM_FIX,
    "ifb": "modprobe ifb",
    "netem_seed": "a kernel >= 6.7 (netem's TCA_NETEM_PRNG_SEED); otherwise netem's loss and jitter patterns "
                  "differ between trials (recorded in the manifest)",
}


def _try(name: str, fn: Callable[[], str | None]) -> Capability:
    try:
        detail = fn() or "works"
        return Capability(name, True, detail)
    except NetlinkError as e:
        msg = e.args[1] if len(e.args) > 1 else str(e)
        return Capability(name, False, f"netlink error {e.code}: {msg}", FIXES.get(name, ""))
    except Exception as e:  # a probe must report, never crash the doctor
        return Capability(name, False, f"{type(e).__name__}: {e}", FIXES.get(name, ""))


def probe_kernel() -> dict[str, Capability]:
    """Probe netns, veth, bridge, HTB, TBF, netem and IFB.  Needs root."""
    caps: dict[str, Capability] = {}
    if os.geteuid() != 0:
        for name in FIXES:
            caps[name] = Capability(name, False, "not probed: needs root", "run as root (sudo)")
        return caps
    name = f"{PROBE_PREFIX}{os.getpid()}"
    try:
        netns.create(name)
    except Exception as e:
        caps["netns"] = Capability("netns", False, str(e), FIXES["netns"])
        return caps
    caps["netns"] = Capability("netns", True, "created a scratch namespace")
    try:
        ns = NetNS(name)
        try:
            def veth() -> None:
                ns.link("add", ifname="p0", kind="veth", peer={"ifname": "p1"})
                for i in ("p0", "p1"):
                    ns.link("set", index=ns.link_lookup(ifname=i)[0], state="up")

            caps["veth"] = _try("veth", veth)

            def bridge() -> None:
                ns.link("add", ifname="br0", kind="bridge")

            caps["bridge"] = _try("bridge", bridge)
            idx = ns.link_lookup(ifname="p0")
            idx0 = idx[0] if idx else 1

            def qdisc(kind: str, **kw: Any) -> Callable[[], None]:
                def f() -> None:
                    try:
                        ns.tc("del", index=idx0, handle=0, parent=0xFFFFFFFF)
                    except NetlinkError:
                        pass
                    ns.tc("add", kind, index=idx0, handle=0x10000, **kw)
                return f

            caps["htb"] = _try("htb", qdisc("htb", default=1))
            caps["tbf"] = _try("tbf", qdisc("tbf", rate=125000, burst=10000, latency=50000))
            caps["netem"] = _try("netem", qdisc("netem", delay=1000, limit=100))
            if caps["netem"].ok:
                caps["netem_seed"] = _try("netem_seed", lambda: _netem_seed(ns, idx0))

            def ifb() -> None:
                ns.link("add", ifname="ifb9", kind="ifb")

            caps["ifb"] = _try("ifb", ifb)
        finally:
            ns.close()
    finally:
        try:
            netns.remove(name)
        except OSError:
            pass
    return caps


def _netem_seed(ns: Any, idx: int) -> str:
    """Whether netem takes a PRNG seed (``TCA_NETEM_PRNG_SEED``): set one, read it back."""
    from . import netem_codec

    seed = 0x5EED
    ns.tc("replace", "netem", index=idx, handle=0x10000, delay=1000, limit=100, prng_seed=seed)
    for msg in ns.get_qdiscs(index=idx):
        if msg.get_attr("TCA_KIND") == "netem" and netem_codec.seed_applied(msg.get_attr("TCA_OPTIONS")) == seed:
            return "netem takes a PRNG seed (TCA_NETEM_PRNG_SEED): impairment patterns are reproducible"
    raise RuntimeError(f"this kernel's netem ignores TCA_NETEM_PRNG_SEED (added in Linux "
                       f"{netem_codec.PRNG_SEED_SINCE}): its random choices are not reproducible")


def has_netem() -> bool:
    return probe_kernel().get("netem", Capability("netem", False)).ok


def cleanup_probes() -> list[str]:
    """Remove scratch namespaces left by a probe that was killed."""
    removed = []
    for n in netns.listnetns():
        if n.startswith(PROBE_PREFIX):
            try:
                netns.remove(n)
                removed.append(n)
            except OSError:
                pass
    return removed


def tcp_congestion_controls() -> tuple[list[str], list[str], str]:
    """(available, allowed in network namespaces, the root namespace's default) TCP congestion controls.

    A namespace other than the first may only choose an algorithm in the
    *allowed* list as its default (``net.ipv4.tcp_allowed_congestion_control``,
    a machine-wide setting; the kernel answers EPERM otherwise); *available*
    lists what is loaded (``modprobe tcp_bbr`` adds BBR where it is a module).
    """
    def read(name: str) -> str:
        try:
            return Path(f"/proc/sys/net/ipv4/{name}").read_text().strip()
        except OSError:
            return ""

    return (read("tcp_available_congestion_control").split(), read("tcp_allowed_congestion_control").split(),
            read("tcp_congestion_control"))


def congestion_control_problem(name: str) -> str | None:
    """Why a namespace cannot use ``name`` as its TCP congestion control (None when it can), with the fix."""
    available, allowed, _default = tcp_congestion_controls()
    if name not in available:
        return (f"the kernel has no TCP congestion control {name!r} loaded (available: {' '.join(available)}); "
                f"fix: modprobe tcp_{name}, or choose one of those")
    if name not in allowed:
        return (f"{name!r} is not allowed in network namespaces (net.ipv4.tcp_allowed_congestion_control = "
                f"{' '.join(allowed)!r}); fix: sudo sysctl -w net.ipv4.tcp_allowed_congestion_control="
                f"'{' '.join([*allowed, name])}' (scripts/bootstrap.sh does this), or choose one of those")
    return None
