"""``testbed cluster place | check``: a topology spread over several servers (README "Several servers")."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def cmd_place(args: argparse.Namespace) -> int:
    from topologies.loader import load as load_topology

    from .model import load
    from .placement import place

    cluster = load(args.cluster)
    topo = load_topology(args.topology)
    if cluster.mode == "shape":
        return _place_shape(topo, cluster, args.json)
    if args.measure:
        from .capacity import measured

        cluster = measured(cluster, log=lambda m: print(m, file=sys.stderr))
    p = place(topo, cluster)
    if args.json:
        print(json.dumps({"topology": topo.name, "mode": cluster.mode, **p.to_dict()}, indent=2))
        return 0
    how = "automatic" + ("" if p.optimal else f" (best of {p.searched} tried, not proven optimal)") \
        if p.automatic else "given"
    print(f"{topo.name} on {len(cluster.servers)} server(s), mode {cluster.mode}, placement {how}:")
    width = max(len(s) for s in cluster.names)
    for s in cluster.servers:
        dcs = p.dcs_on(s.name)
        room = "" if s.max_hosts is None else f" of {s.max_hosts}"
        gpus = "" if not p.gpus.get(s.name) else f", {p.gpus[s.name]} GPUs"
        mark = " (launcher)" if s.name == cluster.launcher else ""
        cores = f" on {p.cpus[s.name]} cores" if s.name in p.cpus else ""
        if s.name in p.free and p.free[s.name] < p.cpus[s.name]:
            cores += f" ({p.free[s.name]:g} free of other jobs)"
        print(f"  {s.name:<{width}}  {p.loads[s.name]:>3}{room} nodes{cores}{gpus}: {', '.join(dcs) or '-'}{mark}")
    if p.cut:
        print(f"  WAN links between servers (tunnels): {', '.join(f'{a}-{b}' for a, b in p.cut)} "
              f"({p.cut_rate_bps / 1e6:.0f} Mbit/s both ways in all)")
    else:
        print("  no WAN link crosses servers")
    if p.automatic and not p.cpus:
        print("  balanced in nodes: not every server's cores are known (servers[].cpus, or --measure asks them; "
              "net up, verify and run measure them)")
    return 0


def _place_shape(topo: Any, cluster: Any, as_json: bool) -> int:
    """``cluster place`` in shape mode: which server is which DC, and every shaped path."""
    from . import shaping

    plans = shaping.plan(topo, cluster)
    if as_json:
        print(json.dumps({"topology": topo.name, "mode": "shape",
                          "servers": {n: p.to_dict() for n, p in plans.items()}}, indent=2))
        return 0
    print(f"{topo.name} on {len(cluster.servers)} server(s), mode shape (each server is one DC's host):")
    for line in shaping.describe(plans):
        print(f"  {line}")
    idle = [s.name for s in cluster.servers if s.name not in plans]
    if idle:
        print(f"  not used: {', '.join(idle)}")
    return 0


def _check_server(cluster: Any, server: Any, samples: int) -> dict[str, Any]:
    from .clock import measure
    from .launch import checkout_of, code_state
    from .remote import Remote, RemoteError

    row: dict[str, Any] = {"server": server.name, "address": server.address, "ok": False}
    with Remote(server, cluster) as r:
        try:
            probe = r.run(["sh", "-c", f'id -u; {server.python} -c "import sys; print(sys.version.split()[0])"'],
                          timeout=60)
            uid, py = (probe.stdout.split() + ["", ""])[:2]
            checkout, exists, commit = checkout_of(r)
            row.update(uid=int(uid) if uid.isdigit() else None, python=py, checkout=checkout,
                       has_checkout=exists, commit=commit)
            off = measure(r, samples=samples)
            row.update(clock=off.to_dict(), ok=True)
            problems = []
            if row["uid"] != 0:
                problems.append(f"logs in as uid {row['uid']}, not root (the testbed needs root there)")
            if not row["has_checkout"]:
                problems.append(f"no testbed checkout at {checkout} (clone it there, or set checkout:)")
            ours = (code_state().get("git") or {}).get("commit")
            if row["has_checkout"] and ours and row["commit"] != ours:
                problems.append(f"its checkout is at commit {str(row['commit'])[:12]}, the launcher's at {ours[:12]} "
                                "(check out the same commit: `net up --cluster` refuses otherwise)")
            row["problems"] = problems
        except RemoteError as e:
            row["error"] = str(e)
    return row


def cmd_check(args: argparse.Namespace) -> int:
    from .model import load

    cluster = load(args.cluster)
    rows = []
    for s in cluster.servers:
        if s.name == cluster.launcher:
            rows.append({"server": s.name, "address": s.address, "ok": True, "launcher": True, "uid": os.geteuid(),
                         "python": sys.version.split()[0], "checkout": str(REPO), "has_checkout": True,
                         "clock": {"server": s.name, "offset_ns": 0, "bound_ns": 0, "rtt_ns": 0, "samples": 0},
                         "problems": []})
            continue
        print(f"cluster: checking {s.name} ({s.target}:{s.port})", file=sys.stderr, flush=True)
        rows.append(_check_server(cluster, s, args.samples))
    bad = [r for r in rows if not r["ok"] or r.get("problems")]
    if args.json:
        print(json.dumps({"servers": rows, "ok": not bad}, indent=2))
    else:
        for r in rows:
            if not r["ok"]:
                print(f"  {r['server']:<12} FAILED  {r['error']}")
                continue
            c = r["clock"]
            where = "launcher (this machine)" if r.get("launcher") else \
                f"clock {c['offset_ns'] / 1e6:+.3f} ms +- {c['bound_ns'] / 1e6:.3f} ms"
            print(f"  {r['server']:<12} ok      python {r['python']}, uid {r['uid']}, {where}")
            for p in r.get("problems", []):
                print(f"  {'':<12} problem {p}")
    return 1 if bad else 0


def cmd_part_up(args: argparse.Namespace) -> int:
    """Run by the launcher over ssh: build this server's part (JSON on stdin), leave it up, report JSON."""
    from topologies.model import from_dict as topology

    from ..network.emulation import EmulatedNetwork
    from .launch import check_same_code, part_report
    from .tunnel import Part

    req = json.loads(sys.stdin.read())
    check_same_code(req.get("code"))
    shared = [Path(d) for d in req.get("shared_dirs", [])]  # a container host's view of the trials' scratch
    for d in shared:
        d.mkdir(parents=True, exist_ok=True)
    net = EmulatedNetwork(topology(req["topology"]), impairment=req["impairment"],
                          allow_missing_netem=req["allow_missing_netem"], with_ps=req["with_ps"], seed=req["seed"],
                          log=lambda m: print(m, file=sys.stderr, flush=True), part=Part.from_dict(req["part"]),
                          shared_dirs=shared)
    net.start()
    net.stop_watching()
    print(json.dumps(part_report(net)))
    return 0


def cmd_shape_up(args: argparse.Namespace) -> int:
    """Run by the launcher over ssh in shape mode: shape this server's egress (JSON on stdin), report JSON."""
    from topologies.model import from_dict as topology

    from .launch import check_same_code
    from .shaper import up
    from .shaping import ServerShaping

    req = json.loads(sys.stdin.read())
    check_same_code(req.get("code"))
    shared = [Path(d) for d in req.get("shared_dirs", [])]  # a container host's view of the trials' scratch
    for d in shared:
        d.mkdir(parents=True, exist_ok=True)
    rep = up(topology(req["topology"]), ServerShaping.from_dict(req["shaping"]), impairment=req["impairment"],
             allow_missing_netem=req["allow_missing_netem"], seed=req["seed"],
             log=lambda m: print(m, file=sys.stderr, flush=True), shared_dirs=shared)
    print(json.dumps(rep))
    return 0


def cmd_shape_set(args: argparse.Namespace) -> int:
    """Run by ``net set --cluster`` and trials' link schedules over ssh in shape mode: this server's paths get
    new shapes and cuts (JSON on stdin), one JSON answer out."""
    from .linkset import serve_requests
    from .shapeset import serve_change

    if args.serve:
        return serve_requests(serve_change)
    print(json.dumps(serve_change(json.loads(sys.stdin.read())), default=str))
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    """Run by a trial across servers over ssh: sample this server into OUT/samples/*-SERVER.jsonl until stdin
    closes (:mod:`.sampling`)."""
    from .sampling import serve

    return serve(args.out, args.server, args.t0_ns, args.rate_hz, links=args.links, tcp=args.tcp, procs=args.procs)


def cmd_part_set(args: argparse.Namespace) -> int:
    """Run by ``net set --cluster`` and trials' link schedules over ssh: this server's share of a link change
    (JSON on stdin), one JSON line out (:mod:`.linkset`)."""
    from .linkset import part_set, serve

    if args.serve:
        return serve()
    print(json.dumps(part_set(json.loads(sys.stdin.read())), default=str))
    return 0


def cmd_part_endpoint(args: argparse.Namespace) -> int:
    """Run by a trial's cross traffic over ssh: add or remove a temporary node on one of this server's DCs."""
    from ..network.emulation import EmulatedNetwork
    from ..network.endpoints import remove_endpoint

    if args.action == "add":
        EmulatedNetwork.attach().add_endpoint(args.dc, args.name, args.host_octet, args.ovs_port,
                                              as_host=args.as_host)
    else:
        remove_endpoint(args.name, args.ovs_port)
    return 0


def cmd_part_check(args: argparse.Namespace) -> int:
    """Run by ``net verify --cluster`` over ssh: this server's read-back checks of its part, JSON on stdout."""
    from .verify import part_check_json

    print(part_check_json())
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("cluster", help="spread a topology over several servers: placement, SSH reachability, clocks",
                       description="A cluster file names the servers (address, SSH user, GPUs, max_hosts) and the "
                                   "placement of DCs on them (given, or auto: balance emulated nodes, keep each DC "
                                   "on one server, cut few WAN links). Servers are reached by ssh only. Bring a "
                                   "network up across them with `testbed net up TOPOLOGY --cluster FILE`, measure "
                                   "it with `testbed net verify TOPOLOGY --cluster FILE`, run trials with "
                                   "`testbed run SPEC --cluster FILE` (README \"Several servers\").")
    csub = p.add_subparsers(dest="cluster_cmd", required=True)
    pl = csub.add_parser("place", help="show which server holds which DC, each server's load and the WAN links "
                                      "that cross servers (nothing is contacted unless --measure)")
    pl.add_argument("topology", help="bundled topology name or file")
    pl.add_argument("--cluster", required=True, help="the cluster file (YAML/JSON: servers:, placement:, mode:)")
    pl.add_argument("--json", action="store_true", help="print the placement as JSON")
    pl.add_argument("--measure", action="store_true", help="ask every server whose cpus: the file leaves out for "
                                                           "its cores and how busy other jobs keep them (1 s of "
                                                           "/proc/stat, over ssh, as net up does), and balance "
                                                           "nodes per free core")
    pl.set_defaults(func=cmd_place)
    ck = csub.add_parser("check", help="reach every server over ssh: login, root, Python, the testbed's checkout, "
                                      "and its clock offset from this machine (exit 1 when a server fails)")
    ck.add_argument("cluster", help="the cluster file")
    ck.add_argument("--samples", type=int, default=64, help="clock exchanges per server (the shortest round trip "
                                                          "is kept; default 64)")
    ck.add_argument("--json", action="store_true", help="print the results as JSON")
    ck.set_defaults(func=cmd_check)
    pu = csub.add_parser("part-up", help="(run by `net up --cluster` over ssh) build this server's part of a "
                                         "network from JSON on stdin")
    pu.set_defaults(func=cmd_part_up)
    su = csub.add_parser("shape-up", help="(run by `net up --cluster` over ssh, shape mode) shape this server's "
                                         "egress to the other DCs from JSON on stdin")
    su.set_defaults(func=cmd_shape_up)
    ss = csub.add_parser("shape-set", help="(run by `net set --cluster` over ssh, shape mode) change this "
                                          "server's path shapes from JSON on stdin")
    ss.add_argument("--serve", action="store_true", help="answer one JSON request per stdin line until EOF (a "
                                                           "trial's link schedule)")
    ss.set_defaults(func=cmd_shape_set)
    sa = csub.add_parser("sample", help="(run by a trial across servers over ssh) sample this server's links, "
                                        "TCP connections, trainers and CPU saturation until stdin closes")
    sa.add_argument("--out", required=True, help="the trial's scratch directory on this server")
    sa.add_argument("--server", required=True, help="this server's name (the file's name)")
    sa.add_argument("--t0-ns", type=int, required=True, help="the trial's t0 on this server's clock")
    sa.add_argument("--rate-hz", type=float, default=10.0, help="samples per second")
    sa.add_argument("--links", action="store_true", help="sample this server's shaped interfaces")
    sa.add_argument("--tcp", action="store_true", help="sample its trainers' TCP connections")
    sa.add_argument("--procs", action="store_true", help="sample its trainers' CPU and memory")
    sa.set_defaults(func=cmd_sample)
    ps = csub.add_parser("part-set", help="(run by `net set --cluster` and link schedules over ssh) apply this "
                                          "server's share of a link change from JSON on stdin")
    ps.add_argument("--serve", action="store_true", help="answer one JSON request per stdin line until EOF (a "
                                                           "trial's link schedule)")
    ps.set_defaults(func=cmd_part_set)
    pe = csub.add_parser("part-endpoint", help="(run by a trial's cross traffic over ssh) add or remove a "
                                               "temporary node on one of this server's DCs")
    pesub = pe.add_subparsers(dest="action", required=True)
    pa = pesub.add_parser("add", help="add NAME on DC's LAN at host part HOST_OCTET")
    pa.add_argument("dc")
    pa.add_argument("name")
    pa.add_argument("host_octet", type=int)
    pa.add_argument("ovs_port", type=int)
    pa.add_argument("--as-host", action="store_true", help="shape its link as a host's (the LAN's MTU and shape)")
    pr = pesub.add_parser("remove", help="remove NAME (its processes, its namespace)")
    pr.add_argument("name")
    pr.add_argument("ovs_port", type=int)
    pe.set_defaults(func=cmd_part_endpoint)
    pc = csub.add_parser("part-check", help="(run by `net verify --cluster` over ssh) read this server's part back: "
                                            "daemons alive, wire-sized packets, queue limits; JSON")
    pc.set_defaults(func=cmd_part_check)
