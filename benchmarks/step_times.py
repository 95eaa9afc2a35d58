#!/usr/bin/env python3
"""Steady-state step, compute and sync times per trial of a run, from the recorded spans.

Throughput in summary.md divides by the whole trial (start-up included);
this reads the workers' spans and skips the first steps, which is what the
PGCS bar (>= 1.7 x sequential, >= 0.9 of ideal) is about.  For every pair of
labels ``X`` and ``sequential`` it prints speed-up and ideal
(compute + sync) / max(compute, sync).  Reads records only.

    .venv/bin/python benchmarks/step_times.py results/pgcs_emulated/<run-id>
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from testbed.collect.records import read_jsonl


def trial_times(trial: Path, skip: int = 5) -> dict[str, float] | None:
    steps, syncs, comps = [], [], []
    for f in sorted((trial / "events").glob("*.jsonl")):
        rows, problems = read_jsonl(f, trial)
        for p in problems:  # a truncated last line is a killed worker's; anything else is worth a look
            print(f"{trial.name}: {p}", file=sys.stderr)
        comp = sorted((r for r in rows if r.get("phase") == "compute"), key=lambda r: r["ts"])
        comps += [r["dur"] / 1e9 for r in comp[skip:]]
        steps += [(b["ts"] - a["ts"]) / 1e9 for a, b in zip(comp[skip:], comp[skip + 1:])]
        syncs += [r["dur"] / 1e9 for r in rows if r.get("phase") == "wan_sync"][skip:]
    if not steps:
        return None
    return {"step": statistics.median(steps), "compute": statistics.median(comps),
            "sync": statistics.median(syncs) if syncs else 0.0}


def main() -> int:
    run = Path(sys.argv[1])
    by_label: dict[str, list[dict[str, float]]] = {}
    for t in sorted((run / "trials").glob("*-r*")):
        tt = trial_times(t)
        if tt:
            print(f"{t.name:24} step {tt['step'] * 1e3:7.1f} ms  compute {tt['compute'] * 1e3:7.1f} ms  "
                  f"sync {tt['sync'] * 1e3:7.1f} ms")
            by_label.setdefault(t.name.rsplit("-r", 1)[0], []).append(tt)
    seq = by_label.get("sequential")
    if seq:
        s_step = statistics.median(x["step"] for x in seq)
        for label, xs in by_label.items():
            if label == "sequential":
                continue
            step = statistics.median(x["step"] for x in xs)
            c = statistics.median(x["compute"] for x in xs)
            s = statistics.median(x["sync"] for x in xs)
            ideal = (c + s) / max(c, s) if max(c, s) > 0 else float("nan")
            speed = s_step / step
            print(f"{label} vs sequential: speed-up {speed:.2f}x, ideal {ideal:.2f}x, fraction of ideal {speed / ideal:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
