"""Measure BLP against ring all-reduce on process groups that are already initialised.

Used by ``benchmarks/blp_vs_ring.py`` once the emulated network is up (the
runner starts one process per trainer host, calls ``init_process_group`` and
then :func:`compare`).  Timing: every iteration starts after a barrier, each
rank times its own call, and the iteration's time is the slowest rank's (a
``MAX`` all-reduce of one float afterwards, outside the timed region).  The
barrier releases ranks one WAN latency apart at most, so short operations on
long links read slightly high.  The reported figure is the median over
iterations.  Ratios: measured / predicted for each scheme (the issue's bar is
<= 1.15 for BLP) and BLP / ring (bar <= 0.75 on the heterogeneous
topologies).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from .executor import BlpAllReduce
from .model import Plan


def time_collective(fn: Callable[[], object], *, iters: int = 5, warmup: int = 1) -> list[float]:
    """Seconds per call of ``fn`` (the slowest rank's), one value per timed iteration."""
    out = []
    for i in range(warmup + iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if i >= warmup:
            out.append(float(dt.item()))
    return out


def compare(plan: Plan, rank: int, dc_of_rank: Mapping[int, str], leaders: Mapping[str, int] | None = None, *,
            numel: int | None = None, dtype: torch.dtype = torch.float32, iters: int = 5, warmup: int = 1,
            predicted: Mapping[str, float] | None = None, group_of_dc: Mapping[str, Any] | None = None,
            out: Callable[[str], object] | None = print) -> dict[str, Any]:
    """Time BLP (``plan``) and ``dist.all_reduce`` (gloo's ring) on the same tensor; rank 0 prints.

    ``numel`` defaults to the plan's gradient size in elements of ``dtype``.
    ``predicted``: scheme -> predicted seconds (default: BLP's from the plan;
    pass ``{"ring": baselines(...)["ring"].time_s}`` for the ring's).
    Returns, on every rank: per scheme the timings, median, prediction and
    measured/predicted ratio, ``blp_over_ring``, and ``blp_bytes_sent`` (this
    rank's point-to-point bytes per peer in one BLP call).
    """
    elsize = torch.empty(0, dtype=dtype).element_size()
    n = numel if numel is not None else max(1, plan.size_bytes // elsize)
    buf = torch.ones(n, dtype=dtype)
    op = BlpAllReduce(plan, rank, dc_of_rank, leaders, group_of_dc)
    sent: dict[int, int] = {}

    def blp() -> None:
        sent.clear()
        sent.update(op(buf))

    def ring() -> None:
        dist.all_reduce(buf)

    pred = {"blp": plan.predicted_time_s * n * elsize / plan.size_bytes}
    pred.update(predicted or {})
    result: dict[str, Any] = {"numel": n, "bytes": n * elsize, "blp_bytes_sent": {}}
    for name, fn in (("blp", blp), ("ring", ring)):
        times = time_collective(fn, iters=iters, warmup=warmup)
        med = statistics.median(times)
        p = pred.get(name)
        result[name] = {"times_s": times, "median_s": med, "predicted_s": p,
                        "measured_over_predicted": med / p if p else None}
    result["blp_bytes_sent"] = dict(sent)
    result["blp_over_ring"] = result["blp"]["median_s"] / result["ring"]["median_s"]
    if rank == 0 and out is not None:
        out(format_result(result))
    return result


def format_result(result: Mapping[str, Any]) -> str:
    """The table :func:`compare` prints."""
    lines = [f"all-reduce of {result['bytes']} bytes ({result['numel']} elements)",
             f"  {'scheme':<8}{'measured':>12}{'predicted':>12}{'meas/pred':>11}"]
    for name in ("blp", "ring"):
        r = result[name]
        p = f"{r['predicted_s']:.4f} s" if r["predicted_s"] else "-"
        q = f"{r['measured_over_predicted']:.3f}" if r["measured_over_predicted"] else "-"
        lines.append(f"  {name:<8}{r['median_s']:>10.4f} s{p:>12}{q:>11}")
    lines.append(f"  blp / ring = {result['blp_over_ring']:.3f}")
    return "\n".join(lines)
