"""gloo all-reduce timing between two emulated hosts, in phases the test controls.

    allreduce.py RANK MASTER_IP PORT CTL_DIR PHASES REPS NUMEL

Before phase i it waits for ``CTL_DIR/go<i>`` (the test changes the link in
between), runs REPS all-reduces of NUMEL float32 and records their median
time; rank 0 writes ``CTL_DIR/done<i>``.  Prints the medians (s) as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta


def main() -> int:
    rank, master, port, ctl = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    phases, reps, numel = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=300))
    t = torch.ones(numel)
    medians = []
    for phase in range(phases):
        while not os.path.exists(os.path.join(ctl, f"go{phase}")):
            time.sleep(0.05)
        dist.barrier()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        medians.append(sorted(times)[len(times) // 2])
        dist.barrier()
        if rank == 0:
            with open(os.path.join(ctl, f"done{phase}"), "w") as f:
                f.write(json.dumps(medians))
    print(json.dumps(medians), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
