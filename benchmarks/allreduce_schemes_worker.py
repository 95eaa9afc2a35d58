"""One rank of benchmarks/allreduce_schemes.py, started by it inside a Mininet host."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from testbed.planning import Plan  # noqa: E402
from testbed.planning.bench import compare  # noqa: E402
from testbed.planning.executor import make_dc_groups  # noqa: E402


def main() -> int:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    rank = int(sys.argv[2])
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
    dist.init_process_group("gloo", init_method=f"tcp://{cfg['master']}:{cfg['port']}", rank=rank,
                            world_size=cfg["world"], timeout=timedelta(seconds=300))
    plan = Plan.from_json(json.dumps(cfg["plan"]))
    dc_of_rank = {int(k): v for k, v in cfg["dc_of_rank"].items()}
    # intra-DC phases as gloo collectives on per-DC groups (point-to-point send/recv stalls
    # in ~40 ms steps on these links; see testbed/training/collectives.py)
    groups = make_dc_groups(dc_of_rank)
    res = compare(plan, rank, dc_of_rank, iters=cfg["iters"], warmup=cfg.get("warmup", 1), group_of_dc=groups,
                  schemes=cfg["schemes"], predicted={"blp": cfg["blp_predicted_s"]}, out=None)
    if rank == 0:
        with open(cfg["out"], "w") as f:
            json.dump(res, f, default=str)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
