"""``testbed blp-plan``: plan a BLP all-reduce on a topology and compare it with the baselines.

    testbed blp-plan TOPOLOGY --size BYTES [--json] [--chunks K] [--mip]
                     [--scale F] [--out PLAN.json] [--check PLAN.json]

Prints the trees (root, edges, share, chunks), the predicted completion time
(bandwidth + latency/fill terms), the load of every link direction, and the
predicted time of every baseline on the same graph, cost model and chunk
count, with its ratio to BLP: the strong baselines ``ring_relay`` (best-order
leader ring, hops relayed over widest paths), ``tree_best`` (best single
spanning tree x root), ``blink`` (BLP's LP without its latency term),
``hierarchical`` (DC reduce, leader ring, DC broadcast) and ``star`` (a
parameter-server shard per DC), then the references ``ring_best`` (gloo-style
leader ring, best order) and ``ring`` (the flat gloo ring over all ranks).
``--json`` puts them under ``baselines`` (each with ``time_s``, its terms,
``detail``, ``executor`` and its trees or ring routes).  All times are WAN
only, TCP/IP header overhead included (see ``testbed.planning.model``).  ``--out`` writes the plan JSON the executor reads;
``--check`` validates an existing plan file against the topology and reports
its predicted time there instead of planning.  Bad input (unknown topology,
disconnected graph, size <= 0, a plan naming links the topology lacks) prints
the field and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from traffic_control.errors import ValidationError
from traffic_control.files import write_atomic
from traffic_control.units import format_rate, parse_size

from .baselines import SchemeCost, baselines
from .model import Plan, cached_path, check_size, evaluate, route_mismatches, validate_plan


def register(subparsers: Any) -> None:
    """Add the ``blp-plan`` subcommand (CLI plug-in contract of docs/CONTRACTS.md)."""
    p = subparsers.add_parser(
        "blp-plan", help="plan BLP aggregation trees for a topology and compare with the baselines' predictions",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topology", help="bundled topology name or a YAML/JSON/.py file")
    p.add_argument("--size", required=True, help="gradient size: bytes, or with a unit (100MB, 64MiB)")
    p.add_argument("--json", action="store_true", help="print the plan and baselines as JSON")
    p.add_argument("--chunks", type=int, default=None,
                   help="pipeline chunks of the whole gradient (default: about 256 KiB each)")
    p.add_argument("--mip", action="store_true", help="integer chunk counts per tree (scipy milp) instead of the LP")
    p.add_argument("--scale", type=float, default=None, help="multiply every WAN rate by this factor")
    p.add_argument("--out", type=Path, default=None, help="write the plan JSON here (input of the executor)")
    p.add_argument("--check", type=Path, default=None, metavar="PLAN",
                   help="validate this plan file against the topology and predict its time instead of planning")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ValidationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    import topologies  # the CLI is the only place that needs the topology model

    size = check_size(parse_size(args.size, "size"), "size")
    if args.chunks is not None and args.chunks < 1:
        raise ValidationError("chunks", f"chunk count must be >= 1, got {args.chunks}", "give e.g. --chunks 64")
    topo = topologies.load(args.topology, scale=args.scale)
    graph = topo.dc_graph()
    path = cached_path(topo.path)
    if args.check is not None:
        try:
            text = args.check.read_text()
        except OSError as e:
            raise ValidationError("plan", f"cannot read {args.check}: {e.strerror}", "give an existing plan file") from e
        plan = Plan.from_json(text, "plan")
        validate_plan(plan, graph)
        plan = Plan(plan.dcs, size, plan.trees, plan.chunks, plan.solver, evaluate(graph, plan.trees, size, path),
                    plan.notes + (f"checked against {topo.name}",))
    else:
        from .solver import (
            plan_blp,  # scipy: imported when a plan is solved, not by every `testbed` command
        )

        plan = plan_blp(graph, size, chunks=args.chunks, mip=args.mip, path=path)
    validate_plan(plan, graph)
    base = baselines(graph, size, path=path, chunks=plan.chunks)
    warnings = route_mismatches(plan, path)
    if args.out is not None:
        write_atomic(args.out, plan.to_json() + "\n")
    if args.json:
        print(json.dumps({"topology": topo.name, "plan": plan.to_dict(),
                          "baselines": {k: v.to_dict() for k, v in base.items()},
                          "route_warnings": warnings}, indent=2))
    else:
        print(render(topo.name, plan, base, warnings))
        if args.out is not None:
            print(f"\nplan written to {args.out}")
    return 0


def _bytes(n: float) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.3g} {unit}"
    return f"{n:.0f} B"


def _secs(t: float) -> str:
    return f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.3f} s"


def render(name: str, plan: Plan, base: dict[str, SchemeCost], warnings: list[str] | None = None) -> str:
    """Human-readable report (what ``testbed blp-plan`` prints without --json)."""
    c = plan.cost
    lines = [f"BLP plan for {name}: {len(plan.dcs)} DCs, gradient {_bytes(plan.size_bytes)} "
             f"({plan.size_bytes} bytes), {plan.chunks} chunks of {_bytes(plan.size_bytes / plan.chunks)}, "
             f"solver {plan.solver}"]
    lines += [f"  {n}" for n in plan.notes]
    lines.append("")
    width = max([10, *(len(t.label()) + 2 for t in plan.trees)])
    lines.append(f"  {'tree':<5}{'root':<{width}}{'share':>8}{'chunks':>8}  {'latency':>10}  edges (child->parent)")
    for i, (t, lat) in enumerate(zip(plan.trees, c.tree_latency_s)):
        edges = ", ".join(f"{a}->{b}" for a, b in t.edges) or "-"
        lines.append(f"  {i:<5}{t.label():<{width}}{t.share * 100:>7.1f}%{t.chunks:>8}  {_secs(lat):>10}  {edges}")
    if any(t.pair for t in plan.trees):
        lines.append("  (a<>b: rooted at the link a-b; both ends exchange their sides' partial sums over it)")
    lines.append("")
    lines.append(f"  predicted: {_secs(c.time_s)} = bandwidth {_secs(c.bandwidth_time_s)}"
                 f" + latency/pipeline fill {_secs(c.latency_time_s)}")
    lines.append("")
    lines.append(f"  {'link':<22}{'rate':>12}{'bytes':>12}{'busy':>12}")
    bott = c.bottleneck
    for ll in sorted(c.links, key=lambda ll: (-ll.time_s, ll.src, ll.dst)):
        mark = "  <- bottleneck" if bott is not None and ll.time_s > 0 and ll.time_s >= bott.time_s - 1e-12 else ""
        lines.append(f"  {ll.src + '->' + ll.dst:<22}{format_rate(ll.rate_bps):>12}{_bytes(ll.bytes):>12}"
                     f"{_secs(ll.time_s):>12}{mark}")
    lines.append("")
    lines.append(f"  {'scheme':<14}{'predicted':>12}{'vs BLP':>9}  model")
    lines.append(f"  {'blp':<14}{_secs(c.time_s):>12}{1.0:>9.2f}  {len(plan.trees)} tree(s), solver {plan.solver}")
    for k, s in base.items():
        ratio = s.time_s / c.time_s if c.time_s > 0 else float("inf")
        lines.append(f"  {k:<14}{_secs(s.time_s):>12}{ratio:>9.2f}  {s.detail}")
    if base:
        best = min(base.values(), key=lambda s: s.time_s)
        verdict = "BLP is not above it" if c.time_s <= best.time_s * (1 + 1e-9) else "BLP is SLOWER"
        lines.append(f"  best baseline: {best.name} ({_secs(best.time_s)}; {verdict}, "
                     f"BLP / best = {c.time_s / best.time_s if best.time_s > 0 else float('inf'):.3f})")
    for w in warnings or []:
        lines.append(f"  note: {w}")
    return "\n".join(lines)
