#!/usr/bin/env python3
"""BLP vs ring all-reduce on the emulated network: measured times, predictions, ratios, side by side.

Brings up the topology (rates and delays as in the spec: netem, or the
userspace backend where the kernel lacks netem), starts one gloo rank per
trainer host, and times the BLP executor and ``dist.all_reduce`` (gloo ring)
on the same tensor in the same run.  Prints measured / predicted for both
(bar: BLP <= 1.15) and BLP / ring (bar: <= 0.75 on the heterogeneous
topologies).  Needs root.

    sudo .venv/bin/python benchmarks/blp_vs_ring.py three_dc_triangle --size 8MB
    sudo .venv/bin/python benchmarks/blp_vs_ring.py geo_wan --size 4MB
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from testbed.network.emulation import EmulatedNetwork  # noqa: E402
from testbed.planning import baselines, plan_blp  # noqa: E402
from testbed.planning.baselines import intra_dc_time  # noqa: E402
from topologies import load  # noqa: E402
from traffic_control.units import parse_size  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("topology")
    ap.add_argument("--size", default="8MB")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--impairment", default="auto")
    ap.add_argument("--scale", type=float, default=None)
    args = ap.parse_args()
    topo = load(args.topology, scale=args.scale)
    size = parse_size(args.size)
    graph = topo.dc_graph()
    plan = plan_blp(graph, size, path=topo.path)
    base = baselines(graph, size, path=topo.path)
    with EmulatedNetwork(topo, impairment=args.impairment, allow_missing_netem=True, with_ps=False) as net:
        hosts = [n for n in net.plan.nodes.values() if n.role == "host"]
        tmp = Path(tempfile.mkdtemp(prefix="blpbench-"))
        cfg = {"master": hosts[0].ip, "port": 29555, "world": len(hosts), "plan": json.loads(plan.to_json()),
               "dc_of_rank": {str(r): h.dc for r, h in enumerate(hosts)}, "iters": args.iters,
               "ring_predicted_s": base["ring"].time_s, "out": str(tmp / "result.json"),
               "blp_predicted_s": plan.predicted_time_s + intra_dc_time(graph, size)}
        (tmp / "cfg.json").write_text(json.dumps(cfg))
        worker = str(Path(__file__).with_name("blp_worker.py"))
        procs = [net.popen(h.name, [sys.executable, worker, str(tmp / "cfg.json"), str(r)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r, h in enumerate(hosts)]
        outs = [p.communicate(timeout=900)[0] for p in procs]
        if any(p.returncode for p in procs):
            for o in outs:
                print(o[-2000:])
            return 1
        res = json.loads((tmp / "result.json").read_text())
        imp = net.impairment.backend if net.impairment else "?"
    print(f"{topo.name} (scale {topo.scale:g}), {len(hosts)} ranks, {size / 1e6:g} MB, impairment {imp}")
    print(f"{'scheme':8} {'measured s':>11} {'predicted s':>12} {'meas/pred':>10}")
    for k in ("blp", "ring"):
        r = res[k]
        print(f"{k:8} {r['median_s']:11.3f} {r['predicted_s']:12.3f} {r['measured_over_predicted']:10.3f}")
    print(f"BLP / ring (measured) = {res['blp_over_ring']:.3f}")
    print(f"(BLP prediction = plan {plan.predicted_time_s:.3f} s over the WAN + "
          f"{intra_dc_time(graph, size):.3f} s of intra-DC reduce/broadcast)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
