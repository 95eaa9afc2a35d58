"""``testbed run``: every scheme x repetition of an experiment, each on a fresh network.

Results go to ``results/<experiment>/<run-id>/`` (never overwritten: the
run id is a timestamp, suffixed if taken).  Ctrl-C stops the current trial
cleanly, keeps what was recorded, skips the rest, and still writes the
report of what exists.
"""

from __future__ import annotations

import errno
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traffic_control.files import write_json_atomic

from ..provenance import provenance
from .progress import Progress
from .spec import ExperimentSpec
from .trial import TrialResult, run_trial

#: errors of the results' file system that end a run (every later trial would fail the same way)
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO}


class RecordsUnwritable(RuntimeError):
    """The results could not be written (disk full, read-only): the run or sweep stopped."""


@dataclass
class RunResult:
    dir: Path
    trials: list[TrialResult] = field(default_factory=list)
    interrupted: bool = False
    #: why the results could not be written (disk full, read-only), which stopped the run
    disk_error: str = ""

    @property
    def failed(self) -> list[TrialResult]:
        return [t for t in self.trials if t.status != "ok"]


def new_run_dir(spec: ExperimentSpec, root: Path | None = None) -> Path:
    base = (root or Path(spec.results_dir)) / spec.name
    stamp = time.strftime("%Y%m%d-%H%M%S")
    d = base / stamp
    k = 1
    while d.exists():
        k += 1
        d = base / f"{stamp}-{k}"
    d.mkdir(parents=True)
    return d


def run_experiment(spec: ExperimentSpec, run_dir: Path | None = None, report: bool = True,
                   extra_manifest: dict[str, Any] | None = None, heading: str = "") -> RunResult:
    run_dir = run_dir or new_run_dir(spec)
    run_dir.mkdir(parents=True, exist_ok=True)
    trials = [(s, r) for r in range(spec.repetitions) for s in spec.schemes]
    prog = Progress(len(trials), heading=heading)
    result = RunResult(run_dir)
    interrupted = {"flag": False}

    def on_sigint(signum: int, frame: Any) -> None:
        if interrupted["flag"]:
            raise KeyboardInterrupt
        interrupted["flag"] = True
        prog.log("Ctrl-C: stopping the current trial and keeping its records (again to abort at once)")

    old = signal.signal(signal.SIGINT, on_sigint)
    manifest = {"experiment": spec.name, "spec_hash": spec.spec_hash, "spec": spec.raw,
                "resolved_spec": spec.resolved(), "provenance": provenance(with_capabilities=True),
                "argv": sys.argv, "start": time.time(), "trials": []}
    if spec.sweep_point:
        manifest["sweep"] = spec.sweep_point
    manifest.update(extra_manifest or {})
    try:
        for scheme, rep in trials:
            if interrupted["flag"]:
                break
            tdir = run_dir / "trials" / f"{scheme.label}-r{rep}"
            prog.log(f"trial {scheme.label} r{rep}: building {spec.topology.name} ...")
            prog.start_trial(f"{scheme.label} r{rep}", (scheme.training.get("stop") or {}).get("steps"))
            try:
                tr = run_trial(spec, scheme, rep, tdir, progress=prog.update, log=prog.log,
                               stop_flag=lambda: interrupted["flag"])
            except OSError as e:
                if e.errno not in DISK_ERRNOS:
                    raise
                result.disk_error = (f"the results could not be written ({e.strerror}: {e.filename or run_dir}); "
                                     f"trial {scheme.label} r{rep} is incomplete, the trials before it ({len(result.trials)}) "
                                     "are intact; free space (or make the results directory writable) and rerun")
                prog.log(f"error: {result.disk_error}")
                break
            result.trials.append(tr)
            prog.finish_trial()
            prog.log(f"trial {scheme.label} r{rep}: {tr.status.upper()} in {tr.wall_s:.1f} s"
                     + (f" ({tr.reason})" if tr.reason else "")
                     + (f"  last: step {tr.last.get('step')} loss {tr.last.get('loss')}" if tr.last else ""))
            manifest["trials"].append({"label": tr.label, "rep": tr.rep, "dir": str(tr.dir.relative_to(run_dir)),
                                       "status": tr.status, "reason": tr.reason, "wall_s": tr.wall_s})
            try:
                write_json_atomic(run_dir / "manifest.json", manifest, indent=2)
            except OSError as e:
                if e.errno not in DISK_ERRNOS:
                    raise
                result.disk_error = (f"the run's manifest could not be written ({e.strerror}); the trials' own "
                                     "records are intact; free space and rerun")
                prog.log(f"error: {result.disk_error}")
                break
    finally:
        prog.close()
        signal.signal(signal.SIGINT, old)
        result.interrupted = interrupted["flag"]
        manifest["end"] = time.time()
        manifest["interrupted"] = result.interrupted
        if result.disk_error:
            manifest["disk_error"] = result.disk_error
        try:
            write_json_atomic(run_dir / "manifest.json", manifest, indent=2)
        except OSError as e:  # the previous manifest (one per finished trial) stays as it was
            if e.errno not in DISK_ERRNOS:
                raise
            result.disk_error = result.disk_error or f"the run's manifest could not be written ({e.strerror})"
            report = False
    if report:
        make_report(run_dir, prog.log)
    return result


def make_report(run_dir: Path, log: Any = print) -> None:
    try:
        from ..analysis.report import Options, report
    except ImportError as e:
        log(f"report: analysis not available ({e})")
        return
    try:
        rep = report(run_dir, Options(traces=False))  # trials merged their traces already
        for line in getattr(rep, "missing", [])[:10]:
            log(f"report: {line}")
    except Exception as e:  # the records are safe; a report problem must not hide them
        log(f"report failed: {type(e).__name__}: {e} (rerun: testbed report {run_dir})")


def summary_table(result: RunResult) -> str:
    rows = [("trial", "status", "wall s", "last step", "last loss")]
    for t in result.trials:
        rows.append((f"{t.label}-r{t.rep}", t.status, f"{t.wall_s:.1f}", str(t.last.get("step", "-")),
                     str(t.last.get("loss", "-"))[:8]))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(x) for c, x in zip(r, w)) for r in rows)
