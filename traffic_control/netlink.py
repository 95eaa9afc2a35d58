"""Apply, change, clear and read back shapes through netlink (pyroute2).

Every function takes ``netns``: ``None`` for the caller's namespace, a name
under ``/var/run/netns``, or a path such as ``/proc/<pid>/ns/net``.  Kernel
refusals become :class:`TrafficControlError` with the operation spelled out
as a ``tc`` command line; a missing qdisc kind becomes
:class:`CapabilityMissing` with the fix.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyroute2 import IPRoute, NetNS
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.tcmsg.common import tick_in_usec

from . import netem_codec
from .errors import CapabilityMissing, TrafficControlError
from .qdisc import ROOT, TcOp, build_ops, change_ops, clear_ops, handle_str
from .shape import LinkShape

netem_codec.install()

NETEM_FIX = ("load it: `modprobe sch_netem` (Ubuntu cloud kernels: `apt install linux-modules-extra-$(uname -r)` "
             "first); or run inside the kernel lab (`testbed lab -- ...`); or use the userspace impairment "
             "backend (`--impairment userspace`); or pass --allow-missing-netem to skip delay/jitter/loss")


@contextmanager
def netlink(netns: str | None = None, handle: Any = None) -> Iterator[Any]:
    """An IPRoute (or NetNS) handle, closed on exit; ``handle`` reuses one the caller holds open.

    Opening a handle into another namespace forks a helper (~8 ms); a caller
    configuring many interfaces of one namespace passes its own handle.
    """
    if handle is not None:
        yield handle
        return
    h = NetNS(netns) if netns else IPRoute()
    try:
        yield h
    finally:
        h.close()


def _index(h: Any, ifname: str) -> int:
    idx = h.link_lookup(ifname=ifname)
    if not idx:
        raise TrafficControlError(f"no interface {ifname!r} in this namespace")
    return int(idx[0])


def run_ops(h: Any, ifname: str, ops: list[TcOp], netns: str | None = None) -> None:
    idx = _index(h, ifname)
    for op in ops:
        kw = dict(op.params)
        if op.command != "del" or op.parent != ROOT:
            kw["parent"] = op.parent
        try:
            if op.command == "del":
                h.tc("del", index=idx, handle=0, parent=ROOT)
            else:
                h.tc(op.command, op.kind, index=idx, handle=op.handle, **kw)
        except NetlinkError as e:
            cmd = " ".join(op.tc_command(ifname, netns))
            if op.kind == "netem" and e.code in (errno.ENOENT, errno.EINVAL, errno.EOPNOTSUPP) and \
                    op.command in ("add", "replace"):
                raise CapabilityMissing("sch_netem", NETEM_FIX) from None
            raise TrafficControlError(f"kernel refused `{cmd}`: {e.args[1] if len(e.args) > 1 else e}") from None


def apply(ifname: str, shape: LinkShape, *, netns: str | None = None, netem: bool | None = None,
          handle: Any = None, seed: int | None = None) -> None:
    """Install ``shape`` on ``ifname`` egress, replacing whatever root qdisc was there.

    ``netem``: True, the leaf is netem (also for a shape without delay, so
    that it can take some later by :func:`change`); False, pfifo (delay is
    someone else's, e.g. the userspace backend); None, netem exactly when
    ``shape`` has delay, jitter or loss.  ``seed``: netem's PRNG seed.
    """
    with netlink(netns, handle) as h:
        _delete_root(h, ifname)
        try:
            run_ops(h, ifname, build_ops(shape, netem=netem, seed=seed), netns)
        except Exception:
            _delete_root(h, ifname)  # never leave half a tree behind
            raise


def change(ifname: str, old: LinkShape, new: LinkShape, *, netns: str | None = None, netem: bool | None = None,
           handle: Any = None, seed: int | None = None) -> None:
    """Change a live shape in place (``tc ... change``): open connections see no gap.

    ``netem`` says what the leaf is (as given to :func:`apply`); its kind never changes.
    """
    with netlink(netns, handle) as h:
        run_ops(h, ifname, change_ops(old, new, netem=netem, seed=seed), netns)


def clear(ifname: str, *, netns: str | None = None) -> None:
    with netlink(netns) as h:
        _delete_root(h, ifname)


def _delete_root(h: Any, ifname: str) -> None:
    try:
        run_ops(h, ifname, clear_ops())
    except TrafficControlError:
        pass  # nothing installed (ENOENT/EINVAL on a default qdisc)


def set_link_state(ifname: str, up: bool, *, netns: str | None = None) -> None:
    """Take an interface down or up (a link failure event)."""
    with netlink(netns) as h:
        h.link("set", index=_index(h, ifname), state="up" if up else "down")


def link_state(ifname: str, *, netns: str | None = None, handle: Any = None) -> dict[str, Any]:
    """Administrative and operational state, MTU and GSO segment cap of ``ifname`` as the kernel reports them."""
    with netlink(netns, handle) as h:
        msg = h.get_links(_index(h, ifname))[0]
    return {"admin_up": bool(msg["flags"] & 1), "operstate": msg.get_attr("IFLA_OPERSTATE"),
            "mtu": msg.get_attr("IFLA_MTU"), "gso_max_segs": msg.get_attr("IFLA_GSO_MAX_SEGS")}


# ------------------------------------------------------------------ read back
def _ticks_to_s(ticks: int) -> float:
    return ticks / tick_in_usec / 1e6


def _stats(msg: Any) -> dict[str, int]:
    out = {"bytes": 0, "packets": 0, "drops": 0, "backlog_bytes": 0, "backlog_pkts": 0, "overlimits": 0}
    st2 = msg.get_attr("TCA_STATS2")
    if st2 is not None:
        basic = st2.get_attr("TCA_STATS_BASIC")
        queue = st2.get_attr("TCA_STATS_QUEUE")
        if basic:
            out["bytes"], out["packets"] = int(basic["bytes"]), int(basic["packets"])
        if queue:
            out["drops"], out["backlog_bytes"] = int(queue["drops"]), int(queue["backlog"])
            out["backlog_pkts"], out["overlimits"] = int(queue["qlen"]), int(queue["overlimits"])
    return out


def _qdisc_info(msg: Any) -> dict[str, Any]:
    kind = msg.get_attr("TCA_KIND")
    info: dict[str, Any] = {"kind": kind, "handle": handle_str(msg["handle"]), "parent": handle_str(msg["parent"])}
    opts = msg.get_attr("TCA_OPTIONS")
    if kind == "netem" and opts is not None:
        info["delay_s"] = _ticks_to_s(opts["delay"])
        info["jitter_s"] = _ticks_to_s(opts["jitter"])
        info["loss_pct"] = opts["loss"] / (2**32 - 1) * 100
        info["limit"] = opts["limit"]
        info["duplicate_pct"] = opts["duplicate"] / (2**32 - 1) * 100
        info["corrupt_pct"] = netem_codec.corrupt_pct_of(opts)
        info["gilbert_elliott"] = netem_codec.gemodel_of(opts)
        info.update(netem_codec.reorder_of(opts))
        rate = opts.get_attr("TCA_NETEM_RATE") if hasattr(opts, "get_attr") else None
        # The kernel always dumps TCA_NETEM_RATE; a rate of 0 means "no netem rate".
        if rate and rate["rate"]:
            info["rate_bps"] = (opts.get_attr("TCA_NETEM_RATE64") or rate["rate"]) * 8
        info["prng_seed"] = netem_codec.seed_applied(opts)
    elif kind in ("pfifo", "bfifo") and opts is not None:
        info["limit"] = opts["limit"]
    info["stats"] = _stats(msg)
    return info


def _class_info(msg: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"kind": msg.get_attr("TCA_KIND"), "handle": handle_str(msg["handle"]),
                            "parent": handle_str(msg["parent"])}
    opts = msg.get_attr("TCA_OPTIONS")
    if info["kind"] == "htb" and opts is not None:
        p = opts.get_attr("TCA_HTB_PARMS")
        rate64 = opts.get_attr("TCA_HTB_RATE64")
        rate = (rate64 or p["rate"]) * 8
        info["rate_bps"] = rate
        info["ceil_bps"] = (opts.get_attr("TCA_HTB_CEIL64") or p["ceil"]) * 8
        info["burst_bytes"] = int(round(_ticks_to_s(p["buffer"]) * rate / 8))
        info["quantum"] = p["quantum"]
    info["stats"] = _stats(msg)
    return info


def show(ifname: str, *, netns: str | None = None, handle: Any = None) -> dict[str, Any]:
    """What the kernel reports for ``ifname``: qdiscs, classes, and the shape they amount to."""
    with netlink(netns, handle) as h:
        idx = _index(h, ifname)
        qdiscs = [_qdisc_info(m) for m in h.get_qdiscs(index=idx)]
        classes = [_class_info(m) for m in h.get_classes(index=idx)]
    shape: dict[str, Any] = {}
    for c in classes:
        if c["kind"] == "htb" and c["handle"] == "1:1":
            shape["rate_bps"] = c["rate_bps"]
            shape["burst_bytes"] = c["burst_bytes"]
    for q in qdiscs:
        if q["kind"] == "netem":
            shape.update({k: q[k] for k in ("delay_s", "jitter_s", "loss_pct", "limit", "duplicate_pct", "corrupt_pct",
                                            "reorder_pct", "reorder_gap")})
            shape.update(q.get("gilbert_elliott") or {})
            # jittered packets keep their order only under a netem rate (see shape.py)
            shape["reorder"] = q["jitter_s"] > 0 and "rate_bps" not in q
            shape["leaf"] = "netem"
            shape["prng_seed"] = q.get("prng_seed")
        elif q["kind"] == "pfifo" and q["parent"] == "1:1":
            shape["limit"] = q["limit"]
            shape["leaf"] = "pfifo"
    return {"ifname": ifname, "qdiscs": qdiscs, "classes": classes, "shape": shape}


def link_counters(ifname: str, *, netns: str | None = None) -> dict[str, int]:
    """Interface byte/packet/drop counters (for samplers and byte accounting)."""
    with netlink(netns) as h:
        msg = h.get_links(_index(h, ifname))[0]
    st = msg.get_attr("IFLA_STATS64") or msg.get_attr("IFLA_STATS")
    return {k: int(st[k]) for k in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_dropped", "tx_dropped")}
