"""Time BLP and every executable baseline on process groups that are already initialised.

Used by ``benchmarks/allreduce_schemes.py`` once the emulated network is up
(the runner starts one process per trainer host, calls
``init_process_group`` and then :func:`compare`).  Every scheme runs on the
same tensor in the same run, one after the other:

* ``blp``: :class:`~.executor.BlpAllReduce` on the plan;
* ``tree_best``, ``blink``, ``star``: their plans on ``BlpAllReduce``;
* ``ring_relay``: :class:`~.executor.RingRelayAllReduce` (best order, relayed hops);
* ``hierarchical``: :class:`~.executor.HierarchicalAllReduce` (collectives);
* ``ring``: plain ``dist.all_reduce`` over all ranks (the flat gloo ring).

:func:`executable_specs` turns the predictions of
:func:`testbed.planning.baselines.baselines` into JSON the worker processes
take.  Timing: every iteration starts after a barrier, each rank times its
own call, and the iteration's time is the slowest rank's (a ``MAX``
all-reduce of one float afterwards, outside the timed region).  The barrier
releases ranks one WAN latency apart at most, so short operations on long
links read slightly high.  The reported figure is the median over
iterations.  Ratios: measured / predicted for each scheme (the issue's bar:
within [0.9, 1.15]) and each scheme / BLP (measured).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from .baselines import SchemeCost
from .executor import BlpAllReduce, HierarchicalAllReduce, RingRelayAllReduce, make_leader_group
from .model import Plan

#: Table order: BLP, the strong baselines, the flat-ring reference.
ORDER = ("blp", "tree_best", "blink", "ring_relay", "star", "hierarchical", "ring")
BAR = (0.9, 1.15)


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


def executable_specs(base: Mapping[str, SchemeCost], extra_s: float = 0.0) -> dict[str, dict[str, Any]]:
    """JSON-able description of every baseline that has an executor, with its prediction.

    ``extra_s`` is added to every leader-based prediction (the intra-DC
    phases, :func:`~.baselines.intra_dc_time`); the flat ring has none.
    """
    out: dict[str, dict[str, Any]] = {}
    for name, c in base.items():
        if c.plan is not None:
            out[name] = {"kind": "plan", "plan": c.plan.to_dict(), "predicted_s": c.time_s + extra_s}
        elif c.executor == "RingRelayAllReduce":
            out[name] = {"kind": "ring_relay", "ring": list(c.ring), "chunks": c.chunks,
                         "routes": {f"{a}->{b}": list(r) for (a, b), r in c.routes.items()},
                         "predicted_s": c.time_s + extra_s}
        elif c.executor == "HierarchicalAllReduce":
            out[name] = {"kind": "hierarchical", "predicted_s": c.time_s + extra_s}
        elif c.executor == "dist.all_reduce":
            out[name] = {"kind": "ring", "predicted_s": c.time_s}
    return out


def _op(name: str, spec: Mapping[str, Any], plan: Plan, rank: int, dc_of_rank: Mapping[int, str],
        leaders: Mapping[str, int] | None, group_of_dc: Mapping[str, Any] | None, leader_group: Any,
        tag_base: int) -> Callable[[torch.Tensor], dict[int, int]]:
    kind = spec["kind"]
    if kind == "plan":
        return BlpAllReduce(Plan.from_dict(spec["plan"], f"schemes.{name}.plan"), rank, dc_of_rank, leaders,
                            group_of_dc, tag_base=tag_base)
    if kind == "ring_relay":
        routes = {tuple(k.split("->")): v for k, v in spec["routes"].items()}
        return RingRelayAllReduce(spec["ring"], routes, rank, dc_of_rank, leaders, group_of_dc,
                                  chunks=int(spec["chunks"]), tag_base=tag_base)
    if kind == "hierarchical":
        return HierarchicalAllReduce(plan.dcs, rank, dc_of_rank, leaders, group_of_dc, leader_group,
                                     tag_base=tag_base)
    if kind == "ring":
        def ring(buf: torch.Tensor) -> dict[int, int]:
            dist.all_reduce(buf)
            return {}
        return ring
    raise ValueError(f"unknown scheme kind {kind!r} for {name}")


def compare(plan: Plan, rank: int, dc_of_rank: Mapping[int, str], leaders: Mapping[str, int] | None = None, *,
            numel: int | None = None, dtype: torch.dtype = torch.float32, iters: int = 5, warmup: int = 1,
            predicted: Mapping[str, float] | None = None, group_of_dc: Mapping[str, Any] | None = None,
            schemes: Mapping[str, Mapping[str, Any]] | None = None, leader_group: Any = None,
            out: Callable[[str], object] | None = print) -> dict[str, Any]:
    """Time BLP (``plan``) and every scheme of ``schemes`` on the same tensor; rank 0 prints.

    ``schemes``: name -> spec from :func:`executable_specs` (default: only
    the flat ring, ``{"ring": {"kind": "ring"}}``).  Every rank of the world
    must call this (the leaders' group is made here when a hierarchical
    scheme is asked for and ``leader_group`` is not given).  ``numel``
    defaults to the plan's gradient size in elements of ``dtype``.
    ``predicted``: scheme -> predicted seconds, overriding the specs'
    (default for BLP: the plan's, scaled to ``numel``).  Every call starts
    from the same input and each result is checked against the flat ring's
    (``max_abs_diff``).  Returns, on every rank: per scheme the timings,
    median, prediction, measured/predicted, measured / BLP and this rank's
    bytes per peer in one call (``bytes_sent``; collectives not counted);
    ``blp_over_ring`` and ``blp_bytes_sent`` as before.
    """
    elsize = torch.empty(0, dtype=dtype).element_size()
    n = numel if numel is not None else max(1, plan.size_bytes // elsize)
    specs: dict[str, Mapping[str, Any]] = {"blp": {"kind": "plan", "plan": plan.to_dict()}}
    specs.update(schemes if schemes is not None else {"ring": {"kind": "ring"}})
    if leader_group is None and any(s["kind"] == "hierarchical" for s in specs.values()):
        ld = leaders
        if ld is None:
            ld = {}
            for r in sorted(dc_of_rank):
                ld.setdefault(dc_of_rank[r], r)
        leader_group = make_leader_group(ld)
    pred: dict[str, float | None] = {k: s.get("predicted_s") for k, s in specs.items()}
    pred["blp"] = plan.predicted_time_s * n * elsize / plan.size_bytes
    pred.update(predicted or {})
    gen = torch.Generator().manual_seed(rank)
    x = torch.randint(-8, 9, (n,), generator=gen).to(dtype)  # small integers: every order sums exactly
    ref = x.clone()
    dist.all_reduce(ref)
    buf = torch.empty_like(x)
    result: dict[str, Any] = {"numel": n, "bytes": n * elsize, "schemes": [], "blp_bytes_sent": {}}
    tag = 0
    for name in sorted(specs, key=lambda k: (ORDER.index(k) if k in ORDER else len(ORDER), k)):
        op = _op(name, specs[name], plan, rank, dc_of_rank, leaders, group_of_dc, leader_group, tag)
        tag += getattr(op, "tag_span", 0) + 16
        sent: dict[int, int] = {}

        def call(op: Callable[[torch.Tensor], dict[int, int]] = op, sent: dict[int, int] = sent) -> None:
            buf.copy_(x)
            got = op(buf)
            sent.clear()
            sent.update(got)

        times = time_collective(call, iters=iters, warmup=warmup)
        med = statistics.median(times)
        p = pred.get(name)
        result["schemes"].append(name)
        result[name] = {"times_s": times, "median_s": med, "predicted_s": p,
                        "measured_over_predicted": med / p if p else None,
                        "bytes_sent": dict(sent), "max_abs_diff": float((buf - ref).abs().max())}
    result["blp_bytes_sent"] = result["blp"]["bytes_sent"]
    for name in result["schemes"]:
        result[name]["over_blp"] = result[name]["median_s"] / result["blp"]["median_s"]
    if "ring" in result:
        result["blp_over_ring"] = result["blp"]["median_s"] / result["ring"]["median_s"]
    if rank == 0 and out is not None:
        out(format_result(result))
    return result


def format_result(result: Mapping[str, Any]) -> str:
    """The table :func:`compare` prints: one row per scheme, side by side."""
    lo, hi = BAR
    lines = [f"all-reduce of {result['bytes']} bytes ({result['numel']} elements)",
             f"  {'scheme':<14}{'measured':>12}{'predicted':>12}{'meas/pred':>11}{'vs BLP':>9}  bar [{lo}, {hi}]"]
    for name in result.get("schemes", ["blp", "ring"]):
        r = result[name]
        p = f"{r['predicted_s']:.4f} s" if r["predicted_s"] else "-"
        q = r["measured_over_predicted"]
        mark = "" if q is None else ("ok" if lo <= q <= hi else "MISS")
        v = r.get("over_blp")
        lines.append(f"  {name:<14}{r['median_s']:>10.4f} s{p:>12}{(f'{q:.3f}' if q else '-'):>11}"
                     f"{(f'{v:.3f}' if v else '-'):>9}  {mark}")
    if "blp_over_ring" in result:
        lines.append(f"  blp / ring = {result['blp_over_ring']:.3f}")
    return "\n".join(lines)
