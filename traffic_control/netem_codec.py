"""What pyroute2's netem encoding lacks, added in one place (netlink, never a shell).

pyroute2 (0.7-0.9) knows netem's attributes only up to ``TCA_NETEM_RATE``.
This module extends its attribute table to the kernel's full list (values
from ``include/uapi/linux/pkt_sched.h``) and its request builder with the
parameters the testbed uses:

* ``prng_seed``: ``TCA_NETEM_PRNG_SEED`` (u64), the seed of netem's own
  pseudo-random generator for loss, jitter and the other random choices, so
  that a trial's impairment pattern is reproducible.  Kernels older than
  the attribute (it appeared in Linux 6.7) ignore it silently, which
  :func:`seed_applied` detects from the read-back: such a kernel draws from
  its unseeded generator.
* ``gemodel``: ``TCA_NETEM_LOSS`` with a nested ``NETEM_LOSS_GE`` (struct
  ``tc_netem_gemodel``: p, r, h, k1 as u32 fractions of 2^32 - 1), the
  Gilbert-Elliott loss model; ``h`` is the probability of *delivery* in the
  bad state and ``k1`` the probability of *loss* in the good state (the
  kernel's ``loss_gilb_ell``).  Without the attribute a ``change`` resets
  netem to independent loss, so a link leaves the model by omitting it.
* ``rate`` above 2^32 - 1 bytes/s (34.4 Gbit/s): ``TCA_NETEM_RATE64``
  beside the saturated 32-bit one, as the kernel reads it.
* ``delay_dist``: ``TCA_NETEM_DELAY_DIST``, a jitter distribution's table
  (:mod:`traffic_control.delay_dist`: the same table the userspace backend
  draws from) as netem's array of s16.  netem keeps a table a ``change``
  does not send, and never dumps it: the distribution is fixed when the leaf
  is built, and ``net verify --delays`` measures it.
* ``corrupt``: ``TCA_NETEM_CORRUPT`` sent on every request, 0 included:
  the kernel keeps a corruption probability a ``change`` does not send, so
  clearing it needs an explicit 0 (pyroute2 sends the attribute only when
  non-zero).
* the fix for ``rate``: pyroute2's netem plugin reads ``rate`` from the
  keyword arguments but leaves it in the request, where it is then encoded
  as the top-level ``TCA_RATE`` attribute and the request fails to encode
  ("argument for 's' must be a bytes object").

:func:`install` is idempotent and is called on import of
:mod:`traffic_control.netlink`.
"""

from __future__ import annotations

from typing import Any

from pyroute2.netlink import nla
from pyroute2.netlink.rtnl.tcmsg import sched_netem

#: netem's nested attributes in kernel order (the index is the attribute type).
NLA_MAP = (
    ("TCA_NETEM_UNSPEC", "none"),
    ("TCA_NETEM_CORR", "netem_corr"),
    ("TCA_NETEM_DELAY_DIST", "cdata"),
    ("TCA_NETEM_REORDER", "netem_reorder"),
    ("TCA_NETEM_CORRUPT", "netem_corrupt"),
    ("TCA_NETEM_LOSS", "netem_loss"),
    ("TCA_NETEM_RATE", "netem_rate"),
    ("TCA_NETEM_ECN", "uint32"),
    ("TCA_NETEM_RATE64", "uint64"),
    ("TCA_NETEM_PAD", "none"),
    ("TCA_NETEM_LATENCY64", "int64"),
    ("TCA_NETEM_JITTER64", "int64"),
    ("TCA_NETEM_SLOT", "none"),
    ("TCA_NETEM_SLOT_DIST", "none"),
    ("TCA_NETEM_PRNG_SEED", "uint64"),
)

#: First mainline kernel whose netem takes TCA_NETEM_PRNG_SEED.
PRNG_SEED_SINCE = "6.7"

_original_get_parameters = sched_netem.get_parameters
U32_MAX = 2**32 - 1


class netem_loss(nla):  # noqa: N801 - pyroute2's naming of nested attribute classes
    """TCA_NETEM_LOSS: the loss model's parameters (only the Gilbert-Elliott one is used)."""

    nla_map = (("NETEM_LOSS_UNSPEC", "none"), ("NETEM_LOSS_GI", "none"), ("NETEM_LOSS_GE", "gemodel"))

    class gemodel(nla):  # noqa: N801
        fields = (("p", "I"), ("r", "I"), ("h", "I"), ("k1", "I"))


def _u32(fraction: float) -> int:
    return max(0, min(U32_MAX, int(round(fraction * U32_MAX))))


def gemodel_attr(p_pct: float, r_pct: float, loss_bad_pct: float, loss_good_pct: float) -> list[Any]:
    """The ``TCA_NETEM_LOSS`` attribute of a Gilbert-Elliott model given in the spec's terms."""
    return ["TCA_NETEM_LOSS", {"attrs": [["NETEM_LOSS_GE", {
        "p": _u32(p_pct / 100), "r": _u32(r_pct / 100), "h": _u32(1 - loss_bad_pct / 100),
        "k1": _u32(loss_good_pct / 100)}]]}]


def gemodel_of(options: Any) -> dict[str, float] | None:
    """A dumped netem qdisc's Gilbert-Elliott model in the spec's terms (percent), or None."""
    if options is None or not hasattr(options, "get_attr"):
        return None
    loss = options.get_attr("TCA_NETEM_LOSS")
    ge = loss.get_attr("NETEM_LOSS_GE") if loss is not None and hasattr(loss, "get_attr") else None
    if ge is None:
        return None
    return {"ge_p_pct": ge["p"] / U32_MAX * 100, "ge_r_pct": ge["r"] / U32_MAX * 100,
            "ge_loss_bad_pct": (1 - ge["h"] / U32_MAX) * 100, "ge_loss_good_pct": ge["k1"] / U32_MAX * 100}


def reorder_of(options: Any) -> dict[str, Any]:
    """A dumped netem qdisc's reorder in the spec's terms: probability (0 while gap is 0: netem then never
    reorders, whatever probability it keeps) and gap."""
    gap = int(options.get("gap") or 0) if options is not None and hasattr(options, "get") else 0
    r = options.get_attr("TCA_NETEM_REORDER") if options is not None and hasattr(options, "get_attr") else None
    pct = r["prob_reorder"] / U32_MAX * 100 if r is not None and gap else 0.0
    return {"reorder_pct": pct, "reorder_gap": gap or 1}


def corrupt_pct_of(options: Any) -> float:
    if options is None or not hasattr(options, "get_attr"):
        return 0.0
    c = options.get_attr("TCA_NETEM_CORRUPT")
    return 0.0 if c is None else c["prob_corrupt"] / U32_MAX * 100


def _get_parameters(kwarg: dict[str, Any]) -> dict[str, Any]:
    corrupt = kwarg.pop("corrupt", None)
    rate64 = None
    if isinstance(kwarg.get("rate"), int) and kwarg["rate"] > U32_MAX:  # bytes/s past 34.4 Gbit/s
        rate64, kwarg["rate"] = kwarg["rate"], U32_MAX
    opts = _original_get_parameters(kwarg)
    if rate64 is not None:
        opts["attrs"].append(["TCA_NETEM_RATE64", rate64])
    if corrupt is not None:
        opts["attrs"] = [a for a in opts["attrs"] if a[0] != "TCA_NETEM_CORRUPT"]
        opts["attrs"].append(["TCA_NETEM_CORRUPT", {"prob_corrupt": _u32(corrupt / 100), "corr_corrupt": 0}])
    ge = kwarg.get("gemodel")
    if ge is not None:
        opts["attrs"].append(gemodel_attr(*ge))
    dist = kwarg.get("delay_dist")
    if dist is not None:  # the testbed's table (traffic_control.delay_dist) as netem's s16 array
        from .delay_dist import table_bytes

        opts["attrs"].append(["TCA_NETEM_DELAY_DIST", table_bytes(dist)])
    seed = kwarg.get("prng_seed")
    if seed is not None:
        opts["attrs"].append(["TCA_NETEM_PRNG_SEED", int(seed) & (2**64 - 1)])
    return opts


def _fix_request(request: Any) -> None:
    for key in ("rate", "prng_seed", "gemodel", "corrupt", "delay_dist"):
        if key in request:
            del request[key]


def install() -> None:
    """Extend pyroute2's netem plugin (idempotent)."""
    opts = sched_netem.options
    if opts.nla_map != NLA_MAP:
        opts.nla_map = NLA_MAP
        opts.netem_loss = netem_loss
        # pyroute2 compiles a class's attribute table on first use: make it compile the new one.
        opts._nlmsg_base__compiled_nla = False
    sched_netem.get_parameters = _get_parameters
    sched_netem.fix_request = _fix_request


def seed_applied(options: Any) -> int | None:
    """The PRNG seed a netem qdisc's dumped options report, or None (kernel without the attribute)."""
    if options is None or not hasattr(options, "get_attr"):
        return None
    value = options.get_attr("TCA_NETEM_PRNG_SEED")
    return None if value is None else int(value)
