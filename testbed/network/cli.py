"""``testbed net up|down|show|set|exec|verify|cross``, ``testbed topo`` and ``testbed clean``.

A network brought up with ``net up`` belongs to no process: it stays up,
with its delays, after the command returns, until ``net down`` (or
``clean``).  ``net show``, ``net set`` and ``net exec`` attach to it from
any later process (the containerlab ``tools netem`` habits: change a live
link in place, run a command in a node).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from topologies import dump, load
from traffic_control.errors import ValidationError
from traffic_control.qdisc import dry_run
from traffic_control.shape import DEFAULT_MTU
from traffic_control.units import format_rate, format_time, parse_percent, parse_rate, parse_time

from . import cgroups, cleanup, naming, state
from .emulation import IMPAIRMENTS, EmulatedNetwork, NotUp, check_schedule, exec_argv, owned_env


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
    p.add_argument("--seed", type=int, default=None,
                   help="seed for the random loss/jitter draws (userspace: always seeded, default 0; netem: its "
                        "PRNG seed where the kernel takes one, Linux >= 6.7)")


def _build(args: argparse.Namespace) -> EmulatedNetwork:
    topo = load(args.spec, scale=args.scale)
    return EmulatedNetwork(topo, impairment=args.impairment, allow_missing_netem=args.allow_missing_netem,
                           with_ps=not args.no_ps, log=_say, seed=args.seed)


def cmd_up(args: argparse.Namespace) -> int:
    if args.cluster:
        return _up_cluster(args)
    net = _build(args)
    events = None
    if args.schedule:
        from traffic_control.schedule import load_schedule

        events = load_schedule(args.schedule)
        check_schedule(net.topo, events)  # before anything is built
    if args.dry_run:
        _print_dry_run(net)
        return 0
    try:
        net.start()  # in the guard too: a Ctrl-C between its return and the next line must not leave it up
        status = _after_up(net, args, events)
        if args.cli:
            return status
        net.stop_watching()
        # From here `net up` has succeeded: a Ctrl-C that lands while the process exits
        # must neither tear the reported network down nor die with a traceback.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:  # before success was reported: nothing may stay behind
        net.stop()
        raise
    skipped = bool(net.impairment and net.impairment.skipped)
    _say(f"left running ({'its delays/loss were SKIPPED, see above' if skipped else 'its delays too'}, until "
         "`testbed net down`); run a command in a node with "
         f"`testbed net exec {next(iter(net.plan.nodes))} -- CMD`; change a link with `testbed net set A B ...`")
    return status


def _up_cluster(args: argparse.Namespace) -> int:
    """``net up SPEC --cluster FILE``: every server builds its DCs (testbed.cluster.launch)."""
    from testbed.cluster import launch
    from testbed.cluster.model import load as load_cluster

    for flag in ("cli", "dry_run", "schedule"):
        if getattr(args, flag):
            raise ValidationError(f"--{flag.replace('_', '-')}", "not available with --cluster yet",
                                  "bring the network up without it (see `testbed cluster place` for the plan)")
    from testbed.cluster.capacity import for_build

    topo = load(args.spec, scale=args.scale)
    cluster = for_build(topo, load_cluster(args.cluster), log=_say)  # cores, for an automatic placement
    rep = launch.up(topo, cluster, impairment=args.impairment, allow_missing_netem=args.allow_missing_netem,
                    with_ps=not args.no_ps, seed=args.seed)
    if cluster.mode == "shape":
        from testbed.cluster.shaping import ServerShaping, describe

        for line in describe({n: ServerShaping.from_dict(p) for n, p in rep["shaping"].items()}):
            _say(line)
    for name, r in rep["servers"].items():
        clock = r.get("clock")
        _say(f"{name}: {', '.join(r['dcs'])}: {r['nodes']} nodes, {r['tunnels']} tunnel(s), impairment "
             f"{r['impairment']}" + (f", SKIPPED: {'; '.join(r['skipped'])}" if r["skipped"] else "")
             + (f", clock {clock['offset_ns'] / 1e6:+.3f} ms +- {clock['bound_ns'] / 1e6:.3f} ms" if clock else ""))
    _say(f"network {topo.name} up on {len(rep['servers'])} server(s) in {rep['up_s']:.2f} s; left running until "
         f"`testbed net down --cluster {args.cluster}`")
    if args.json:
        print(json.dumps(rep, indent=2))
    return 0


def _after_up(net: EmulatedNetwork, args: argparse.Namespace, events: Any) -> int:
    """Report the new network, then play its schedule or run the Mininet CLI (which tears it down)."""
    imp = net.impairment
    _say(f"network {net.topo.name} up in {net.timings['up_s']:.2f} s: {len(net.plan.nodes)} nodes, "
         f"{len(net.plan.wans)} WAN links, impairment: {imp.backend if imp else '?'}"
         + (f" ({len(net.userspace)} daemons)" if net.userspace else ""))
    if imp is not None and imp.backend == "netem" and imp.netem_seeded is False:
        _say(f"note: {imp.randomness}")
    player = net.play(events) if events else None
    if args.cli:
        try:
            net.cli()
        finally:
            if player is not None:
                player.stop()
            net.stop()
            _say("network torn down")
        return 0
    if player is None:
        return 0
    _say(f"playing {len(events or [])} link events; Ctrl-C stops the schedule (the network stays up)")
    try:
        player.wait()
    except KeyboardInterrupt:
        player.stop()
    for err in player.errors:
        _say(f"schedule: {err}")
    return 1 if player.errors else 0


def _print_dry_run(net: EmulatedNetwork) -> None:
    """What ``start`` would do with the backend ``auto`` would choose, as commands: namespace sysctls and
    interface settings, tc, and for the userspace backend its netfilter rules and daemons, for netem the
    jitter driver (``start`` does the same through netlink and its own processes)."""
    import shlex

    from traffic_control.jitter import interval_s as jitter_interval_s
    from traffic_control.shape import WIRE_GSO_SEGS
    from traffic_control.userspace.rules import rule_argvs

    from . import docker_hosts
    from .emulation import Impairment, check_backend_features, check_gpus, node_sysctls
    from .impairment import to_impairment_shape
    from .jitter_control import leaves_of

    req = net.requested
    backend = req if req != "auto" else ("netem" if _kernel_has_netem() else "userspace")
    netem = backend == "netem"
    check_backend_features(net.topo, Impairment(backend, netem))  # what up would refuse, refused here too
    gpus = net.gpu_assignment = check_gpus(net.topo, net.plan)
    print("\n".join(net.plan.describe()))
    for node, devices in gpus.items():
        print(f"# {node}: GPUs {','.join(map(str, devices))}"
              + (" (docker --gpus)" if net.docker_config(node) else " (CUDA_VISIBLE_DEVICES)"))
    for node in net.plan.nodes:
        cfg = net.docker_config(node)
        if cfg is not None:
            print("docker " + " ".join(shlex.quote(a) for a in docker_hosts.run_argv(node, cfg, [])))
    print()
    print(f"# impairment backend: {backend}")
    print("# packets: " + ("GSO super-packets (gso: true)" if net.topo.gso else
                           f"wire-sized (GSO segment cap {WIRE_GSO_SEGS} on every node interface)"))
    for node in net.plan.nodes.values():
        print(f"ip netns exec {node.netns} sysctl -qw " + " ".join(node_sysctls(net.topo, node)))
        if not net.topo.gso:
            for ifc in node.ifaces:
                print(f"ip -n {node.netns} link set dev {ifc.name} gso_max_segs {WIRE_GSO_SEGS}")

    def daemon(netns: str, ifname: str, shape: Any, what: str) -> None:
        for argv in rule_argvs(ifname, f"IFINDEX({ifname})"):  # the queue number is the interface's index
            print(f"ip netns exec {netns} " + shlex.join(argv))
        print(f"ip netns exec {netns} python -m traffic_control.userspace run --ifname {ifname} --state-dir "
              f"STATE_DIR  # detached NFQUEUE daemon ({what}): {to_impairment_shape(shape).to_dict()}")

    for node in net.plan.nodes.values():
        for ifc in node.ifaces:
            if ifc.peer_node:
                print("\n".join(dry_run(ifc.name, ifc.egress, netns=node.netns, netem=netem)))
                if backend == "userspace" and ifc.egress.needs_netem:
                    daemon(node.netns, ifc.name, ifc.egress, f"{node.name}:{ifc.name} egress")
                continue
            if ifc.egress is not None and (netem or ifc.egress.rate_bps):
                print("\n".join(dry_run(ifc.name, ifc.egress, netns=node.netns,
                                        netem=netem and ifc.egress.needs_netem)))
            if ifc.port and ifc.port_egress is not None:
                print("\n".join(dry_run(ifc.port, ifc.port_egress, netns=ifc.switch_netns, netem=False)))
    for sw in net.plan.switches:
        if sw.lan_impairment is None:
            continue
        if backend == "userspace":
            print(f"ip netns exec {sw.netns} sysctl -qw net.bridge.bridge-nf-call-iptables=1  # its bridged "
                  "frames reach the queue (this namespace only)")
            daemon(sw.netns, sw.bridge, sw.lan_impairment, f"LAN of {sw.dc}, every frame the switch bridges")
        elif backend == "none":
            print(f"# LAN of {sw.dc}: {sw.lan_impairment.describe()} SKIPPED (no impairment backend)")
    if netem:
        for leaf in leaves_of(net):
            sh = leaf["shape"]
            interval = jitter_interval_s(sh["jitter_s"], sh.get("jitter_interval_s"))
            print(f"# jitter driver (one detached process, traffic_control/jitter_driver.py): every "
                  f"{format_time(interval)} sets {leaf['netns']}:{leaf['ifname']}'s netem delay to a new draw of "
                  f"{format_time(sh['delay_s'])} +- {format_time(sh['jitter_s'])} (seed {leaf['seed']}), "
                  "netem's own jitter off, its rate kept so order is")


def _kernel_has_netem() -> bool:
    if os.geteuid() != 0:
        return False
    from traffic_control.capabilities import has_netem

    return has_netem()


def cmd_down(args: argparse.Namespace) -> int:
    if getattr(args, "cluster", None):
        from testbed.cluster import launch
        from testbed.cluster.model import load as load_cluster

        out = launch.down(load_cluster(args.cluster))
        for name, r in out.items():
            _say(f"{name}: " + ("cleaned" if r["ok"] else f"NOT cleaned: {r.get('error') or r.get('said')}"))
        return 0 if all(r["ok"] for r in out.values()) else 1
    removed = cleanup.cleanup()
    if removed:
        _say("removed: " + "; ".join(f"{k}: {len(v)}" for k, v in removed.items()))
    else:
        _say("nothing to remove")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    if getattr(args, "cluster", None):
        return _show_cluster(args)
    from testbed.cluster.show import emulated_report, shape_report

    shaped = shape_report()
    if shaped is not None:  # a shape-mode server: its shaper, one direction per destination DC
        return _show_shaped(args, shaped)
    try:
        net = EmulatedNetwork.attach()
    except NotUp as e:
        _say(str(e))
        return 1
    out = emulated_report(net, state.read() or {})
    links, health = out["links"], out["impairment_health"]
    failing = [h for h in health if not h["alive"]]
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 1 if failing else 0
    imp = net.impairment
    print(f"topology {net.topo.name}: {len(net.plan.nodes)} nodes, impairment backend "
          f"{imp.backend if imp else '?'}" + (f", seed {imp.seed}" if imp and imp.seed is not None else ""))
    print("  packets: " + ("GSO super-packets (gso: true; a queue limit counts skbs of up to 64 KiB)"
                           if net.topo.gso else "wire-sized (GSO off on every interface; queue limits in wire packets)"))
    if imp is not None and imp.skipped:
        print(f"  SKIPPED (not applied): {'; '.join(imp.skipped)}")
    for key, v in links.items():
        print(f"  {key:20} {_describe_kernel(v)}")
    for h in health:
        print("  " + _daemon_line(h))
    return 1 if failing else 0


def _daemon_line(h: dict[str, Any]) -> str:
    tag = "ok" if h["alive"] else ("DEAD: link fails closed (drops all traffic)" if h.get("fail_closed", True)
                                   else "DEAD")
    where = f"{h['server']} " if h.get("server") else ""
    return (f"daemon {where}{h['node']}:{h['ifname']} ({h['realises']}) pid {h['pid']}: {tag}"
            + (f" - {h['state']}: {h['reason']}" if not h["alive"] else ""))


def _show_shaped(args: argparse.Namespace, out: dict[str, Any]) -> int:
    """``net show`` on a shape-mode server (testbed.cluster.shaper): its egress per destination DC."""
    failing = [h for h in out["impairment_health"] if not h["alive"]]
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 1 if failing else 0
    rec = out["state"]
    imp = rec.get("impairment") or {}
    print(f"shape mode: server {rec['server']} (DC {rec['shaping']['dc']}) of topology {rec.get('topology')}, "
          f"impairment backend {imp.get('backend', '?')}")
    from testbed.cluster.show import relays

    for key, v in out["links"].items():
        print(f"  {key:12} (to {v['to_server']}{relays(v)}) {_describe_kernel(v)}")
    if rec.get("containers"):  # the DC's container hosts (shape_hosts): `net exec --container NODE` enters one
        from . import docker_hosts

        running = set(docker_hosts.owned())
        print("  container hosts (host network): " + ", ".join(
            n + ("" if docker_hosts.container_name(n) in running else " (GONE)") for n in rec["containers"]))
    for h in out["impairment_health"]:
        print("  " + _daemon_line(h))
    return 1 if failing else 0


def _show_cluster(args: argparse.Namespace) -> int:
    """``net show --cluster FILE``: every server's part, asked over ssh at once, merged (testbed.cluster.show)."""
    from testbed.cluster.model import load as load_cluster
    from testbed.cluster.show import gather, merge

    cluster = load_cluster(args.cluster)
    merged = merge(gather(cluster))
    if args.json:
        print(json.dumps(merged, indent=2, default=str))
    else:
        from testbed.cluster.show import describe

        print("\n".join(describe(merged, cluster.launcher, _describe_kernel, _daemon_line)))
    return 0 if merged["ok"] else 1


def _describe_kernel(entry: dict[str, Any]) -> str:
    """One line: what the kernel (and the daemon) apply on one WAN direction right now."""
    sh = entry["tc"]["shape"]
    parts = [format_rate(sh["rate_bps"]) if sh.get("rate_bps") else "no rate"]
    src = entry.get("userspace", {}).get("shape") or sh
    if src.get("delay_s"):
        parts.append(f"delay {format_time(src['delay_s'])}")
    if src.get("jitter_s"):
        parts.append(f"jitter {format_time(src['jitter_s'])}" + (" (reorders)" if src.get("reorder") else ""))
    if src.get("loss_pct"):
        parts.append(f"loss {src['loss_pct']:g}%")
    if src.get("ge_p_pct"):
        parts.append(f"Gilbert-Elliott loss p {src['ge_p_pct']:.3g}% r {src['ge_r_pct']:.3g}% "
                     f"bad {src['ge_loss_bad_pct']:.3g}% good {src['ge_loss_good_pct']:.3g}%")
    for key in ("duplicate", "corrupt"):
        if src.get(f"{key}_pct"):
            parts.append(f"{key} {src[f'{key}_pct']:.3g}%")
    if src.get("distribution", "uniform") != "uniform" and src.get("jitter_s"):
        parts.append(f"distribution {src['distribution']}")
    if src.get("reorder_pct"):
        parts.append(f"reorder {src['reorder_pct']:.3g}% gap {src.get('reorder_gap', 1)}")
    limit, rate = sh.get("limit"), sh.get("rate_bps")
    if limit and rate:
        mtu = entry["link"].get("mtu") or DEFAULT_MTU
        parts.append(f"limit {limit} ({format_time(limit * (mtu + 14) * 8 / rate)} at the rate)")
    else:
        parts.append(f"limit {limit}")
    if entry["link"].get("mtu") not in (None, DEFAULT_MTU):
        parts.append(f"mtu {entry['link']['mtu']}")
    if not entry["link"]["admin_up"]:
        parts.append("DOWN")
    return ", ".join(parts)


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    ch: dict[str, Any] = {}
    if args.rate is not None:
        ch["rate_bps"] = parse_rate(args.rate, "--rate")
    if args.delay is not None:
        ch["delay_s"] = parse_time(args.delay, "--delay")
    if args.jitter is not None:
        ch["jitter_s"] = parse_time(args.jitter, "--jitter")
    if args.loss is not None:
        ch["loss_pct"] = parse_percent(args.loss, "--loss")
    if args.reorder is not None:
        ch["reorder"] = args.reorder
    if args.distribution is not None:
        ch["jitter_distribution"] = args.distribution
    elif ch.get("jitter_s") == 0:  # no jitter, nothing to distribute
        ch["jitter_distribution"] = "uniform"
    if args.reorder_probability is not None:
        ch["reorder_pct"] = parse_percent(args.reorder_probability, "--reorder-probability")
        if not ch["reorder_pct"]:
            ch["reorder_gap"] = 1
    if args.reorder_gap is not None:
        if args.reorder_gap < 1:
            raise ValidationError("--reorder-gap", f"must be >= 1, got {args.reorder_gap}", "e.g. --reorder-gap 5")
        ch["reorder_gap"] = args.reorder_gap
    if args.duplicate is not None:
        ch["duplicate_pct"] = parse_percent(args.duplicate, "--duplicate")
    if args.corrupt is not None:
        ch["corrupt_pct"] = parse_percent(args.corrupt, "--corrupt")
    if args.gilbert_elliott is not None:
        ch.update(_gilbert_elliott(args.gilbert_elliott))
    if args.limit is not None:
        if args.limit == "auto":
            ch["limit"] = None
        else:
            from traffic_control.units import parse_packets

            ch["limit"] = parse_packets(args.limit, "--limit")
    return ch


def _gilbert_elliott(text: str) -> dict[str, Any]:
    """``--gilbert-elliott P,R[,LOSS_BAD[,LOSS_GOOD]]`` or ``off`` -> LinkShape fields (``loss`` cleared: one model)."""
    if text.strip() == "off":
        return {"ge_p_pct": 0.0, "ge_r_pct": 0.0, "ge_loss_bad_pct": 100.0, "ge_loss_good_pct": 0.0}
    parts = [x.strip() for x in text.split(",")]
    if not 2 <= len(parts) <= 4:
        raise ValidationError("--gilbert-elliott", f"expected P,R[,LOSS_BAD[,LOSS_GOOD]], got {text!r}",
                              "e.g. --gilbert-elliott 1%,25% (or off)")
    names = ("p", "r", "loss_bad", "loss_good")
    vals = [parse_percent(v, f"--gilbert-elliott {n}") for n, v in zip(names, parts)]
    vals += [100.0, 0.0][len(vals) - 2:]
    return {"ge_p_pct": vals[0], "ge_r_pct": vals[1], "ge_loss_bad_pct": vals[2], "ge_loss_good_pct": vals[3],
            "loss_pct": 0.0}


def cmd_set(args: argparse.Namespace) -> int:
    changes = _changes(args)
    if not changes and args.state is None:
        raise ValidationError("net set", "nothing to change",
                              "give --rate, --delay, --jitter, --distribution, --loss, --gilbert-elliott, "
                              "--duplicate, --corrupt, --reorder/--no-reorder, --reorder-probability, --limit, "
                              "--down or --up")
    if changes.get("loss_pct") and "ge_p_pct" not in changes:  # one loss model: independent loss replaces bursts
        changes.update(_gilbert_elliott("off"))
    if getattr(args, "cluster", None):
        return _set_cluster(args, changes)
    net = EmulatedNetwork.attach(log=_say)
    dirs = [(args.a, args.b)] if args.one_way else [(args.a, args.b), (args.b, args.a)]
    new = {}
    for a, b in dirs:
        try:
            net.shape_of(a, b)
        except ValidationError as e:
            raise ValidationError("net set", e.problem, e.fix) from None
        try:
            new[(a, b)] = net.changed_shape(a, b, changes)
        except ValidationError as e:  # e.g. jitter above the delay
            raise as_flag_error(e) from None
    for (a, b), shape in new.items():  # every direction validated before the first is touched
        net.change_link(a, b, shape)
    if args.state is not None:
        net.set_link_up(args.a, args.b, args.state == "up")
    report = net.link_report()
    for a, b in dirs:
        print(f"{a}->{b}: {_describe_kernel(report[f'{a}->{b}'])}")
    return 0


def _set_shape(cluster: Any, args: argparse.Namespace, dirs: list[tuple[str, str]], changes: dict[str, Any]) -> int:
    """``net set --cluster`` in shape mode (testbed.cluster.shapeset): every path over the link recomposed."""
    from testbed.cluster.shapeset import apply_everywhere as shape_everywhere
    from testbed.cluster.show import relays

    try:
        out = shape_everywhere(cluster, dirs, changes, log=_say, state=args.state)
    except ValidationError as e:  # a shape field (its flag); a path it would break or a backend that cannot
        flag = bool(e.field) and "." not in (e.field or "") and "[" not in (e.field or "")  # give it: as named
        raise (as_flag_error(e) if flag else e) from None
    for server, links in out.items():
        for key, entry in sorted(links.items()):
            print(f"{key} ({server}{relays(entry)}): {_describe_kernel(entry)}")
    return 0


def as_flag_error(e: ValidationError) -> ValidationError:
    """A shape's validation error named by the ``net set`` flag that gave the field."""
    field = e.field or ""
    if not field:
        return ValidationError("net set", e.problem, e.fix)
    if " " in field:  # already names where (``net set a->b.gilbert_elliott``)
        return e
    return ValidationError(f"--{field.replace('_', '-')}", e.problem, e.fix)


def _set_cluster(args: argparse.Namespace, changes: dict[str, Any]) -> int:
    """``net set A B ... --cluster FILE``: the change checked on every server, then applied on every server
    (each shapes the directions leaving its DCs; the others resize their queues for a changed delay)."""
    from testbed.cluster.linkset import LinkChange, apply_everywhere
    from testbed.cluster.model import load as load_cluster

    cluster = load_cluster(args.cluster)
    dirs = [(args.a, args.b)] if args.one_way else [(args.a, args.b), (args.b, args.a)]
    if cluster.mode == "shape":
        return _set_shape(cluster, args, dirs, changes)
    change = LinkChange(tuple(dirs), changes, (args.a, args.b), args.state)
    try:
        out = apply_everywhere(cluster, change, log=_say)
    except ValidationError as e:  # a shape field refused on a server: named by its flag
        raise as_flag_error(e) from None
    for a, b in dirs:
        server, report = out.holder(a, b)
        print(f"{a}->{b} ({server}): {_describe_kernel(report)}")
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ValidationError("net exec", "no command given", "write: testbed net exec NODE -- COMMAND [ARGS...]")
    rec = state.read()
    from testbed.cluster import shaper

    shaped = shaper.read_state() if rec is None else None
    if shaped is not None:  # shape mode: the one node is this server itself (its own namespace)
        here = shaped.get("containers") or {}
        if args.container:  # or one of its DC's container hosts (shape_hosts), entered as a trainer is
            argv, env = _container_command(shaped["topology_spec"], here.get(args.node), args.node, cmd)
            sys.stdout.flush()
            sys.stderr.flush()
            if args.until_eof:
                return _run_until_eof(argv, env)
            os.execvpe(argv[0], argv, env)
        if args.node != shaped["server"]:
            raise ValidationError("net exec", f"this server is {shaped['server']!r} in shape mode: no node "
                                  f"{args.node!r}", f"use: testbed net exec {shaped['server']} -- COMMAND"
                                  + (f", or --container with one of {', '.join(here)}" if here else ""))
        sys.stdout.flush()
        sys.stderr.flush()
        if args.until_eof:
            return _run_until_eof(cmd, owned_env(args.node))
        os.execvpe(cmd[0], cmd, owned_env(args.node))
    if rec is None or not cleanup.owned_netns():
        _say("error: no testbed network is up (start one with `testbed net up TOPOLOGY`)")
        return 1
    if args.node not in rec["nodes"] and naming.netns_name(args.node) not in cleanup.owned_netns():
        # (a temporary node, e.g. a DC's cross-traffic endpoint made for a trial, is there while it lives)
        raise ValidationError("net exec", f"no node {args.node!r} in the running network",
                              "use one of: " + ", ".join(rec["nodes"]))
    if args.container:
        argv, env = _container_command(rec["topology"], rec["nodes"].get(args.node, {}).get("dc"), args.node, cmd)
        sys.stdout.flush()
        sys.stderr.flush()
        if args.until_eof:
            return _run_until_eof(argv, env)
        os.execvpe(argv[0], argv, env)
    procs = cgroups.procs_files(args.node)
    if procs:
        cgroups.join(procs)  # this process, and so the command it becomes, runs under the host's cpu/memory limits
    argv = exec_argv(args.node, cmd)
    env = owned_env(args.node)
    if rec.get("gpus") and args.node in rec["nodes"]:  # a process host sees its own GPUs only, as a trainer does
        dc = rec["nodes"][args.node]["dc"]
        if next((d.get("runtime", "process") for d in rec["topology"]["dcs"] if d["name"] == dc), "process") == "process":
            from .gpus import visible_devices

            env["CUDA_VISIBLE_DEVICES"] = visible_devices(tuple(rec["gpus"].get(args.node, ())))
    sys.stdout.flush()
    sys.stderr.flush()
    if args.until_eof:
        return _run_until_eof(argv, env)
    os.execvpe(argv[0], argv, env)
    return 127  # not reached


def _container_command(topo_spec: dict[str, Any], dc_name: str | None, node: str,
                       cmd: list[str]) -> tuple[list[str], dict[str, str]]:
    """``net exec --container``: argv and environment that run ``cmd`` in ``node``'s container (of DC
    ``dc_name``; None: not a node of this network) the way a trainer runs there (``docker_hosts.popen_in``);
    this process joins the container's cgroups first."""
    from topologies.model import from_dict

    from . import docker_hosts

    dc = from_dict(topo_spec).dc(dc_name) if dc_name is not None else None
    pid = docker_hosts.running_pid(node) if dc is not None and dc.runtime == "docker" else None
    if pid is None:
        raise ValidationError("net exec --container", f"{node} is not a container host of the running network "
                              "(runtime: docker hosts have one; routers and process hosts do not)",
                              "drop --container, or name a host of a runtime: docker DC")
    cgroups.join([Path(p) for p in docker_hosts.cgroup_procs(pid)])  # --cpus/--memory apply to the command
    env = docker_hosts.trainer_env(owned_env(node), docker_hosts.HostConfig.of(dc))
    return [*docker_hosts.trainer_prefix(pid), *cmd], env


#: After stdin closed: how long the command has to end on SIGTERM before its process group is killed.
EOF_GRACE_S = 3.0


def _run_until_eof(argv: list[str], env: dict[str, str]) -> int:
    """``net exec --until-eof``: run ``argv`` (its stdin /dev/null, its own process group) and end it when this
    process's stdin closes.  Over ssh, stdin is the session's channel: it closes when the launcher ends the
    command, when the launcher's ssh dies (a crash, SIGKILL) and when the connection drops, and in each case
    the command goes with it, where a command exec'd in place would run on, orphaned, on the server.
    The exit status is the command's (128 + N for signal N, as a shell reports it)."""
    import threading

    child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)

    def watch_stdin() -> None:
        try:
            while os.read(0, 65536):
                pass
        except OSError:
            pass
        if child.poll() is None:
            try:
                os.killpg(child.pid, signal.SIGTERM)
                child.wait(timeout=EOF_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    threading.Thread(target=watch_stdin, daemon=True).start()
    code = child.wait()
    return 128 - code if code < 0 else code


def cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify

    if args.cluster:
        return _verify_cluster(args)
    net = _build(args)
    with net:
        _say(f"network up in {net.timings['up_s']:.2f} s; measuring ...")
        if args.quick:  # the self-test every trial runs before training (testbed.network.selftest)
            from .selftest import quick_check

            st = quick_check(net, log=_say)
            checks = st.checks
            if st.error:
                _say(f"self-test could not run: {st.error}")
                return 1
        else:
            checks = verify(net, seconds=args.seconds, pings=args.pings, log=_say, delays=args.delays)
        impairment = net.impairment.to_dict() if net.impairment else None
    return _verify_result(args, net.topo.name, impairment, checks)


def _verify_result(args: argparse.Namespace, name: str, impairment: Any, checks: list[Any],
                   more: dict[str, Any] | None = None) -> int:
    """Print the checks (table or ``--json``); exit 1 when any failed."""
    from .verify import format_table

    failed = [c for c in checks if c.status == "fail"]
    if args.json:
        print(json.dumps({"topology": name, "impairment": impairment, **(more or {}),
                          "checks": [c.to_dict() for c in checks], "ok": not failed}, indent=2))
    else:
        print(format_table(checks))
        print(f"impairment: {impairment}")
        print("PASS" if not failed else f"FAIL: {len(failed)} measurement(s) out of tolerance")
    return 1 if failed else 0


def _selftest_error(st: Any) -> list[Any]:
    """A self-test that could not run, as a failed row (exit 1), never a silent pass."""
    from .verify import Check

    if not st.error:
        return []
    _say(f"self-test could not run: {st.error}")
    return [Check("selftest", "error", None, None, "", "runs to its end", "fail", {"error": st.error})]


def _verify_cluster(args: argparse.Namespace) -> int:
    """``net verify SPEC --cluster FILE``: up on every server, measure across them, down on every server."""
    from testbed.cluster import launch
    from testbed.cluster.capacity import for_build
    from testbed.cluster.model import load as load_cluster
    from testbed.cluster.placement import place
    from testbed.cluster.verify import verify as verify_cluster
    from testbed.cluster.view import ClusterNetwork

    topo = load(args.spec, scale=args.scale)
    cluster = for_build(topo, load_cluster(args.cluster), log=_say)  # cores, for an automatic placement
    if cluster.mode == "shape":
        return _verify_shape(args, topo, cluster)
    placement = place(topo, cluster)
    rep = launch.up(topo, cluster, impairment=args.impairment, allow_missing_netem=args.allow_missing_netem,
                    with_ps=not args.no_ps, seed=args.seed)
    try:
        _say(f"network up on {len(rep['servers'])} server(s) in {rep['up_s']:.2f} s; measuring ...")
        with ClusterNetwork.from_report(topo, cluster, placement, rep, with_ps=not args.no_ps) as view:
            if args.quick:  # the self-test a trial across servers runs before training
                from testbed.cluster.verify import self_test

                st = self_test(view, log=_say)
                checks = st.checks + _selftest_error(st)
            else:
                checks = verify_cluster(view, seconds=args.seconds, pings=args.pings, log=_say, delays=args.delays)
            impairment = view.impairment.to_dict()
    finally:
        _say("taking every server's part down ...")
        launch.down(cluster)
    return _verify_result(args, topo.name, impairment, checks,
                          {"placement": rep["placement"], "servers": rep["servers"]})


def _verify_shape(args: argparse.Namespace, topo: Any, cluster: Any) -> int:
    """``net verify --cluster`` in shape mode: shape every server, measure every DC pair from the servers
    themselves, clean every server."""
    from testbed.cluster import launch
    from testbed.cluster.shaping import ServerShaping
    from testbed.cluster.verify import verify_shape
    from testbed.cluster.view import ServerNetwork, clocks_of

    rep = launch.up(topo, cluster, impairment=args.impairment, allow_missing_netem=args.allow_missing_netem,
                    seed=args.seed)
    try:
        _say(f"every server shaped in {rep['up_s']:.2f} s; measuring ...")
        plans = {n: ServerShaping.from_dict(p) for n, p in rep["shaping"].items()}
        with ServerNetwork(topo, cluster, plans, clocks=clocks_of(rep)) as view:
            if args.quick:  # the self-test a trial in shape mode runs before training
                from testbed.cluster.verify import shape_self_test

                st = shape_self_test(view, rep, log=_say)
                checks = st.checks + _selftest_error(st)
            else:
                checks = verify_shape(view, rep, seconds=args.seconds, pings=args.pings, log=_say,
                                      delays=args.delays)
    finally:
        _say("cleaning every server ...")
        launch.down(cluster)
    backends = {n: r.get("impairment") for n, r in rep["servers"].items()}
    return _verify_result(args, topo.name, {"backend": backends, "mode": "shape"}, checks,
                          {"placement": rep["placement"], "servers": rep["servers"], "shaping": rep["shaping"]})


def cmd_cross(args: argparse.Namespace) -> int:
    """Background flows on the running network for a while; per-flow summary, records under --out."""
    import time

    from .cross_traffic import CrossTraffic, format_summary, load_cross_traffic

    duration = parse_time(args.duration, "--duration")
    if not duration > 0:
        raise ValidationError("--duration", f"must be positive, got {args.duration}", "e.g. --duration 30s")
    if not load_cross_traffic(args.file, None):  # the file's own mistakes first, network or not
        raise ValidationError(args.file, "no flows listed", "list at least one flow under cross_traffic:")
    rec = state.read()
    if rec is None or not cleanup.owned_netns():
        _say("error: no testbed network is up (start one with `testbed net up TOPOLOGY`)")
        return 1
    net = EmulatedNetwork.attach(log=_say)
    flows = load_cross_traffic(args.file, net.topo.dc_names)
    out = Path(args.out or f"cross-traffic/{time.strftime('%Y%m%d-%H%M%S')}")
    cross = CrossTraffic(net, flows, out, seed=args.seed, log=_say)
    longest = max(f.start_s + (f.duration_s or duration) for f in flows)
    cross.start()
    _say(f"cross traffic running for {format_time(min(duration, longest))} (Ctrl-C stops it early); records in {out}")
    try:
        time.sleep(min(duration, longest))
    except KeyboardInterrupt:
        _say("stopping")
    finally:
        summary = cross.stop()
    (out / "cross_traffic.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 1 if summary["errors"] else 0


def cmd_topo(args: argparse.Namespace) -> int:
    topo = load(args.spec, scale=args.scale)
    print(dump(topo, "json" if args.json else "yaml"))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from traffic_control.profiles import generate, to_csv

    topo = load(args.spec)
    spec: dict[str, Any] = {"profile": args.profile, "duration": args.duration}
    if args.profile == "netstorm":
        lo, sep, hi = str(args.range).partition(":")
        try:
            spec["range"] = [float(lo), float(hi)] if sep else None
        except ValueError:
            spec["range"] = None
        if spec["range"] is None:
            raise ValidationError("--range", f"bad range {args.range!r}", "write LOW:HIGH factors, e.g. 0.2:1.0")
        spec.update(every=args.every, seed=args.seed)
    else:
        spec.update(period=args.period, low=args.low, step=args.step, phase_per_link=args.phase_per_link)
    if args.links:
        spec["links"] = [x.strip() for x in args.links.split(",") if x.strip()]
    field = {"every": "--every", "range": "--range", "duration": "--duration", "period": "--period", "low": "--low",
             "step": "--step", "phase_per_link": "--phase-per-link", "links": "--links", "seed": "--seed"}
    try:
        events = generate(topo, spec, field="profile")
    except ValidationError as e:
        key = (e.field or "").split(".")[1] if (e.field or "").count(".") else ""
        raise ValidationError(field.get(key.split("[")[0], e.field or "profile"), e.problem, e.fix) from None
    text = to_csv(events, f"testbed profile {args.profile} for topology {topo.name}: "
                          + ", ".join(f"{k}={v}" for k, v in spec.items() if k != "profile"))
    return _emit(text, args.out, f"{len(events)} events over {events[-1].time_s:g} s")


def cmd_import_matrix(args: argparse.Namespace) -> int:
    from topologies.matrix import load_matrix

    topo, _ = load_matrix(args.csv, name=args.name, hosts=args.hosts, scale=args.scale)
    text = (f"# imported by `testbed import-matrix {args.csv}`: {len(topo.dcs)} DCs, {len(topo.links)} links\n"
            + dump(topo, "yaml"))
    return _emit(text, args.out, f"topology {topo.name} ({len(topo.dcs)} DCs, {len(topo.links)} links)")


def _emit(text: str, out: str | None, what: str) -> int:
    """A generated file: written to ``out`` (and said so on stderr) or printed on stdout."""
    if out:
        Path(out).write_text(text)
        _say(f"{what} written to {out}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    return cmd_down(args)


def register(sub: Any) -> None:
    net = sub.add_parser("net", help="bring an emulated network up/down, show, change, enter, verify it")
    nsub = net.add_subparsers(dest="net_cmd", required=True)
    up = nsub.add_parser("up", help="build the network of a topology; it stays up, delays included, until "
                                    "`net down` (or use --cli)")
    add_network_options(up)
    up.add_argument("--cli", action="store_true", help="open the Mininet CLI; the network is removed when it exits")
    up.add_argument("--dry-run", action="store_true",
                    help="print the plan and what up would run: namespace sysctls, GSO caps, tc commands, the "
                         "userspace backend's NFQUEUE rules and daemons or netem's jitter driver; create nothing")
    up.add_argument("--schedule", metavar="CSV",
                    help="play a link trace (time,link,rate,delay,jitter,loss,state) against the running network; "
                         "rates are spec rates (times the topology's scale); the command returns when it ends, "
                         "exit 1 if an event failed")
    up.add_argument("--cluster", metavar="FILE",
                    help="spread the DCs over the servers of this cluster file (README \"Several servers\"): each "
                         "server builds its DCs over ssh, WAN links between servers become VXLAN tunnels shaped as "
                         "on one machine (mode: emulate); or, with mode: shape, each server is one DC's host and "
                         "its own traffic to every other DC is shaped to the path between them (a runtime: docker "
                         "DC's hosts are containers on its server sharing its network)")
    up.add_argument("--json", action="store_true", help="with --cluster: print every server's report as JSON")
    up.set_defaults(func=cmd_up)
    down = nsub.add_parser("down", help="remove the network (everything named tb-*, testbed processes)")
    down.add_argument("--cluster", metavar="FILE", help="on every server of this cluster file, over ssh (remote ones "
                                                        "first); also after a crash of the launcher")
    down.set_defaults(func=cmd_down)
    show = nsub.add_parser("show", help="the running network as the kernel reports it: every WAN direction's "
                                        "tc state and interface state, the userspace daemons' health "
                                        "(exit 1 if one is dead)")
    show.add_argument("--json", action="store_true", help="print the report as JSON")
    show.add_argument("--cluster", metavar="FILE", help="the whole network across the servers of this cluster file: "
                                                        "every server asked over ssh, each WAN direction with the "
                                                        "server that shapes it (exit 1 if a server does not answer, "
                                                        "a direction is unreported or a daemon is dead)")
    show.set_defaults(func=cmd_show)
    st = nsub.add_parser("set", help="change a WAN link of the running network in place (no gap, any backend)",
                         description="Change both directions of link A-B (or only A->B with --one-way) on the "
                                     "running network, in place: `tc change` for netem and HTB, the daemon's "
                                     "shape for the userspace backend (started if the link had no delay). "
                                     "Fields not given keep their value. Rates are spec rates: they are "
                                     "multiplied by the topology's scale.")
    st.add_argument("a", help="DC at one end")
    st.add_argument("b", help="DC at the other end")
    st.add_argument("--rate", help="e.g. 50Mbit")
    st.add_argument("--delay", help="one-way delay, e.g. 30ms (0 removes it)")
    st.add_argument("--jitter", help="e.g. 2ms (at most the delay)")
    st.add_argument("--loss", help="e.g. 0.5%%")
    st.add_argument("--distribution", choices=("uniform", "normal", "pareto", "paretonormal"),
                    help="how the jitter is distributed (normal, pareto, paretonormal: jitter is the sd)")
    st.add_argument("--gilbert-elliott", metavar="P,R[,BAD[,GOOD]]",
                    help="bursty loss instead of --loss, e.g. 1%%,25%% (loss in the bad/good state default "
                         "100%%/0%%); off removes it")
    st.add_argument("--duplicate", help="packets sent twice, e.g. 1%% (netem backend only)")
    st.add_argument("--corrupt", help="packets with a bit flipped, e.g. 0.1%% (netem backend only)")
    st.add_argument("--reorder-probability", metavar="P",
                    help="share of candidate packets sent at once, overtaking the held ones, e.g. 25%% (0 removes it)")
    st.add_argument("--reorder-gap", type=int, metavar="N",
                    help="with --reorder-probability: every Nth packet is a candidate (default 1)")
    st.add_argument("--limit", metavar="PACKETS|auto",
                    help="queue limit in packets; auto: derived from the path's bandwidth x round trip again")
    rg = st.add_mutually_exclusive_group()
    rg.add_argument("--reorder", dest="reorder", action="store_const", const=True, default=None,
                    help="jittered packets may overtake each other")
    rg.add_argument("--no-reorder", dest="reorder", action="store_const", const=False,
                    help="jitter keeps packet order (the default)")
    sg = st.add_mutually_exclusive_group()
    sg.add_argument("--down", dest="state", action="store_const", const="down", help="take the link down")
    sg.add_argument("--up", dest="state", action="store_const", const="up", help="bring the link back up")
    st.add_argument("--one-way", action="store_true", help="change only the A->B direction")
    st.add_argument("--cluster", metavar="FILE",
                    help="the network is up across the servers of this cluster file. Emulate mode: the change is "
                         "checked on every server, then applied where each direction is shaped (a tunnelled "
                         "link's A->B on A's server); the others resize their queues for a changed delay. Shape "
                         "mode: every path over the link is recomposed, checked, then changed on its server "
                         "(--down/--up not there yet)")
    st.set_defaults(func=cmd_set, state=None)
    ex = nsub.add_parser("exec", help="run a command in a node of the running network (its namespace and cgroup)",
                         description="Run COMMAND inside NODE (e.g. east-h1): its network namespace, its cgroup "
                                     "(the DC's cpu: share), marked as a testbed process; on a process host of "
                                     "a topology with gpus:, CUDA_VISIBLE_DEVICES set to its own devices (none "
                                     "for a host without). stdin, stdout and stderr pass through; the exit "
                                     "status is the command's.")
    ex.add_argument("node", help="node name (`testbed net show` lists them), e.g. east-h1, east-r")
    ex.add_argument("--until-eof", action="store_true",
                    help="end COMMAND (SIGTERM, then SIGKILL after 3 s) when this process's stdin closes; its "
                         "own stdin is /dev/null. How the launcher runs commands on other servers over ssh: "
                         "they end with the launcher's connection, also when the launcher is killed")
    ex.add_argument("--container", action="store_true",
                    help="on a runtime: docker host, run COMMAND inside its container as a trainer runs: the "
                         "image's files (python3 is the image's), its PID namespace, the container's CPU and "
                         "memory limits, the spec's env (entered from the host as root: the testbed's trainers "
                         "drop every capability themselves, TESTBED_DROP_CAPS=1; another command keeps them). "
                         "Without it only the container's network namespace is joined and this machine's tools "
                         "run (probes, ping, iperf3). On a server of a shape-mode cluster, NODE is one of its "
                         "DC's container hosts (they share the server's network)")
    ex.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    ex.set_defaults(func=cmd_exec)
    ver = nsub.add_parser("verify", help="bring the network up, measure RTT and goodput over every link direction "
                                         "and RTT per DC pair, compare with the spec (exit 1 if out of "
                                         "tolerance), tear down")
    add_network_options(ver)
    ver.add_argument("--json", action="store_true", help="machine-readable result")
    ver.add_argument("--cluster", metavar="FILE",
                     help="bring the network up across the servers of this cluster file (as `net up --cluster`), "
                          "measure every link and DC pair across them (a tunnelled link against the same bars), "
                          "read each server's part back, take every part down; in shape mode every DC pair's RTT "
                          "and goodput each way from the servers themselves (README \"Several servers\")")
    ver.add_argument("--seconds", type=float, default=3.0, help="iperf3 duration per direction (default 3)")
    ver.add_argument("--pings", type=int, default=20, help="pings per RTT measurement (default 20)")
    ver.add_argument("--delays", action="store_true",
                     help="also per direction with delay, jitter or loss: a one-way UDP train router to router; "
                          "delay mean (0.5 ms + 5 %%), sd (20 %% + 1 ms), p99, loss (99 %% binomial interval), "
                          "reordering (README 'Jitter, defined'); a few seconds per direction")
    ver.add_argument("--quick", action="store_true",
                     help="only the self-test every trial runs before training: 5 pings per link and a "
                          "UDP packet train per direction (rate within 0.97-1.03 of the spec); seconds, "
                          "not minutes")
    ver.set_defaults(func=cmd_verify)
    cr = nsub.add_parser("cross", help="run background flows (constant, on/off, short flows) over the running "
                                       "network's WAN for a while and report what each got",
                         description="Start the flows of FILE (a YAML file with a cross_traffic: list, as in an "
                                     "experiment spec; README 'Cross traffic') on the network `net up` left "
                                     "running, from an extra endpoint per DC (<dc>-xt), for --duration; then print "
                                     "each flow's goodput while sending and its short flows' completion times. "
                                     "Records: samples/cross.jsonl and cross_traffic.json under --out. Meanwhile "
                                     "measure whatever you study from another shell (`testbed net exec`).")
    cr.add_argument("file", help="YAML file: cross_traffic: [{from: a, to: b, pattern: constant, rate: 20Mbit}, ...]")
    cr.add_argument("--duration", default="30s", help="how long to run (default 30s; flows may end sooner)")
    cr.add_argument("--out", default=None, help="records directory (default cross-traffic/<date-time>)")
    cr.add_argument("--seed", type=int, default=1, help="seed of the short flows' arrival times (default 1)")
    cr.add_argument("--json", action="store_true", help="print the summary as JSON")
    cr.set_defaults(func=cmd_cross)
    topo = sub.add_parser("topo", help="validate a topology and print it normalised (YAML, or --json)")
    topo.add_argument("spec")
    topo.add_argument("--scale", type=float, default=None)
    topo.add_argument("--json", action="store_true")
    topo.set_defaults(func=cmd_topo)
    clean = sub.add_parser("clean", help="remove every testbed object left on this machine (also after a crash)")
    clean.add_argument("--cluster", metavar="FILE", help="also on every server of this cluster file, over ssh")
    clean.set_defaults(func=cmd_clean)
    imp = sub.add_parser("import-matrix", help="a topology from a published latency/bandwidth matrix (CSV of region "
                         "pairs: a,b,rtt,rate,source), sources recorded in its description",
                         description="Each row is a WAN link between two regions (rtt: round trip; rate: empty for "
                         "unshaped; source: where the numbers come from, required). Regions become DCs (names "
                         "derived, the region kept as the label); pairs not in the matrix are relayed. Prints the "
                         "topology as YAML, or writes it with -o. Example: topologies/matrices/aws_seven_regions.csv.")
    imp.add_argument("csv", help="the matrix file")
    imp.add_argument("--name", default=None, help="topology name (default: the file's name)")
    imp.add_argument("--hosts", type=int, default=1, help="trainer hosts per DC (default 1)")
    imp.add_argument("--scale", type=float, default=1.0, help="multiply every rate (recorded; default 1)")
    imp.add_argument("-o", "--out", default=None, help="write the YAML here (default: stdout)")
    imp.set_defaults(func=cmd_import_matrix)
    prof = sub.add_parser("profile", help="write a time-varying WAN profile as a link schedule (CSV) for `net up "
                          "--schedule` or an experiment's schedule:",
                          description="Generate a link schedule from a few parameters, seeded and reproducible. "
                          "Rates are factors of each link direction's spec rate (before the topology's scale). An "
                          "experiment spec can name the same parameters instead of a file: schedule: {profile: "
                          "netstorm, every: 10s, range: [0.2, 1.0], duration: 10min, seed: 1}.")
    psub = prof.add_subparsers(dest="profile", required=True)
    ns = psub.add_parser("netstorm", help="every link direction's rate redrawn uniformly within a range, every N s")
    ns.add_argument("spec", help="topology (bundled name or file)")
    ns.add_argument("--every", required=True, help="redraw interval, e.g. 10s")
    ns.add_argument("--range", required=True, metavar="LOW:HIGH", help="factors of the spec rate, e.g. 0.2:1.0")
    ns.add_argument("--duration", required=True, help="how long, e.g. 10min")
    ns.add_argument("--seed", type=int, default=0, help="the draws' seed (default 0)")
    di = psub.add_parser("diurnal", help="every rate follows a compressed day: 1 at the peak, LOW at the trough")
    di.add_argument("spec", help="topology (bundled name or file)")
    di.add_argument("--period", required=True, help="one emulated day, e.g. 10min")
    di.add_argument("--low", required=True, type=float, help="rate factor at the trough, e.g. 0.3")
    di.add_argument("--step", required=True, help="update interval, e.g. 15s")
    di.add_argument("--duration", required=True, help="how long, e.g. 20min")
    di.add_argument("--phase-per-link", default="0s", help="each further link's day starts this much later")
    for p in (ns, di):
        p.add_argument("--links", default=None, help="comma-separated links to vary, 'a-b' (default: all)")
        p.add_argument("-o", "--out", default=None, help="write the CSV here (default: stdout)")
        p.set_defaults(func=cmd_profile)
