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
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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
    """Every span line of these trials' events (damaged lines skipped)."""
    out: list[dict] = []
    for trial in trials:
        for f in (trial / "events").glob("*.jsonl"):
            for x in f.read_text().splitlines():
                try:
                    out.append(json.loads(x))
                except json.JSONDecodeError:
                    continue
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", type=Path, help="a finished sweep over gsyn groups (its sweep/ folder)")
    ap.add_argument("--calibration", type=Path, default=None,
                    help="a separate run whose spans give the planner's inputs (default: the sweep's own)")
    args = ap.parse_args()
    root = args.sweep
    measured: dict[int, float] = {}
    spans_for_inputs: list[dict] = []
    for point in sorted((root / "points").glob("*/done.json")):
        pdir = point.parent
        for trial in sorted((pdir / "trials").glob("*-r*")):
            m = json.loads((trial / "manifest.json").read_text())
            g = m["training"]["scheme"].get("groups")
            target = m.get("target") or {}
            metric, value = next(iter(target.items())) if target else ("loss", 1.0)
            t = time_to_target(trial, metric, float(value))
            if g is None or t is None:
                continue
            measured.setdefault(int(g), []).append(t)  # type: ignore[arg-type]
            if args.calibration is None:
                spans_for_inputs += spans_of([trial])
    if args.calibration is not None:
        cal = sorted((args.calibration / "trials").glob("*-r*"))
        spans_for_inputs = spans_of(cal)
        if not spans_for_inputs:
            print(f"no spans in the calibration run {args.calibration} (give a run directory with trials/)")
            return 2
        print(f"planner inputs from the calibration run {args.calibration} ({len(cal)} trials), "
              "not from the sweep")
    if not measured or not spans_for_inputs:
        print("need a finished sweep over gsyn groups (benchmarks/gsyn_groups_sweep.yaml)")
        return 1
    means = {g: statistics.mean(ts) for g, ts in measured.items()}  # type: ignore[arg-type]
    spec = inputs_from_spans(spans_for_inputs)
    spec.setdefault("allreduce_s", {"intra_dc": 0.005, "cross_dc": 0.05})
    spec["candidates"] = sorted(means)
    print("measured mean time to target per G:", {g: round(t, 2) for g, t in sorted(means.items())})
    for penalty in (0.5, "fit"):  # "fit" fits the penalty to the sweep's times: not a prediction
        spec["staleness_penalty"] = penalty
        spec["measured"] = {g: t for g, t in means.items()}
        p = plan(load_spec(spec))
        print(f"\nstaleness penalty {penalty}: predicted best G = {p.best}, measured best G = "
              f"{min(means, key=means.get)}")
        print(format_plan(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
