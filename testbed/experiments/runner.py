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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    #: the lr each scheme trained at, when the spec has ``lr_search`` (``{label: pick}``)
    picks: dict[str, Any] | None = None

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
                   extra_manifest: dict[str, Any] | None = None, heading: str = "",
                   lr_search: str = "run", lr_search_from: Path | str | None = None,
                   trial_fn: Any = None) -> RunResult:
    """Every scheme x repetition (``trial_fn``: ``run_trial``, or a fake in tests).

    With the spec's ``lr_search`` (and ``lr_search="run"``) the per-scheme lr search runs first
    and the trials use its picks; ``lr_search="only"`` runs the search and no trial (its records
    are the run's result, and no report is made); ``lr_search="skip"`` runs at the given lrs;
    ``lr_search_from`` reuses an earlier run's picks (``lr_search``)."""
    from .lr_search import apply_picks, check_seed, load_picks, run_lr_search

    trial_fn = trial_fn or run_trial
    run_dir = run_dir or new_run_dir(spec)
    run_dir.mkdir(parents=True, exist_ok=True)
    picks: dict[str, Any] | None = None
    searching = spec.lr_search is not None and lr_search in ("run", "only") and lr_search_from is None
    search_only = searching and lr_search == "only"
    report = report and not search_only  # the search's lr_search.csv/.json are the records
    if lr_search_from is not None:
        picks = load_picks(lr_search_from)
    elif searching:
        check_seed(spec)
    n_search = sum(len(spec.lr_search.values_for(1.0)) for s in spec.schemes
                   if spec.lr_search.schemes is None or s.label in spec.lr_search.schemes) if searching else 0
    trials = [] if search_only else [(s, r) for r in range(spec.repetitions) for s in spec.schemes]
    prog = Progress(len(trials) + n_search, heading=heading)
    result = RunResult(run_dir)
    # the handlers stay through the manifest and the report: a press there is noted, not raised
    # into whatever runs (a finaliser, the report's plotting)
    with ctrl_c_guard(prog.log) as interrupted:
        manifest = {"experiment": spec.name, "spec_hash": spec.spec_hash, "spec": spec.raw,
                    "resolved_spec": spec.resolved(), "provenance": provenance(with_capabilities=True),
                    "argv": sys.argv, "start": time.time(), "trials": []}
        if spec.sweep_point:
            manifest["sweep"] = spec.sweep_point
        manifest.update(extra_manifest or {})
        if spec.lr_search is not None or picks is not None:
            manifest["lr_search"] = {"mode": "reused" if lr_search_from is not None else lr_search,
                                     "from": str(lr_search_from) if lr_search_from is not None else None}
        try:
            if searching:
                interrupted["in_trial"] = True  # the search runs trials too
                try:
                    picks = run_lr_search(spec, run_dir, trial_fn, log=prog.log,
                                          stop_flag=lambda: interrupted["flag"], progress=prog)
                finally:
                    interrupted["in_trial"] = False
                manifest["lr_search"]["records"] = str(run_dir / "lr_search" / "lr_search.json")
            if picks is not None:
                manifest["lr_search"]["picks"] = picks
                result.picks = picks
            elif spec.lr_search is not None:  # --skip-lr-search: say so in every trial's provenance
                picks = {s.label: {"lr": (s.training.get("optimizer") or {}).get("lr"), "source": "given",
                                   "note": "the spec's lr_search was skipped (--skip-lr-search)"}
                         for s in spec.schemes if (s.training.get("optimizer") or {}).get("lr") is not None}
            if picks is not None:
                by_label = {s.label: s for s in apply_picks(spec.schemes, picks)}
                trials = [(by_label[s.label], r) for s, r in trials]
            for scheme, rep in trials:
                if interrupted["flag"]:
                    break
                tdir = run_dir / "trials" / f"{scheme.label}-r{rep}"
                prog.log(f"trial {scheme.label} r{rep}: building {spec.topology.name} ...")
                prog.start_trial(f"{scheme.label} r{rep}", (scheme.training.get("stop") or {}).get("steps"),
                                 (scheme.training.get("stop") or {}).get("wall_s"))
                interrupted["in_trial"] = True
                try:
                    tr = trial_fn(spec, scheme, rep, tdir, progress=prog.update, log=prog.log,
                                  stop_flag=lambda: interrupted["flag"])
                except OSError as e:
                    if e.errno not in DISK_ERRNOS:
                        raise
                    result.disk_error = (f"the results could not be written ({e.strerror}: {e.filename or run_dir}); "
                                         f"trial {scheme.label} r{rep} is incomplete, the trials before it ({len(result.trials)}) "
                                         "are intact; free space (or make the results directory writable) and rerun")
                    prog.log(f"error: {result.disk_error}")
                    break
                finally:
                    interrupted["in_trial"] = False
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


@contextmanager
def ctrl_c_guard(log: Callable[[str], None]) -> Iterator[dict[str, bool]]:
    """The run's Ctrl-C rules, for the block's duration; yields the state the runner sets and reads.

    The first press sets ``flag``: the current trial stops gracefully, records kept, and no
    further trial starts.  A second press inside a trial (``in_trial``, set by the runner)
    raises KeyboardInterrupt there: the trial is cut short, its teardown still runs
    (``trial.interrupts_deferred``).  Outside a trial the run is already ending and a press is
    only noted: raised there it could land in any finaliser (once in CI: an asyncio loop's
    ``__del__``, printed as a traceback by a run that otherwise stopped cleanly).  A
    KeyboardInterrupt that a finaliser swallows anyway is reported in one line.
    """
    state = {"flag": False, "in_trial": False}

    def on_sigint(signum: int, frame: Any) -> None:
        if state["flag"]:
            if state["in_trial"]:
                raise KeyboardInterrupt
            log("Ctrl-C: the run is already stopping (its trials are down; writing its records)")
            return
        state["flag"] = True
        log("Ctrl-C: stopping the current trial and keeping its records (again to abort at once)")

    def on_unraisable(u: Any) -> None:
        if isinstance(u.exc_value, KeyboardInterrupt):
            log("Ctrl-C: noted (the trial is already stopping)")
            return
        old_unraisable(u)

    old = signal.signal(signal.SIGINT, on_sigint)
    old_unraisable = sys.unraisablehook
    sys.unraisablehook = on_unraisable
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, old)
        sys.unraisablehook = old_unraisable


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
    return columns(rows)


def columns(rows: list[tuple[str, ...]]) -> str:
    """Rows of strings as left-aligned text columns (the CLI's plain tables)."""
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(x) for c, x in zip(r, w)).rstrip() for r in rows)
