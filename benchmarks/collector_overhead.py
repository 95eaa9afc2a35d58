#!/usr/bin/env python3
"""Collector overhead: step time with the samplers on (10 Hz links + processes) vs off, same run.

Runs the same small BSP experiment alternately with collectors on and off
(``--rounds`` times each, fresh network per trial), and compares the median
time per training step, measured from the workers' own compute and sync
spans (so network start-up and process start are excluded).  Prints the
ratio on/off (bar: <= 1.03).  Needs root.

    sudo .venv/bin/python benchmarks/collector_overhead.py [--rounds 3] [--steps 150]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from testbed.experiments.runner import run_experiment  # noqa: E402
from testbed.experiments.spec import parse_experiment  # noqa: E402


def step_time(trial: Path) -> float:
    """Median over workers of (last step end - first step start) / steps, from events/*.jsonl."""
    per_worker = []
    for f in (trial / "events").glob("*.worker.*.jsonl"):
        steps: dict[int, list[int]] = {}
        for line in f.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if r.get("phase") in ("compute", "wan_sync", "intra_sync") and isinstance(r.get("step"), int):
                s = steps.setdefault(r["step"], [r["ts"], r["ts"] + r["dur"]])
                s[0], s[1] = min(s[0], r["ts"]), max(s[1], r["ts"] + r["dur"])
        if len(steps) > 10:
            ks = sorted(steps)[5:]  # skip warm-up steps
            per_worker.append((steps[ks[-1]][1] - steps[ks[0]][0]) / 1e9 / len(ks))
    return statistics.median(per_worker)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--topology", default="two_dc")
    args = ap.parse_args()
    base = {"name": "overhead", "topology": args.topology, "impairment": "auto", "allow_missing_netem": True,
            "timeout": "300s",
            "training": {"workload": {"name": "digits"}, "stop": {"steps": args.steps}, "eval_every": 50},
            "schemes": [{"label": "bsp", "scheme": {"name": "bsp"}}]}
    out = Path(tempfile.mkdtemp(prefix="overhead-"))
    times: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(args.rounds):
        for mode in ("on", "off"):
            d = dict(base, seed=r + 1, collectors={"rate_hz": 10, "links": mode == "on", "procs": mode == "on",
                                                   "trace": False})
            spec = parse_experiment(d)
            res = run_experiment(spec, run_dir=out / f"{mode}-{r}", report=False)
            if res.failed:
                print(f"trial failed: {res.failed[0].reason}")
                return 1
            times[mode].append(step_time(res.trials[0].dir))
            print(f"round {r + 1} collectors {mode}: {times[mode][-1] * 1e3:.2f} ms/step", flush=True)
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    print(f"median step time: on {on * 1e3:.2f} ms, off {off * 1e3:.2f} ms, ratio on/off = {on / off:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
