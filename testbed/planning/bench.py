"""Time BLP and every executable baseline on process groups that are already initialised.

Used by ``benchmarks/allreduce_schemes.py`` once the emulated network is up
(the runner starts one process per trainer host, calls
``init_process_group`` and then :func:`compare`).  Every scheme runs on the
same tensor in the same run, interleaved (each iteration runs every scheme
once, in an order rotated by one per iteration):

* ``blp``: :class:`~.executor.BlpAllReduce` on the plan;
* ``tree_best``, ``blink``, ``star``: their plans on ``BlpAllReduce``;
* ``ring_relay``: :class:`~.executor.RingRelayAllReduce` (best order, relayed hops);
* ``hierarchical``: :class:`~.executor.HierarchicalAllReduce` (collectives);
* ``ring``: plain ``dist.all_reduce`` over all ranks (the flat gloo ring).

:func:`executable_specs` turns the predictions of
:func:`testbed.planning.baselines.baselines` into JSON the worker processes
take.  Timing: every call starts at an instant all ranks agreed on in
advance on the machine's shared clock (:func:`common_start`; a barrier
would release them up to a WAN path delay apart), and its time is from that
instant to the slowest rank's end (a ``MAX`` all-reduce afterwards, outside
the timed region); a rank that reached the instant late is reported
(``start_lateness_s``).  The reported figure is the median over
iterations.  Every call's TCP retransmitted segments and retransmission
timeouts, summed over the ranks' namespaces, are kept beside its time
(:mod:`testbed.collect.tcp`): a call that reads ~200 ms high with a timeout
beside it lost a packet, which is the network's doing, not the scheme's.  Ratios: measured / predicted for each scheme (the issue's bar:
within [0.9, 1.15]) and each scheme / BLP (measured).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from testbed.collect import tcp

from .baselines import SchemeCost
from .executor import BlpAllReduce, HierarchicalAllReduce, RingRelayAllReduce, make_leader_group
from .model import Plan

#: Table order: BLP, the strong baselines, the flat-ring reference.
ORDER = ("blp", "tree_best", "blink", "ring_relay", "star", "hierarchical", "ring")
BAR = (0.9, 1.15)
#: Phases of a leader-based scheme, each the slowest rank's time in it (``_LeaderScheme.last_phases``).
PHASES = ("intra_reduce", "wan", "intra_broadcast")


#: Slack added to the agreed start instant beyond twice the measured agreement time (seconds).
START_SLACK_S = 0.05


def common_start() -> tuple[float, float]:
    """Agree on one future instant of the shared clock and sleep until it; returns (start, lateness).

    All ranks of a run on one machine read the same ``CLOCK_MONOTONIC``
    (network namespaces do not change the clock), so a start instant agreed
    in advance removes what a barrier leaves: ranks leave ``dist.barrier()``
    up to a WAN path delay apart, and on a 100 ms link a rank that leaves
    early would count the others' lag as the operation's time.  Two one-float
    ``MAX`` all-reduces agree on the instant: the first on the latest rank's
    clock reading ``T0``, the second on the longest time any rank needed to
    learn ``T0`` (``L``); everyone knows ``T0 + 2 L + slack`` before it comes.
    ``lateness`` (> 0 if this rank got there after the instant) is returned
    so callers can report it rather than trust a start that was not common.
    """
    now = torch.tensor([time.monotonic()], dtype=torch.float64)
    dist.all_reduce(now, op=dist.ReduceOp.MAX)
    t0 = float(now.item())
    lag = torch.tensor([time.monotonic() - t0], dtype=torch.float64)
    dist.all_reduce(lag, op=dist.ReduceOp.MAX)
    start = t0 + 2 * float(lag.item()) + START_SLACK_S
    wait = start - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    return start, max(0.0, time.monotonic() - start - 0.001)


def timed_call(fn: Callable[[], object]) -> tuple[float, float]:
    """One call of ``fn`` on every rank from a common start: (slowest rank's end - start, worst lateness)."""
    start, late = common_start()
    fn()
    out = torch.tensor([time.monotonic() - start, late], dtype=torch.float64)
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return float(out[0].item()), float(out[1].item())


def time_collective(fn: Callable[[], object], *, iters: int = 5, warmup: int = 1) -> list[float]:
    """Seconds per call of ``fn`` (from a common start to the slowest rank's end), one per timed iteration."""
    out = []
    for i in range(warmup + iters):
        dt, _ = timed_call(fn)
        if i >= warmup:
            out.append(dt)
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
    names = sorted(specs, key=lambda k: (ORDER.index(k) if k in ORDER else len(ORDER), k))
    ops: dict[str, Callable[[torch.Tensor], dict[int, int]]] = {}
    for name in names:
        ops[name] = _op(name, specs[name], plan, rank, dc_of_rank, leaders, group_of_dc, leader_group, tag)
        tag += getattr(ops[name], "tag_span", 0) + 16
    sent: dict[str, dict[int, int]] = {name: {} for name in names}
    times: dict[str, list[float]] = {name: [] for name in names}
    diffs: dict[str, float] = {name: 0.0 for name in names}
    retrans: dict[str, list[int]] = {name: [] for name in names}
    phases: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    timeouts: dict[str, list[int]] = {name: [] for name in names}
    worst_late = 0.0
    # interleaved: every iteration runs every scheme once, the order rotated by one each time, so a
    # slow spell of the shared machine falls on all schemes alike rather than on whichever ran then
    for it in range(warmup + iters):
        for name in names[it % len(names):] + names[:it % len(names)]:
            def call(name: str = name) -> None:
                buf.copy_(x)
                got = ops[name](buf)
                sent[name].clear()
                sent[name].update(got)

            before = tcp.counters()
            dt, late = timed_call(call)
            after = tcp.delta(before, tcp.counters())
            lost = torch.tensor([after["retrans_segs"], after["timeouts"]], dtype=torch.float64)
            dist.all_reduce(lost)  # summed over ranks, outside the timed region
            ph = getattr(ops[name], "last_phases", {})
            worst = torch.tensor([ph.get(k, 0.0) for k in PHASES], dtype=torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            if it >= warmup and ph:
                for k, v in zip(PHASES, worst.tolist()):
                    phases[name].setdefault(k, []).append(v)
            diffs[name] = max(diffs[name], float((buf - ref).abs().max()))
            if it >= warmup:
                times[name].append(dt)
                retrans[name].append(int(lost[0].item()))
                timeouts[name].append(int(lost[1].item()))
                worst_late = max(worst_late, late)
    for name in names:
        med = statistics.median(times[name])
        p = pred.get(name)
        result["schemes"].append(name)
        q = statistics.quantiles(times[name], n=4, method="inclusive") if len(times[name]) > 1 else [med] * 3
        result[name] = {"times_s": times[name], "median_s": med, "quartiles_s": [q[0], q[2]], "predicted_s": p,
                        "measured_over_predicted": med / p if p else None,
                        "bytes_sent": dict(sent[name]), "max_abs_diff": diffs[name],
                        "tcp_retrans_segs": retrans[name], "tcp_timeouts": timeouts[name],
                        "phases_median_s": {k: statistics.median(v) for k, v in phases[name].items()}}
    result["start_lateness_s"] = worst_late
    result["warmup"] = warmup
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
