"""Worker body of the loopback executor test, kept light (no scipy) because each rank imports it.

Spawned by :mod:`tests.planning.test_executor`; every scenario runs
``dist.all_reduce`` for the reference and the scheme's executor twice (the
second call checks that an instance can be reused), and checks that every
rank ends with bit-identical results: :class:`BlpAllReduce` on
the scenario's plan, or the baseline named by ``opts["scheme"]`` (a spec of
:func:`testbed.planning.bench.executable_specs`: ``RingRelayAllReduce``,
``HierarchicalAllReduce``).  At the end the benchmark helper runs once on the
first scenario with every scheme of ``bench_schemes`` and rank 0 writes its
result.
"""

from __future__ import annotations

import datetime
import json
import os
import traceback

import torch
import torch.distributed as dist

from testbed.planning.bench import compare, format_result
from testbed.planning.executor import (
    BlpAllReduce,
    HierarchicalAllReduce,
    RingRelayAllReduce,
    make_dc_groups,
    make_leader_group,
    ring_chunk_bounds,
    split_bounds,
)
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


def _ring_expected_bytes(ring: list[str], routes: dict, chunks: int, numel: int, me: str,
                         elsize: int) -> dict[str, int]:
    """Bytes ``me`` sends to each DC in the relayed ring (its own hop's first link + the hops it forwards)."""
    n = len(ring)
    seg = [sum(b - a for a, b in s) for s in ring_chunk_bounds(numel, n, chunks)]
    out: dict[str, int] = {}
    for h in range(n):
        route = routes[(ring[h], ring[(h + 1) % n])]
        if me not in route[:-1]:
            continue
        nxt = route[route.index(me) + 1]
        steps = [(h - s) % n for s in range(n - 1)] + [(h + 1 - t) % n for t in range(n - 1)]
        out[nxt] = out.get(nxt, 0) + sum(seg[i] for i in steps) * elsize
    return {k: v for k, v in out.items() if v}


def _make_op(plan, rank, dc_of_rank, leaders, groups, opts, tag_base):
    scheme = opts.get("scheme")
    kw = {"average": opts.get("average", False), "tag_base": tag_base}
    if scheme is None:
        return BlpAllReduce(plan, rank, dc_of_rank, leaders, groups, window=opts.get("window", 64), **kw)
    if scheme["kind"] == "ring_relay":
        return RingRelayAllReduce(scheme["ring"], scheme["routes"], rank, dc_of_rank, leaders, groups,
                                  chunks=scheme["chunks"], window=opts.get("window", 64), **kw)
    if scheme["kind"] == "hierarchical":
        lead = leaders or {}
        if not lead:
            for r in sorted(dc_of_rank):
                lead.setdefault(dc_of_rank[r], r)
        return HierarchicalAllReduce(sorted(set(dc_of_rank.values())), rank, dc_of_rank, leaders, groups,
                                     make_leader_group(lead), **kw)
    raise ValueError(scheme)


def run_scenarios(rank: int, port: int, scenarios: list, errfile: str, bench_schemes: dict | None = None) -> None:
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
            op = _make_op(plan, rank, dc_of_rank, leaders, groups, opts, 10_000 * si)
            for _rep in range(2):
                y = x.clone()
                sent = op(y)
                torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
                # every rank ends with the same bits (link roots: A + B at one end, B + A at the other)
                every = [torch.empty_like(y) for _ in range(WORLD)]
                dist.all_gather(every, y)
                assert all(torch.equal(every[0], e) for e in every), f"{name}: ranks' results differ in their bits"
            if opts.get("bytes"):
                me = dc_of_rank[rank]
                scheme = opts.get("scheme")
                if scheme is None:
                    want = _expected_bytes(plan, opts["numel"], me, x.element_size())
                else:
                    want = _ring_expected_bytes(scheme["ring"], scheme["routes"], scheme["chunks"], opts["numel"],
                                                me, x.element_size())
                got = {dc_of_rank[p]: b for p, b in sent.items()}
                assert got == want, f"{name}: rank {rank} sent {got}, plan says {want}"
        name, plan, dc_of_rank, leaders, _ = scenarios[0]
        res = compare(plan, rank, dc_of_rank, leaders, numel=3000, iters=2, warmup=1, out=None,
                      schemes=bench_schemes, group_of_dc=make_dc_groups(dc_of_rank))
        if rank == 0:
            with open(f"{errfile}.bench.json", "w") as f:
                f.write(json.dumps(res) + "\n" + format_result(res))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        with open(f"{errfile}.{rank}", "w") as f:
            f.write(traceback.format_exc())
        raise


