"""``testbed report RUN_OR_EXPERIMENT_DIR``: the CLI plug-in (see docs/CONTRACTS.md).

``register(subparsers)`` adds the subcommand; ``main(argv)`` runs it
stand-alone (``python -m testbed.analysis.cli DIR``).  Exit status: 0 when
summary.md was written (missing records are reported, not fatal), 1 when
something failed or nothing could be written, 2 for a path that is not a
results directory.  No traceback reaches the user unless ``--traceback``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from testbed.collect.trace import GZIP_THRESHOLD_BYTES

if TYPE_CHECKING:
    from testbed.analysis.report import Report


def _steps(text: str) -> tuple[int, int]:
    try:
        a, _, b = text.partition(":")
        lo, hi = int(a), int(b or a)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FIRST:LAST step numbers, got {text!r}") from None
    if hi < lo:
        raise argparse.ArgumentTypeError(f"last step {hi} is before first step {lo}")
    return lo, hi


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=Path, metavar="RUN_OR_EXPERIMENT_DIR",
                   help="a trial dir (trials/<scheme>-r<rep>), a run dir, or an experiment dir")
    tgt = p.add_mutually_exclusive_group()
    tgt.add_argument("--target-loss", type=float, metavar="LOSS",
                     help="time to target = first evaluation with held-out loss <= LOSS "
                          "(default: manifest 'target', else the loss every trial reached)")
    tgt.add_argument("--target-acc", type=float, metavar="ACC",
                     help="time to target = first evaluation with held-out accuracy >= ACC")
    p.add_argument("--steps", type=_steps, metavar="FIRST:LAST",
                   help="step window of the timeline figures (default: a time window of 3 step periods of the slowest "
                        "worker, mid-run, where every worker has work)")
    p.add_argument("--no-trace", action="store_true", help="do not (re)build trace.json")
    p.add_argument("--gzip-mb", type=float, default=GZIP_THRESHOLD_BYTES / 2**20, metavar="MB",
                   help="write trace.json.gz instead of trace.json above this size "
                        "(default %(default)g)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only problems")
    p.add_argument("--traceback", action="store_true", help="show tracebacks of internal errors")
    p.add_argument("--json", action="store_true",
                   help="print a JSON summary on stdout instead (kind, summary table rows, outputs, "
                        "warnings, missing records, errors)")


def as_json(rep: Report) -> dict[str, object]:
    """The report's outcome as one JSON object (``--json``)."""
    return {
        "kind": rep.kind, "path": str(rep.root), "summary_md": str(rep.summary) if rep.summary else None,
        "summary": rep.summary_rows,
        "figures": sorted(str(p) for p in rep.outputs if p.suffix == ".pdf"),
        "tables": sorted(str(p) for p in rep.outputs if p.suffix == ".csv"),
        "traces": sorted(str(p) for p in rep.outputs if p.name.startswith("trace.json")),
        "warnings": rep.warnings, "missing": rep.missing, "skipped": rep.skipped, "errors": rep.errors,
        "removed": sorted(str(p) for p in rep.removed),
    }


def run(args: argparse.Namespace) -> int:
    try:  # heavy imports only when used; pandas is an optional dependency
        from testbed.analysis.report import Options, report
    except ImportError as exc:
        print(f"testbed report: needs {exc.name or exc}: run sudo scripts/bootstrap.sh "
              "(installs the project's dependencies)", file=sys.stderr)
        return 1
    path: Path = args.path
    if not path.is_dir():
        print(f"testbed report: {path}: no such directory", file=sys.stderr)
        return 2
    opts = Options(target_loss=args.target_loss, target_acc=args.target_acc, steps=args.steps,
                   traces=not args.no_trace, gzip_threshold=int(args.gzip_mb * 2**20),
                   show_traceback=args.traceback)
    from testbed.ownership import hand_over, invoking_user

    try:
        rep = report(path, opts)
    except Exception as exc:  # last resort: the report must never end in a traceback
        print(f"testbed report: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        if args.traceback:
            raise
        return 1
    finally:  # under sudo: what the report wrote belongs to whoever owns the results directory
        owner = invoking_user()
        if owner is not None and path.stat().st_uid == owner[0]:
            hand_over([path], owner)
    if rep.kind == "unknown":
        for e in rep.errors:
            print(f"testbed report: {e}", file=sys.stderr)
        return 2
    for w in rep.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.json:
        print(json.dumps(as_json(rep), indent=2, default=str))
        return 1 if rep.errors or rep.summary is None else 0
    if not args.quiet:
        n_fig = sum(1 for p in rep.outputs if p.suffix == ".pdf")
        n_tab = sum(1 for p in rep.outputs if p.suffix == ".csv")
        n_tr = sum(1 for p in rep.outputs if p.name.startswith("trace.json"))
        print(f"{rep.kind} {path}: {n_tr} trace(s), {n_tab} table(s), {n_fig} figure(s)")
        if rep.summary is not None:
            print(f"summary: {rep.summary}")
        if rep.removed:
            print(f"removed {len(rep.removed)} figure file(s) an earlier report drew and this one does not: "
                  + ", ".join(p.name for p in rep.removed[:6]) + (" ..." if len(rep.removed) > 6 else ""))
    for m in rep.missing:
        print(f"missing: {m}")
    for s in rep.skipped:
        print(f"skipped: {s}")
    for e in rep.errors:
        print(f"failed: {e}", file=sys.stderr)
    if rep.errors or rep.summary is None:
        return 1
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "report", help="regenerate traces, tables, figures and summary.md from stored records",
        description="Regenerate trace.json, tidy tables, paper figures and summary.md from the "
                    "records of a trial, run or experiment directory, without rerunning anything. "
                    "Damaged or missing records are reported, never fatal.")
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testbed report")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
