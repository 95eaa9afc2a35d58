"""A shape turned into the qdisc tree that realises it, as data.

The tree on the shaped (egress) interface is::

    root 1:  htb default 1
      class 1:1  htb rate R ceil R burst B cburst B
        10:  netem delay D jitter J loss L limit N [rate X]   (or pfifo limit N without netem)

HTB enforces the rate (it works on every kernel); netem, as the leaf, holds
packets for their delay and drops them for loss.  Packets therefore wait for
the delay, then for the rate, as on a real link whose propagation delay sits
behind a bottleneck queue.  The same list of :class:`TcOp` drives the netlink
backend and the dry run (``tc`` command lines), so the two cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .shape import LinkShape, order_keeping_rate_bps
from .units import format_rate

ROOT = 0xFFFFFFFF
HTB_HANDLE = 0x10000  # 1:
HTB_CLASS = 0x10001  # 1:1
LEAF_HANDLE = 0x100000  # 10:
#: HTB rate used when a direction has netem effects but no rate (effectively unshaped).
UNSHAPED_BPS = 100e9


def handle_str(h: int) -> str:
    if h == ROOT:
        return "root"
    major, minor = h >> 16, h & 0xFFFF
    return f"{major:x}:{minor:x}" if minor else f"{major:x}:"


@dataclass(frozen=True)
class TcOp:
    """One qdisc or class operation: pyroute2 ``tc()`` arguments plus its ``tc`` command line."""

    command: str  # add | change | add-class | change-class | del
    kind: str
    handle: int
    parent: int
    params: dict[str, Any] = field(default_factory=dict)
    argv: tuple[str, ...] = ()

    def tc_command(self, dev: str, netns: str | None = None) -> list[str]:
        base = ["ip", "netns", "exec", netns] if netns else []
        obj = "class" if self.command.endswith("-class") else "qdisc"
        verb = self.command.split("-")[0]
        where = ["root"] if self.parent == ROOT else ["parent", handle_str(self.parent)]
        ident = ["classid", handle_str(self.handle)] if obj == "class" else ["handle", handle_str(self.handle)]
        if verb == "del":
            return [*base, "tc", obj, "del", "dev", dev, *where]
        return [*base, "tc", obj, verb, "dev", dev, *where, *ident, self.kind, *self.argv]


def _bytes_rate(bps: float) -> int:
    return int(round(bps / 8))


def _tc_rate(bps: float) -> str:
    return format_rate(bps).replace("Gbit", "gbit").replace("Mbit", "mbit").replace("Kbit", "kbit")


def _us(seconds: float) -> int:
    return int(round(seconds * 1e6))


def htb_class_op(shape: LinkShape, command: str) -> TcOp:
    rate = shape.rate_bps or UNSHAPED_BPS
    bps = _bytes_rate(rate)
    burst = shape.burst_bytes or (int(rate / 8 * 0.001) + shape.mtu)
    quantum = min(200000, max(shape.mtu + 14, bps // 100))
    params = {"rate": bps, "ceil": bps, "burst": burst, "cburst": burst, "quantum": quantum, "prio": 0}
    argv = ("rate", _tc_rate(rate), "ceil", _tc_rate(rate), "burst", f"{burst}b", "cburst", f"{burst}b",
            "quantum", str(quantum))
    return TcOp(command, "htb", HTB_CLASS, HTB_HANDLE, params, argv)


def leaf_op(shape: LinkShape, command: str, netem: bool | None, seed: int | None = None, *,
            keep_order: bool = False) -> TcOp:
    """The leaf under the HTB class: netem when ``netem`` (even for a shape without delay), else pfifo;
    ``netem=None``: netem exactly when the shape has delay, jitter or loss.

    A netem leaf with no delay, jitter or loss is a FIFO of ``limit``
    packets; callers give every link that may be impaired later (all WAN
    links under the netem backend) a netem leaf from the start, because the
    kernel cannot change a qdisc's kind in place (``replace`` with another
    kind on the same handle is refused: "Invalid qdisc name"), and grafting
    a new leaf would drop the packets queued in the old one.  ``seed``:
    netem's PRNG seed (``TCA_NETEM_PRNG_SEED``).  ``keep_order``: give netem
    its order-keeping rate even without jitter (the jitter driver moves the
    delay itself, :mod:`traffic_control.jitter_driver`, and a drop of the
    delay must not let a packet overtake the one ahead).
    """
    limit = shape.netem_limit
    if netem is None:
        netem = shape.needs_netem
    if netem:
        params: dict[str, Any] = {"delay": _us(shape.delay_s), "jitter": _us(shape.jitter_s),
                                  "loss": shape.loss_pct, "limit": limit}
        argv: list[str] = ["delay", f"{_us(shape.delay_s)}us"]
        if shape.jitter_s:
            argv += [f"{_us(shape.jitter_s)}us"]
            if shape.jitter_distribution != "uniform":
                # the testbed's own table (traffic_control.delay_dist), not iproute2's file of the same name
                params["delay_dist"] = shape.jitter_distribution
                argv += ["distribution", shape.jitter_distribution]
        if shape.loss_pct:
            argv += ["loss", f"{shape.loss_pct:g}%"]
        if shape.gilbert_elliott:
            # tc's words: gemodel p r 1-h 1-k (the loss probabilities in the bad and the good state)
            params["gemodel"] = (shape.ge_p_pct, shape.ge_r_pct, shape.ge_loss_bad_pct, shape.ge_loss_good_pct)
            argv += ["loss", "gemodel", f"{shape.ge_p_pct:g}%", f"{shape.ge_r_pct:g}%", f"{shape.ge_loss_bad_pct:g}%",
                     f"{shape.ge_loss_good_pct:g}%"]
        # netem's reorder: a candidate (every gap-th packet) goes at once with probability P.  gap 0 turns
        # it off: the kernel keeps a reorder probability a change does not send, but never reorders at gap 0
        params["prob_reorder"] = shape.reorder_pct
        params["gap"] = shape.reorder_gap if shape.reorder_pct else 0
        if shape.reorder_pct:
            argv += ["reorder", f"{shape.reorder_pct:g}%", "gap", str(shape.reorder_gap)]
        params["duplicate"] = shape.duplicate_pct
        params["corrupt"] = shape.corrupt_pct
        if shape.duplicate_pct:
            argv += ["duplicate", f"{shape.duplicate_pct:g}%"]
        if shape.corrupt_pct:
            argv += ["corrupt", f"{shape.corrupt_pct:g}%"]
        argv += ["limit", str(limit)]
        if (shape.jitter_s or keep_order) and not shape.reorder:
            # A netem rate keeps release times monotonic: jitter without reordering.
            keep = order_keeping_rate_bps(shape.rate_bps)
            params["rate"] = _bytes_rate(keep)  # above 2^32 - 1 bytes/s: TCA_NETEM_RATE64 (netem_codec)
            argv += ["rate", _tc_rate(keep)]
        else:
            # Explicitly no netem rate: on `change` the kernel keeps a rate it is not
            # sent, so switching reorder on (or jitter off) must clear it.
            params["rate"] = 0
        if seed is not None:
            params["prng_seed"] = seed
            argv += ["seed", str(seed)]
        return TcOp(command, "netem", LEAF_HANDLE, HTB_CLASS, params, tuple(argv))
    return TcOp(command, "pfifo", LEAF_HANDLE, HTB_CLASS, {"limit": limit}, ("limit", str(limit)))


def build_ops(shape: LinkShape, *, netem: bool | None = None, seed: int | None = None) -> list[TcOp]:
    """Operations that install ``shape`` on a clean interface (root replaced).

    ``netem``: True, the leaf is netem (see :func:`leaf_op`); False, pfifo;
    None, netem exactly when the shape needs it.
    """
    return [
        TcOp("add", "htb", HTB_HANDLE, ROOT, {"default": 1, "r2q": 10}, ("default", "1")),
        htb_class_op(shape, "add-class"),
        leaf_op(shape, "add", netem, seed),
    ]


def change_ops(old: LinkShape, new: LinkShape, *, netem: bool | None = None, seed: int | None = None) -> list[TcOp]:
    """In-place changes from ``old`` to ``new``: ``change`` only, never delete and re-add.

    The leaf keeps its kind (netem stays netem, pfifo stays pfifo): a link
    built for the netem backend can take delay, jitter and loss or drop
    them all, without a gap.  With ``netem=False`` only the rate and the
    pfifo's limit change: delay, jitter and loss are then the caller's to
    apply elsewhere (the userspace backend), or to refuse.  ``netem=None``
    means the leaf was built with ``netem=None`` from ``old``: netem if
    ``old`` needed it; a pfifo leaf then cannot take delay, jitter or loss
    (an error: build links that may get them with ``netem=True``).
    """
    if netem is None:
        netem = old.needs_netem
        if new.needs_netem and not netem:
            from .errors import TrafficControlError

            raise TrafficControlError(f"the link has a pfifo leaf (built without delay, jitter or loss) and "
                                      f"cannot take {new.describe()} in place (fix: build it with netem=True, "
                                      "which gives it a netem leaf from the start)")
    ops = []
    if (old.rate_bps, old.burst_bytes, old.mtu) != (new.rate_bps, new.burst_bytes, new.mtu):
        ops.append(htb_class_op(new, "change-class"))
    old_leaf = leaf_op(old, "change", netem, seed)
    new_leaf = leaf_op(new, "change", netem, seed)
    if netem and "delay_dist" in old_leaf.params and new.jitter_s and "delay_dist" not in new_leaf.params:
        # back to uniform: the kernel keeps the old table unless it is sent another (delay_dist.table)
        new_leaf.params["delay_dist"] = "uniform"
    if old_leaf.params != new_leaf.params:
        ops.append(new_leaf)
    return ops


def clear_ops() -> list[TcOp]:
    return [TcOp("del", "htb", HTB_HANDLE, ROOT)]


def dry_run(ifname: str, shape: LinkShape, *, netns: str | None = None, netem: bool | None = None,
            seed: int | None = None) -> list[str]:
    """The ``tc`` command lines equivalent to applying ``shape`` (for ``--dry-run``)."""
    return [" ".join(op.tc_command(ifname, netns)) for op in build_ops(shape, netem=netem, seed=seed)]
