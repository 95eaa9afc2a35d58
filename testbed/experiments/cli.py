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

    from ..network.emulation import check_machine_free, check_preconditions

    check_machine_free("running trials (each builds a network)")
    check_preconditions(spec.topology, spec.impairment, spec.allow_missing_netem)
    check_writable(Path(spec.results_dir), "results_dir")


def check_writable(directory: Path, field: str) -> None:
    """The results directory can be created and written (a read-only one is found before any trial)."""
    import errno
    import tempfile

    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-probe-"):
            pass
    except OSError as e:
        hint = "use a writable directory (results_dir: in the spec, or --results DIR)"
        if e.errno == errno.ENOSPC:
            hint = "free space on it, or use another directory (--results DIR)"
        raise ValidationError(field, f"cannot write results to {directory}: {e.strerror}", hint) from None


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
    if res.disk_error:
        _say(f"error: {res.disk_error}")
        return 1
    if res.interrupted:
        _say("interrupted (Ctrl-C): the finished trials and the stopped one's records are kept")
        return 130
    if res.failed:
        _say("failed: " + ", ".join(f"{t.label}-r{t.rep} ({t.status}: {t.reason[:120]})" for t in res.failed))
        return 1
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from .runner import RecordsUnwritable
    from .sweep import SweepInterrupted, run_sweep

    try:
        out = run_sweep(args.sweep, Path(args.out) if args.out else None, log=_say, preflight=preflight)
    except SweepInterrupted as e:
        print(f"sweep results so far: {e.out}")
        return 130
    except RecordsUnwritable as e:
        _say(f"error: {e}")
        return 1
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


RUN_EPILOG = """\
exit status: 0 every trial finished; 1 a trial failed (named on stderr), or the results
could not be written (disk full: the trials before are intact); 2 bad spec or a machine
that cannot run it (not root, a network already up, no impairment backend, read-only
results), nothing built; 130 Ctrl-C (the current trial stops cleanly, records kept;
a second Ctrl-C stops at once, still cleaning up).

bounds (each changeable): trial `timeout:` 600s; `stall:` 180s (a worker without
progress: hung, SIGSTOPped, blocked on a dead peer); training.comm_timeout_s 300
(collectives, server replies; a WAN link down for good); training.connect_timeout_s 60;
TESTBED_STOP_GRACE_S 3 (SIGTERM -> SIGKILL); TESTBED_PS_DRAIN_S 15;
TESTBED_NODE_START_TIMEOUT 10 (node shells, per batch of 8)."""


def register(sub: Any) -> None:
    run = sub.add_parser("run", help="run an experiment spec: every scheme x repetition on a fresh network, "
                                     "records, trace, figures and summary.md under results/",
                         epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("experiment", help="experiment YAML (or a bundled one: demo, demo_reduced)")
    run.add_argument("--results", help="results root (default: the spec's results_dir, 'results')")
    run.add_argument("--repetitions", type=int, help="override the spec's repetitions")
    run.set_defaults(func=cmd_run)
    sw = sub.add_parser("sweep", help="run or resume a parameter grid (finished points are skipped); "
                                      "writes sweep.csv with means and 95%% CIs and the sweep figures",
                        epilog="exit status and bounds as for `testbed run` (every point is checked before "
                               "the first runs); 130 on Ctrl-C: rerun the same command to resume.")
    sw.add_argument("sweep", help="sweep YAML")
    sw.add_argument("--out", help="output folder (default results/<name>/sweep)")
    sw.set_defaults(func=cmd_sweep)
    demo = sub.add_parser("demo", help="the built-in demo: three_dc_triangle, BSP/ASP/SSP/Gsyn/PGCS+BLP, figures")
    demo.add_argument("--reduced", action="store_true", help="the short form make test runs")
    demo.add_argument("--results", help="results root (default results/)")
    demo.set_defaults(func=cmd_demo)
