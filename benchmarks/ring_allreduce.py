#!/usr/bin/env python3
"""Ring all-reduce over shaped WAN links against its bandwidth-optimal time, 2(n-1)/n x S / B.

One rank per DC, DCs joined in a ring of equal links (rate B, no delay), so
every ring hop crosses exactly one WAN link.  gloo's ``dist.all_reduce``
(ring) on S bytes; the median of several iterations is compared with the
bandwidth-optimal time, using the TCP payload rate B x 1448/1514 as B (what a
link can carry of payload).  Prints measured, optimal and optimal/measured
(bar: >= 0.85).  Needs root.

    sudo .venv/bin/python benchmarks/ring_allreduce.py --dcs 2 --rate 100Mbit --size 20MB
    sudo .venv/bin/python benchmarks/ring_allreduce.py --dcs 3 --rate 100Mbit --size 20MB
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def worker(cfg_path: str, rank: int) -> int:
    import torch
    import torch.distributed as dist

    cfg = json.loads(open(cfg_path).read())  # noqa: SIM115
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
    dist.init_process_group("gloo", init_method=f"tcp://{cfg['master']}:29556", rank=rank,
                            world_size=cfg["world"], timeout=timedelta(seconds=300))
    buf = torch.ones(cfg["size"] // 4)
    times = []
    ring = list(range(cfg["world"]))
    if cfg.get("impl") == "p2p":
        from testbed.training.collectives import ring_allreduce

        def allreduce(b: torch.Tensor) -> None:
            ring_allreduce(b, ring)
    else:
        def allreduce(b: torch.Tensor) -> None:
            dist.all_reduce(b)
    for i in range(cfg["iters"] + 1):
        dist.barrier()
        t0 = time.perf_counter()
        allreduce(buf)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if i:
            times.append(float(dt))
    if rank == 0:
        with open(cfg["out"], "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dcs", type=int, default=2)
    ap.add_argument("--rate", default="100Mbit")
    ap.add_argument("--size", default="20MB")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--impl", choices=("gloo", "p2p"), default="gloo",
                    help="gloo's own all_reduce, or the testbed's point-to-point ring (what the schemes use)")
    ap.add_argument("--delay", default="0ms", help="one-way delay per link (netem, or the userspace backend)")
    ap.add_argument("--worker", nargs=2, metavar=("CFG", "RANK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker[0], int(args.worker[1]))
    import tempfile

    from testbed.network.emulation import EmulatedNetwork
    from testbed.network.measure import TCP_PAYLOAD_FRACTION
    from topologies import from_dict
    from traffic_control.units import parse_rate, parse_size

    rate, size, n = parse_rate(args.rate), parse_size(args.size), args.dcs
    names = [f"d{i}" for i in range(n)]
    links = [{"a": names[i], "b": names[(i + 1) % n], "rate": rate, "delay": args.delay}
             for i in range(n if n > 2 else 1)]
    topo = from_dict({"name": f"ring{n}", "dcs": [{"name": d, "hosts": 1} for d in names], "links": links})
    tmp = tempfile.mkdtemp(prefix="ringbench-")
    with EmulatedNetwork(topo, impairment="auto", allow_missing_netem=True, with_ps=False) as net:
        hosts = [net.plan.nodes[f"{d}-h1"] for d in names]
        cfg = {"master": hosts[0].ip, "world": n, "size": size, "iters": args.iters, "out": f"{tmp}/times.json",
               "impl": args.impl}
        with open(f"{tmp}/cfg.json", "w") as f:
            json.dump(cfg, f)
        procs = [net.popen(h.name, [sys.executable, __file__, "--worker", f"{tmp}/cfg.json", str(r)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r, h in enumerate(hosts)]
        outs = [p.communicate(timeout=900)[0] for p in procs]
        if any(p.returncode for p in procs):
            print("\n".join(o[-1500:] for o in outs))
            return 1
    with open(f"{tmp}/times.json") as f:
        times = json.load(f)
    med = statistics.median(times)
    optimal = 2 * (n - 1) / n * size * 8 / (rate * TCP_PAYLOAD_FRACTION)
    print(f"ring all-reduce ({args.impl}), {n} ranks in {n} DCs, {size / 1e6:g} MB over {args.rate} links, "
          f"{args.delay} one-way delay (bandwidth term only in the optimum)")
    print(f"measured median {med:.3f} s (runs: {', '.join(f'{t:.3f}' for t in times)}), "
          f"bandwidth-optimal {optimal:.3f} s, optimal/measured = {optimal / med:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
