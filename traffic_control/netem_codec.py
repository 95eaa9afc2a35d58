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
* the fix for ``rate``: pyroute2's netem plugin reads ``rate`` from the
  keyword arguments but leaves it in the request, where it is then encoded
  as the top-level ``TCA_RATE`` attribute and the request fails to encode
  ("argument for 's' must be a bytes object").

:func:`install` is idempotent and is called on import of
:mod:`traffic_control.netlink`.
"""

from __future__ import annotations

from typing import Any

from pyroute2.netlink.rtnl.tcmsg import sched_netem

#: netem's nested attributes in kernel order (the index is the attribute type).
NLA_MAP = (
    ("TCA_NETEM_UNSPEC", "none"),
    ("TCA_NETEM_CORR", "netem_corr"),
    ("TCA_NETEM_DELAY_DIST", "none"),
    ("TCA_NETEM_REORDER", "netem_reorder"),
    ("TCA_NETEM_CORRUPT", "netem_corrupt"),
    ("TCA_NETEM_LOSS", "none"),
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


def _get_parameters(kwarg: dict[str, Any]) -> dict[str, Any]:
    opts = _original_get_parameters(kwarg)
    seed = kwarg.get("prng_seed")
    if seed is not None:
        opts["attrs"].append(["TCA_NETEM_PRNG_SEED", int(seed) & (2**64 - 1)])
    return opts


def _fix_request(request: Any) -> None:
    for key in ("rate", "prng_seed"):
        if key in request:
            del request[key]


def install() -> None:
    """Extend pyroute2's netem plugin (idempotent)."""
    opts = sched_netem.options
    if opts.nla_map != NLA_MAP:
        opts.nla_map = NLA_MAP
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
