"""``testbed run``, ``testbed sweep`` and ``testbed demo``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from traffic_control.errors import ValidationError

from .runner import run_experiment, summary_table
from .spec import load_experiment


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _announce_netem(spec: Any) -> None:
    if not spec.topology.needs_netem:
        return
    from traffic_control.capabilities import probe_kernel

    netem = probe_kernel()["netem"]
    if not netem.ok:
        _say("NOTE: this kernel has no sch_netem. Delay/jitter/loss will come from the userspace (NFQUEUE) "
             f"backend if it is available, else they are skipped (recorded). Fixes: {netem.fix}")


def preflight(spec: Any) -> None:
    """What would make every trial fail, found before the first is built (errors exit 2 with the fix)."""
    import os

    from ..network import cleanup
    from ..network.emulation import NetworkBusy, check_preconditions

    if os.geteuid() != 0:
        raise PermissionError("running trials builds networks, which needs root: run with sudo")
    busy = cleanup.owned_netns()
    if busy:
        raise NetworkBusy(f"a testbed network is already up ({len(busy)} namespaces, e.g. {busy[0]}); "
                          "run `testbed net down` (or `testbed clean`) first")
    check_preconditions(spec.topology, spec.impairment, spec.allow_missing_netem)


def cmd_run(args: argparse.Namespace) -> int:
    spec = load_experiment(args.experiment)
    if args.results:
        spec.results_dir = args.results
    if args.repetitions is not None:
        if args.repetitions < 1:
            raise ValidationError("--repetitions", f"must be at least 1, got {args.repetitions}", "e.g. --repetitions 3")
        spec.repetitions = args.repetitions
    preflight(spec)
    _announce_netem(spec)
    res = run_experiment(spec)
    print(summary_table(res))
    print(f"\nresults: {res.dir}")
    if res.interrupted:
        _say("interrupted (Ctrl-C): the finished trials and the stopped one's records are kept")
        return 130
    if res.failed:
        _say("failed: " + ", ".join(f"{t.label}-r{t.rep} ({t.status}: {t.reason[:120]})" for t in res.failed))
        return 1
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from .sweep import SweepInterrupted, run_sweep

    try:
        out = run_sweep(args.sweep, Path(args.out) if args.out else None, log=_say, preflight=preflight)
    except SweepInterrupted as e:
        print(f"sweep results so far: {e.out}")
        return 130
    print(f"sweep results: {out}")
    failed = []
    for d in (out / "points").glob("*/done.json"):
        import json

        failed += json.loads(d.read_text()).get("failed", [])
    return 1 if failed else 0


def cmd_demo(args: argparse.Namespace) -> int:
    name = "demo_reduced" if args.reduced else "demo"
    _say(f"demo: {'reduced ' if args.reduced else ''}default experiment ({name}.yaml) on three_dc_triangle")
    ns = argparse.Namespace(experiment=name, results=args.results, repetitions=None)
    return cmd_run(ns)


def register(sub: Any) -> None:
    run = sub.add_parser("run", help="run an experiment spec: every scheme x repetition on a fresh network, "
                                     "records, trace, figures and summary.md under results/")
    run.add_argument("experiment", help="experiment YAML (or a bundled one: demo, demo_reduced)")
    run.add_argument("--results", help="results root (default: the spec's results_dir, 'results')")
    run.add_argument("--repetitions", type=int, help="override the spec's repetitions")
    run.set_defaults(func=cmd_run)
    sw = sub.add_parser("sweep", help="run or resume a parameter grid (finished points are skipped); "
                                      "writes sweep.csv with means and 95%% CIs and the sweep figures")
    sw.add_argument("sweep", help="sweep YAML")
    sw.add_argument("--out", help="output folder (default results/<name>/sweep)")
    sw.set_defaults(func=cmd_sweep)
    demo = sub.add_parser("demo", help="the built-in demo: three_dc_triangle, BSP/ASP/SSP/Gsyn/PGCS+BLP, figures")
    demo.add_argument("--reduced", action="store_true", help="the short form make test runs")
    demo.add_argument("--results", help="results root (default results/)")
    demo.set_defaults(func=cmd_demo)
