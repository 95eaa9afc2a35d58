"""Worker body of the loopback executor test, kept light (no scipy) because each rank imports it.

Spawned by :mod:`tests.planning.test_executor`; every scenario runs
``dist.all_reduce`` for the reference and :class:`BlpAllReduce` twice (the
second call checks that an instance can be reused); at the end the benchmark
helper runs once on the first scenario and rank 0 writes its result.
"""

from __future__ import annotations

import datetime
import json
import os
import traceback

import torch
import torch.distributed as dist

from testbed.planning.bench import compare, format_result
from testbed.planning.executor import BlpAllReduce, make_dc_groups, split_bounds
from testbed.planning.model import Plan

WORLD = 6


def _expected_bytes(plan: Plan, numel: int, me: str, elsize: int) -> dict[str, int]:
    """Bytes ``me`` sends to each neighbour DC under ``plan`` (one rank per DC)."""
    out: dict[str, int] = {}
    for t, chunks in zip(plan.trees, split_bounds(numel, plan)):
        n = sum(b - a for a, b in chunks) * elsize
        if me in t.parents:
            out[t.parents[me]] = out.get(t.parents[me], 0) + n
        for c in t.children()[me]:
            out[c] = out.get(c, 0) + n
    return {k: v for k, v in out.items() if v}


def run_scenarios(rank: int, port: int, scenarios: list, errfile: str) -> None:
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=40))
        for si, (name, plan, dc_of_rank, leaders, opts) in enumerate(scenarios):
            groups = make_dc_groups(dc_of_rank) if opts.get("groups") else None
            gen = torch.Generator().manual_seed(1000 * si + rank)
            dtype = opts.get("dtype", torch.float32)
            x = torch.randn(opts["numel"], generator=gen, dtype=dtype)
            ref = x.clone()
            dist.all_reduce(ref)
            if opts.get("average"):
                ref /= WORLD
            op = BlpAllReduce(plan, rank, dc_of_rank, leaders, groups, average=opts.get("average", False),
                              tag_base=10_000 * si, window=opts.get("window", 64))
            for _rep in range(2):
                y = x.clone()
                sent = op(y)
                torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
            if opts.get("bytes"):
                me = dc_of_rank[rank]
                want = _expected_bytes(plan, opts["numel"], me, x.element_size())
                got = {dc_of_rank[p]: b for p, b in sent.items()}
                assert got == want, f"{name}: rank {rank} sent {got}, plan says {want}"
        name, plan, dc_of_rank, leaders, _ = scenarios[0]
        res = compare(plan, rank, dc_of_rank, leaders, numel=3000, iters=2, warmup=1, out=None)
        if rank == 0:
            with open(f"{errfile}.bench.json", "w") as f:
                f.write(json.dumps(res) + "\n" + format_result(res))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        with open(f"{errfile}.{rank}", "w") as f:
            f.write(traceback.format_exc())
        raise


