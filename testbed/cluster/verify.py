"""``testbed net verify TOPOLOGY --cluster FILE``: the one-machine verify, measured across servers.

The measurements that send traffic (:func:`testbed.network.verify.path_checks`: RTT and MTU over every WAN
link, goodput each way, RTT per DC pair) run unchanged on a :class:`.view.ClusterNetwork`, so a link
tunnelled between two servers is held to the same bars as a link inside one: the ping or iperf3 client
runs on its node's server and the iperf3 server on the other's.  What is read back from a kernel (daemons
alive, wire-sized packets, queue limits) is read on each server by ``testbed cluster part-check`` over ssh
(here, directly), each server for its own interfaces and its own end of every tunnel.

Shape mode (:func:`verify_shape`): the servers themselves are the endpoints.  For every pair of DCs, the
minimum RTT between their servers against the path's round trip, and iperf3 goodput each way against the
path's rate, both from the servers' own namespaces (where the trainers run); and each server's shaper read
back from its kernel (the report its ``shape-up`` returned).

The one-way delay rows (``--delays``) compare a sender's stamps with a receiver's: across servers the
receiver's clock offset from the sender's (both measured by the launcher, ``launch.up``) is taken out of
every delay and recorded in the rows.  A DC without hosts gets its temporary probe endpoint on its own server
(``testbed cluster part-endpoint`` over ssh when that is another), so its goodput is measured there too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from testbed.network import naming
from testbed.network.verify import (
    PROBE_HOST,
    PROBE_OVS_PORT,
    Check,
    Endpoints,
    local_checks,
    path_checks,
    progress,
)

from .launch import remote_testbed, tail_of
from .remote import RemoteError
from .view import ClusterNetwork, ServerNetwork


def part_checks(view: ClusterNetwork, log: Callable[[str], None]) -> list[Check]:
    """Every server's read-back checks, each marked with its server."""
    out: list[Check] = []
    for name in sorted(set(view.placement.assignment.values()), key=view.cluster.names.index):
        log(f"{name}: reading back daemons, packets and queue limits ...")
        if name == view.cluster.launcher:
            checks = local_checks(view.local())
        else:
            server = view.cluster.server(name)
            cp = view.remote(name).run(remote_testbed(server, ["cluster", "part-check"]), timeout=120, check=False)
            if cp.returncode != 0:
                raise RemoteError(server, f"reading its part back failed (exit {cp.returncode}): {tail_of(cp.stderr)}",
                                  "see the message; `testbed net show` there shows its part")
            checks = [Check(**{k: v for k, v in d.items() if k != "error"}) for d in json.loads(cp.stdout)]
        for c in checks:
            c.extra["server"] = name
            if c.kind == "packets":
                c.subject = f"all nodes on {name}"
        out += checks
    return out


def verify(view: ClusterNetwork, seconds: float = 3.0, pings: int = 20,
           log: Callable[[str], None] | None = None, delays: bool = False) -> list[Check]:
    """Every check of ``net verify`` that this layer can make across servers (see the module's docstring)."""
    say_plain = log or (lambda m: None)
    checks = part_checks(view, say_plain)

    def add(net: Any, dc: str) -> str:  # on the DC's own server
        return view.add_endpoint(dc, naming.probe_name(dc), PROBE_HOST, PROBE_OVS_PORT)

    def remove(name: str) -> None:
        view.remove_endpoint(name, PROBE_OVS_PORT)

    from testbed.network.verify import delay_applied

    delays = delays and delay_applied(view)
    return checks + path_checks(view, Endpoints(view, add=add, remove=remove), progress(view, log, delays), seconds,
                                pings, delays)


def part_check_json() -> str:
    """``testbed cluster part-check``: this server's read-back checks of its part, as JSON."""
    from testbed.network.emulation import EmulatedNetwork

    return json.dumps([c.to_dict() for c in local_checks(EmulatedNetwork.attach())])


def self_test(view: ClusterNetwork, log: Callable[[str], None] | None = None) -> Any:
    """The self-test a trial runs before training, across servers: every server's read-back checks, the
    minimum RTT over every WAN link (tunnelled or not) and the one-machine self-test's UDP rate train per
    link direction (sender and receiver each on its own router's server)."""
    from testbed.network.selftest import link_rtts, rate_checks, run_self_test, wan_directions
    from testbed.network.verify import delay_applied

    def body(checks: list[Check]) -> None:
        checks += part_checks(view, log or (lambda m: None))
        checks += link_rtts(view, delay_applied(view))
        checks += rate_checks(view, wan_directions(view))

    return run_self_test("self-test across servers", body, log)


def verify_shape(view: ServerNetwork, report: dict[str, Any], seconds: float = 3.0, pings: int = 20,
                 log: Callable[[str], None] | None = None, delays: bool = False) -> list[Check]:
    """Shape mode's checks (module docstring): shapers read back, RTT per DC pair, goodput per direction;
    with ``delays`` the one-way delay, loss and order rows per direction (clocks corrected)."""
    from testbed.network.measure import iperf3
    from testbed.network.verify import GOODPUT_MIN_RATIO, best_goodput
    from traffic_control.shape import tcp_payload_fraction

    say = log or (lambda m: None)
    checks = shaper_checks(view, report) + pair_rtts(view, pings, say)
    servers = list(view.plans)
    for a in servers:
        for e in view.plans[a].egress:
            src = view.plans[a].dc
            if not e.shape.rate_bps:
                checks.append(Check("pair_goodput", f"{src}->{e.dst_dc}", None, None, "bit/s", "no rate to hold",
                                    "skipped", {"reason": "the path has no rate limit"}))
                continue
            ideal = e.shape.rate_bps * tcp_payload_fraction(e.shape.mtu)
            lossy = e.shape.expected_loss_pct > 0 or e.shape.corrupt_pct > 0 or (e.shape.jitter_s > 0
                                                                                  and e.shape.reorder)

            def measure(again: bool, a: str = a, e: Any = e, src: str = src) -> dict[str, Any]:
                say(f"iperf3 {src}->{e.dst_dc} ({seconds:g} s, {a} -> {e.dst_server}" + (", again" if again else "")
                    + ") ...")
                return iperf3(view, a, e.dst_server, e.address, seconds=seconds)

            res, attempts = best_goodput(measure, ideal, retry=not lossy)
            ratio = res["bps"] / ideal
            status = "info" if lossy else ("pass" if ratio >= GOODPUT_MIN_RATIO else "fail")
            checks.append(Check("pair_goodput", f"{src}->{e.dst_dc}", ideal, res["bps"], "bit/s",
                                f"measured/ideal >= {GOODPUT_MIN_RATIO} (ideal = path rate x TCP payload share)",
                                status, {"ratio": ratio, "rate_bps": e.shape.rate_bps, "path": list(e.path),
                                         "between": f"{a} -> {e.dst_server}", "retransmits": res.get("retransmits"),
                                         "attempts": attempts}))
    if delays:
        from testbed.network.delay_check import direction_checks

        for a in servers:
            for e in view.plans[a].egress:
                if e.shape.needs_netem:
                    say(f"one-way delay train {view.plans[a].dc}->{e.dst_dc} ({a} -> {e.dst_server}) ...")
                    checks += direction_checks(view, f"{view.plans[a].dc}->{e.dst_dc}", a, e.dst_server, e.address,
                                               e.shape, say=say)
    return checks


def pair_rtts(view: ServerNetwork, pings: int, say: Callable[[str], None]) -> list[Check]:
    """Minimum RTT between every two DCs' servers against the round trip of the paths between them."""
    from testbed.network.verify import RTT_TOLERANCE, min_rtt, rtt_ok

    topo, out = view.topo, []
    servers = list(view.plans)
    for i, a in enumerate(servers):
        for b in servers[i + 1:]:
            pa, pb = view.plans[a], view.plans[b]
            expected = topo.path_delay(pa.dc, pb.dc) + topo.path_delay(pb.dc, pa.dc)
            say(f"ping {pa.dc} ({a}) <-> {pb.dc} ({b}) ...")
            pr, attempts = min_rtt(view, a, pb.address, expected, pings)
            out.append(Check("pair_rtt", f"{pa.dc}<->{pb.dc}", expected, pr.min_s, "s", RTT_TOLERANCE,
                             "pass" if rtt_ok(pr.min_s, expected) else "fail",
                             {"between": f"{a} -> {b}", "path": topo.path(pa.dc, pb.dc), "mean_s": pr.avg_s,
                              "loss_pct": pr.loss_pct, "attempts": attempts}))
    return out


def shape_self_test(view: ServerNetwork, report: dict[str, Any], log: Callable[[str], None] | None = None) -> Any:
    """The self-test a trial runs before training in shape mode: every shaper read back, the minimum RTT
    per DC pair, and a UDP rate train per direction, server to server (``selftest.rate_checks``)."""
    from testbed.network.selftest import rate_checks, run_self_test

    def body(checks: list[Check]) -> None:
        checks += shaper_checks(view, report) + pair_rtts(view, 5, log or (lambda m: None))
        pairs: dict[frozenset[str], list[tuple[str, str, str, str, Any]]] = {}
        for name, plan in view.plans.items():
            for e in plan.egress:
                pairs.setdefault(frozenset((name, e.dst_server)), []).append(
                    (f"{plan.dc}->{e.dst_dc}", name, e.dst_server, e.address, e.shape))
        checks += rate_checks(view, list(pairs.values()))

    return run_self_test("self-test (shape mode)", body, log)


def shaper_checks(view: ServerNetwork, report: dict[str, Any]) -> list[Check]:
    """Each server's shaper as its kernel reported it at ``shape-up``: the HTB rate of every destination's
    tree against the path's rate (a tree missing, or at another rate, fails)."""
    out = []
    for name, plan in view.plans.items():
        applied = (report["servers"].get(name) or {}).get("applied") or {}
        for e in plan.egress:
            key = f"shape:sh-{e.dst_dc}"
            tree = applied.get(key)
            want = e.shape.rate_bps
            if tree is None:
                status, got = "fail", None
            elif want:
                got = (tree.get("shape") or {}).get("rate_bps")
                status = "pass" if got is not None and abs(got - want) <= 0.01 * want else "fail"
            else:
                got, status = None, "pass"
            out.append(Check("shaper", f"{plan.dc}->{e.dst_dc}", want, got, "bit/s", "HTB rate = path rate (1 %)",
                             status, {"server": name, "interface": key,
                                                                "shape": (tree or {}).get("shape")}))
    return out
