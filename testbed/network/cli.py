"""``testbed net up|down|show|verify`` and ``testbed clean``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from topologies import dump, load
from traffic_control.qdisc import dry_run

from . import cleanup
from .emulation import IMPAIRMENTS, EmulatedNetwork, read_state


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def add_network_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="topology: bundled name (two_dc, three_dc_triangle, geo_wan, star) or a .yaml/.json/.py file")
    p.add_argument("--scale", type=float, default=None, help="multiply every WAN rate by this factor (recorded)")
    p.add_argument("--impairment", choices=IMPAIRMENTS, default="auto",
                   help="how delay/jitter/loss are made: netem (kernel), userspace (NFQUEUE, no netem needed), "
                        "none; auto = netem if the kernel has it, else userspace")
    p.add_argument("--allow-missing-netem", action="store_true",
                   help="without netem (and without the userspace backend) skip delay/jitter/loss instead of failing; "
                        "printed and recorded, never silent")
    p.add_argument("--no-ps", action="store_true", help="do not create the parameter-server host")


def _build(args: argparse.Namespace) -> EmulatedNetwork:
    topo = load(args.spec, scale=args.scale)
    return EmulatedNetwork(topo, impairment=args.impairment, allow_missing_netem=args.allow_missing_netem,
                           with_ps=not args.no_ps, log=_say)


def cmd_up(args: argparse.Namespace) -> int:
    net = _build(args)
    if args.dry_run:
        print("\n".join(net.plan.describe()))
        print()
        for node in net.plan.nodes.values():
            for ifc in node.ifaces:
                if ifc.egress is not None and (ifc.egress.rate_bps or ifc.egress.needs_netem):
                    print("\n".join(dry_run(ifc.name, ifc.egress, netns=node.netns)))
                if ifc.port and ifc.port_egress is not None and (ifc.port_egress.rate_bps or ifc.port_egress.needs_netem):
                    print("\n".join(dry_run(ifc.port, ifc.port_egress)))
        return 0
    events = None
    if args.schedule:
        from traffic_control.schedule import load_schedule

        events = load_schedule(args.schedule)
    net.start()
    player = net.play(events) if events else None
    _say(f"network {net.topo.name} up in {net.timings['up_s']:.2f} s: {len(net.plan.nodes)} nodes, "
         f"{len(net.plan.wans)} WAN links, impairment: {net.impairment.backend if net.impairment else '?'}")
    if player is not None and not args.cli:
        _say(f"playing {len(events or [])} link events; Ctrl-C to stop")
        try:
            player.wait()
        except KeyboardInterrupt:
            player.stop()
        for err in player.errors:
            _say(f"schedule: {err}")
    if args.cli:
        try:
            net.cli()
        finally:
            if player is not None:
                player.stop()
            net.stop()
            _say("network torn down")
        return 0
    _say("left running; enter a node with `ip netns exec tb-<node> bash` (e.g. tb-"
         f"{next(iter(net.plan.nodes))}); remove it with `testbed net down`")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    removed = cleanup.cleanup()
    if removed:
        _say("removed: " + "; ".join(f"{k}: {len(v)}" for k, v in removed.items()))
    else:
        _say("nothing to remove")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from traffic_control import netlink as tcnl

    state = read_state()
    if state is None:
        _say("no testbed network is up")
        return 1
    out: dict[str, Any] = {"state": state, "tc": {}}
    for node, info in state["nodes"].items():
        if info["role"] != "router":
            continue
        with tcnl.netlink(info["netns"]) as h:
            names = [m.get_attr("IFLA_IFNAME") for m in h.get_links()]
        for ifn in names:
            if ifn and ifn.startswith("w-"):
                out["tc"][f"{node}:{ifn}"] = tcnl.show(ifn, netns=info["netns"])
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(f"topology {state['topology']['name']}, impairment {state['impairment']}")
    for key, s in out["tc"].items():
        print(f"  {key:24} {s['shape']}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from .verify import format_table, verify

    net = _build(args)
    with net:
        _say(f"network up in {net.timings['up_s']:.2f} s; measuring ...")
        checks = verify(net, seconds=args.seconds, pings=args.pings, log=_say)
        impairment = net.impairment.to_dict() if net.impairment else None
    failed = [c for c in checks if c.status == "fail"]
    if args.json:
        print(json.dumps({"topology": net.topo.name, "impairment": impairment,
                          "checks": [c.to_dict() for c in checks], "ok": not failed}, indent=2))
    else:
        print(format_table(checks))
        print(f"impairment: {impairment}")
        print("PASS" if not failed else f"FAIL: {len(failed)} measurement(s) out of tolerance")
    return 1 if failed else 0


def cmd_topo(args: argparse.Namespace) -> int:
    topo = load(args.spec, scale=args.scale)
    print(dump(topo, "json" if args.json else "yaml"))
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    return cmd_down(args)


def register(sub: Any) -> None:
    net = sub.add_parser("net", help="bring an emulated network up/down, show it, verify it")
    nsub = net.add_subparsers(dest="net_cmd", required=True)
    up = nsub.add_parser("up", help="build the network of a topology (stays up until `net down`, or use --cli)")
    add_network_options(up)
    up.add_argument("--cli", action="store_true", help="open the Mininet CLI; the network is removed when it exits")
    up.add_argument("--dry-run", action="store_true", help="print the plan and the tc commands, create nothing")
    up.add_argument("--schedule", metavar="CSV",
                    help="play a link trace (time,link,rate,delay,jitter,loss,state) against the running network")
    up.set_defaults(func=cmd_up)
    down = nsub.add_parser("down", help="remove the network (everything named tb-*, testbed processes)")
    down.set_defaults(func=cmd_down)
    show = nsub.add_parser("show", help="the running network and the tc state the kernel reports")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_show)
    ver = nsub.add_parser("verify", help="bring the network up, measure RTT and goodput per link and DC pair, "
                                         "compare with the spec (exit 1 if out of tolerance), tear down")
    add_network_options(ver)
    ver.add_argument("--json", action="store_true", help="machine-readable result")
    ver.add_argument("--seconds", type=float, default=3.0, help="iperf3 duration per direction (default 3)")
    ver.add_argument("--pings", type=int, default=20, help="pings per RTT measurement (default 20)")
    ver.set_defaults(func=cmd_verify)
    topo = sub.add_parser("topo", help="validate a topology and print it normalised (YAML, or --json)")
    topo.add_argument("spec")
    topo.add_argument("--scale", type=float, default=None)
    topo.add_argument("--json", action="store_true")
    topo.set_defaults(func=cmd_topo)
    clean = sub.add_parser("clean", help="remove every testbed object left on this machine (also after a crash)")
    clean.set_defaults(func=cmd_clean)
