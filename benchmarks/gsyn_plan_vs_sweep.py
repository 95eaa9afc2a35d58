#!/usr/bin/env python3
"""The Gsyn planner's prediction beside a measured sweep over the group count G.

Reads a finished ``testbed sweep`` over ``gsyn`` with different ``groups``
(benchmarks/gsyn_groups_sweep.yaml): per point the measured mean time to the
experiment's target (first evaluation reaching it, from metrics.csv), and
planner inputs measured from the spans of all its trials (per-host compute
times, ring all-reduce and server round trips; pooled, since in a short
G = N trial the remote workers may barely start before the target is hit).  Then it runs the planner
(``testbed.training.gsyn_plan``) twice: with its default staleness penalty
(a prediction made without the sweep's times) and fitted to the sweep, and
prints predicted and measured side by side.  Records only; no network.

With ``--calibration RUN`` the planner's inputs come from the spans of a
separate run instead (e.g. benchmarks/claims/gsyn_groups_calibration.yaml),
so the prediction is made without the sweep it is judged against (issue 15);
the "fit" row then still fits the staleness penalty to the sweep and says so.

    .venv/bin/python benchmarks/gsyn_plan_vs_sweep.py results/gsyn_groups/sweep
    .venv/bin/python benchmarks/gsyn_plan_vs_sweep.py results/claims_gsyn_groups/sweep \
        --calibration results/claims_gsyn_groups_calibration/RUN_ID
    .venv/bin/python benchmarks/gsyn_plan_vs_sweep.py --calibration RUN   (the prediction alone)

A G with a trial that stopped before the target (censored) is listed with how many
reached it and left out of the measured means and of the fit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.collect.records import read_jsonl  # noqa: E402
from testbed.training.gsyn_plan import format_plan, inputs_from_spans, load_spec, plan  # noqa: E402


def time_to_target(trial: Path, metric: str, value: float) -> float | None:
    """The report's definition (testbed.analysis.tables.time_to_target) on one trial's metrics.csv."""
    import math

    import pandas as pd

    from testbed.analysis.tables import time_to_target as ttt

    p = trial / "metrics.csv"
    if not p.exists():
        return None
    t = ttt(pd.read_csv(p), value if metric == "loss" else None, value if metric == "acc" else None)
    return None if math.isnan(t) else t


def spans_of(trials: list[Path]) -> list[dict]:
    """Every span line of these trials' events (damaged lines skipped), each tagged with its
    ``trial`` (the trial folder), so that one collective's members are matched within a trial."""
    out: list[dict] = []
    for trial in trials:
        for f in (trial / "events").glob("*.jsonl"):
            recs, _ = read_jsonl(f)
            out += [{**rec, "trial": str(trial)} for rec in recs]
    return out


def trials_by_g(root: Path) -> dict[int, list[float | None]]:
    """Per G of the sweep's finished points, each trial's time to the experiment's target (None:
    not reached before the trial stopped - censored, not dropped)."""
    out: dict[int, list[float | None]] = {}
    for point in sorted((root / "points").glob("*/done.json")):
        for trial in sorted((point.parent / "trials").glob("*-r*")):
            m = json.loads((trial / "manifest.json").read_text())
            g = m["training"]["scheme"].get("groups")
            if not isinstance(g, int):
                continue
            target = m.get("target") or {}
            metric, value = next(iter(target.items())) if target else ("loss", 1.0)
            out.setdefault(g, []).append(time_to_target(trial, metric, float(value)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", type=Path, nargs="?", default=None,
                    help="a finished sweep over gsyn groups (its sweep/ folder); leave out with "
                         "--calibration for the prediction alone (every G from 1 to N)")
    ap.add_argument("--calibration", type=Path, default=None,
                    help="a separate run whose spans give the planner's inputs (default: the sweep's own)")
    args = ap.parse_args()
    if args.sweep is None and args.calibration is None:
        ap.error("give a sweep folder, or --calibration RUN for the prediction alone")
    times = trials_by_g(args.sweep) if args.sweep is not None else {}
    if args.calibration is not None:
        cal = sorted((args.calibration / "trials").glob("*-r*"))
        spans_for_inputs = spans_of(cal)
        if not spans_for_inputs:
            print(f"no spans in the calibration run {args.calibration} (give a run directory with trials/)")
            return 2
        print(f"planner inputs from the calibration run {args.calibration} ({len(cal)} trials), "
              "not from the sweep")
    else:
        spans_for_inputs = spans_of(sorted(t for p in (args.sweep / "points").glob("*/done.json")
                                           for t in (p.parent / "trials").glob("*-r*")))
    if (args.sweep is not None and not times) or not spans_for_inputs:
        print("need a finished sweep over gsyn groups (benchmarks/claims/gsyn_groups_sweep.yaml)")
        return 1
    spec = inputs_from_spans(spans_for_inputs)
    spec.setdefault("allreduce_s", {"intra_dc": 0.005, "cross_dc": 0.05})
    if times:
        spec["candidates"] = sorted(times)
    # a G whose every trial reached the target has a mean; one with a censored trial only a bound
    means = {g: statistics.mean(ts) for g, ts in times.items() if ts and None not in ts}  # type: ignore[type-var]
    for g, ts in sorted(times.items()):
        got = [t for t in ts if t is not None]
        mean = f"{statistics.mean(got):.2f} s" if got else "-"
        print(f"G = {g}: reached the target in {len(got)} of {len(ts)} trials; mean of those {mean}"
              + ("" if len(got) == len(ts) else "  (censored: its mean is not comparable)"))
    for penalty in (0.5, "fit"):  # "fit" fits the penalty to the sweep's times: not a prediction
        if penalty == "fit" and len(means) < 2:
            continue
        spec["staleness_penalty"] = penalty
        spec["measured"] = dict(means)
        p = plan(load_spec(spec))
        best = f", measured best G = {min(means, key=means.get)}" if means else ""  # type: ignore[arg-type]
        print(f"\nstaleness penalty {penalty}: predicted best G = {p.best}{best}")
        print(format_plan(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
