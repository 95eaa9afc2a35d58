"""A leaf's netem parameters encoded by pyroute2 (with the testbed's codec) and decoded back: what the
kernel would receive, read the way ``net show`` reads it (shared by the loss-model and distribution tests)."""

from __future__ import annotations

from typing import Any

from traffic_control import netem_codec


def netem_round_trip(params: dict[str, Any]) -> Any:
    from pyroute2.netlink.rtnl.tcmsg import sched_netem

    netem_codec.install()
    params = dict(params)
    params.pop("rate", None)
    msg = sched_netem.options()
    msg.setvalue(sched_netem.get_parameters(params))
    msg.encode()
    back = sched_netem.options(msg.data)
    back.decode()
    return back
