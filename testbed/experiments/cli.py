"""``testbed run``, ``testbed sweep`` and ``testbed demo``."""

from __future__ import annotations

import argparse
import json
import signal
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


def load_cluster_for(spec: Any, path: str) -> Any:
    """``run --cluster FILE``: the cluster file, checked against the spec before anything is built (exit 2):
    emulate mode, a placement that fits, nothing a trial across servers does not do yet."""
    from ..cluster.capacity import measured
    from ..cluster.model import load as load_cluster
    from ..cluster.placement import place
    from ..cluster.trialnet import refuse_unsupported

    cluster = load_cluster(path)
    if cluster.mode == "shape":
        from ..cluster.shaping import plan

        plan(spec.topology, cluster)  # its refusals (placement, LAN shapes, paths) before anything is built
    else:
        place(spec.topology, cluster)
    refuse_unsupported(spec, cluster)
    return measured(cluster, log=_say)  # every server's cores, for an automatic placement


def preflight(spec: Any) -> None:
    """What would make every trial fail, found before the first is built (errors exit 2 with the fix)."""

    from ..network.emulation import check_machine_free, check_preconditions

    check_machine_free("running trials (each builds a network)")
    # across servers, GPUs are each server's: its part checks its own as it is built (placement: servers[].gpus)
    check_preconditions(spec.topology, spec.impairment, spec.allow_missing_netem, gpus=spec.cluster is None)
    check_trainer_images(spec.topology)
    check_writable(Path(spec.results_dir), "results_dir")


def check_trainer_images(topo: Any) -> None:
    """Every image of a runtime: docker DC can run a trainer (python3 with torch): an image without them
    would fail every trial after its network was built (DockerError: exit 2, naming the DC)."""
    from ..images.builder import check_image
    from ..network import docker_hosts

    for image, dcs in docker_hosts.images_of(topo).items():
        if image in _IMAGES_CHECKED:  # a sweep checks every point's spec: each image once
            continue
        try:
            v = check_image(image)
        except docker_hosts.DockerError as e:
            raise docker_hosts.DockerError(f"dcs[{dcs[0]}].image: {e}") from None
        _IMAGES_CHECKED.add(image)
        _say(f"image {image} ({', '.join(dcs)}): python {v['python']}, torch {v['torch']}")


_IMAGES_CHECKED: set[str] = set()


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
    if getattr(args, "cluster", None):
        spec.cluster = load_cluster_for(spec, args.cluster)
    lr_from = getattr(args, "lr_search_from", None)
    if lr_from is not None:
        from .lr_search import load_picks

        load_picks(lr_from)  # a wrong path is a usage error (exit 2) before anything is built
    mode = "run"
    if getattr(args, "skip_lr_search", False):
        mode = "skip"
    elif getattr(args, "lr_search_only", False):
        if spec.lr_search is None:
            raise ValidationError("--lr-search-only", f"{args.experiment} has no lr_search: section, so there is "
                                  "nothing to search", "add an lr_search: section (README \"Learning rates\") "
                                  "or drop --lr-search-only")
        mode = "only"
    return _run_spec(spec, as_json=getattr(args, "json", False), lr_search=mode, lr_search_from=lr_from,
                     spec_arg=args.experiment)


def _run_spec(spec: Any, as_json: bool = False, run_dir: Path | None = None,
              extra: dict[str, Any] | None = None, lr_search: str = "run",
              lr_search_from: str | None = None, spec_arg: str = "SPEC") -> int:
    """Preflight, run every trial, print the summary (a table, or JSON on stdout); the exit status."""
    from ..ownership import hand_over, missing_parents
    from .runner import new_run_dir

    fresh = missing_parents(Path(spec.results_dir) / spec.name)
    preflight(spec)
    _announce_netem(spec)
    run_dir = run_dir or new_run_dir(spec)
    try:
        res = run_experiment(spec, run_dir=run_dir, extra_manifest=extra, lr_search=lr_search,
                             lr_search_from=lr_search_from)
    finally:  # under sudo, the results belong to the user who typed it (also after Ctrl-C)
        hand_over([fresh[-1] if fresh else run_dir])
    if res.interrupted:  # everything is down and written: a further press has nothing left to stop
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if as_json:
        print(json.dumps(run_json(res), indent=2, default=str))
    elif lr_search == "only":
        print(picks_table(res.picks or {}))
        print(f"\nlr search records: {res.dir / 'lr_search' / 'lr_search.csv'}"
              f"\ntrials at these picks: testbed run {spec_arg} "
              f"--lr-search-from {res.dir}")
    else:
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
        cluster = (lambda spec: load_cluster_for(spec, args.cluster)) if getattr(args, "cluster", None) else None
        out = run_sweep(args.sweep, Path(args.out) if args.out else None, log=_say,
                        preflight=preflight, cluster=cluster, only=args.only)
    except SweepInterrupted as e:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # all down and written: nothing left to stop
        print(f"sweep results so far: {e.out}")
        return 130
    except RecordsUnwritable as e:
        _say(f"error: {e}")
        return 1
    points = [json.loads(d.read_text()) | {"dir": str(d.parent)} for d in sorted((out / "points").glob("*/done.json"))]
    failed = [f for p in points for f in p.get("failed", [])]
    if args.json:
        print(json.dumps({"results": str(out), "sweep_csv": str(out / "sweep.csv") if (out / "sweep.csv").exists()
                          else None, "points": points, "failed": failed}, indent=2, default=str))
    else:
        print(f"sweep results: {out}")
    return 1 if failed else 0


def run_json(res: Any) -> dict[str, Any]:
    """``run --json``: where the results are, how each trial ended, the lr picks (with ``lr_search``)."""
    return {"results": str(res.dir), "interrupted": res.interrupted, "disk_error": res.disk_error or None,
            "trials": [{"label": t.label, "rep": t.rep, "status": t.status, "reason": t.reason,
                        "wall_s": round(t.wall_s, 3), "dir": str(t.dir), "last": t.last} for t in res.trials],
            "lr_picks": res.picks,
            "summary": str(res.dir / "summary.md") if (res.dir / "summary.md").exists() else None}


def picks_table(picks: dict[str, Any]) -> str:
    """``run --lr-search-only``: each searched scheme's pick, whether it was searched, and an edge warning."""
    rows = [("scheme", "lr", "source", "note")]
    for label, p in picks.items():
        note = f"at the {p['at_edge']} value tried: extend the grid" if p.get("at_edge") else p.get("note", "")
        rows.append((label, f"{p.get('lr'):g}" if isinstance(p.get("lr"), (int, float)) else "-",
                     str(p.get("source", "")), note))
    if len(rows) == 1:
        return "no pick (the search was stopped before any scheme finished)"
    from .runner import columns

    return columns(rows)


def cmd_rerun(args: argparse.Namespace) -> int:
    """Rerun a run from its manifest alone; print what differs from then (code, libraries, kernel)."""
    from ..provenance import differences, provenance
    from .spec import parse_experiment

    run_dir = Path(args.run_dir)
    mpath = run_dir / "manifest.json"
    if not mpath.is_file():
        raise ValidationError("RUN_DIR", f"{run_dir} has no manifest.json",
                              "give a run directory: results/<experiment>/<stamp> (not a trial or experiment dir)")
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError) as e:
        raise ValidationError("RUN_DIR", f"{mpath} is unreadable: {e}", "rerun needs an intact run manifest") from None
    resolved = manifest.get("resolved_spec")
    if not isinstance(resolved, dict):
        raise ValidationError("RUN_DIR", f"{mpath} has no resolved_spec (written before record format 2)",
                              "rerun its spec file instead: testbed run SPEC")
    spec = parse_experiment(resolved, source=str(mpath))
    if manifest.get("spec_hash") and spec.spec_hash != manifest["spec_hash"]:
        raise ValidationError("RUN_DIR", f"the manifest's spec hashes to {spec.spec_hash}, it recorded "
                              f"{manifest['spec_hash']}", "the manifest was edited or this testbed reads specs "
                              "differently; run the spec file with `testbed run`")
    spec.sweep_point = manifest.get("sweep") or {}
    spec.results_dir = args.results or str(run_dir.resolve().parent.parent)  # default: beside the original
    diffs = differences(manifest.get("provenance") or {}, provenance(with_capabilities=True))
    _say(f"rerun of {run_dir} (spec {spec.spec_hash}, seed {spec.seed}, {spec.repetitions} repetition(s))")
    for line in diffs or ["nothing differs: same code, libraries, kernel and capabilities"]:
        _say(f"  {line}")
    if diffs and args.strict:
        _say("error: --strict and the machine or code differ from the original run; nothing was run")
        return 2
    return _run_spec(spec, as_json=args.json, extra={"rerun_of": str(run_dir.resolve()),
                                                     "rerun_differences": diffs})


def cmd_demo(args: argparse.Namespace) -> int:
    name = "demo_reduced" if args.reduced else "demo"
    _say(f"demo: {'reduced ' if args.reduced else ''}default experiment ({name}.yaml) on three_dc_triangle")
    ns = argparse.Namespace(experiment=name, results=args.results, repetitions=None, json=False,
                            skip_lr_search=False, lr_search_from=None)
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
TESTBED_NODE_START_TIMEOUT 10 (node shells, per batch of 8; 60 inside the kernel lab)."""


def register(sub: Any) -> None:
    run = sub.add_parser("run", help="run an experiment spec: every scheme x repetition on a fresh network, "
                                     "records, trace, figures and summary.md under results/",
                         epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("experiment", help="experiment YAML (or a bundled one: demo, demo_reduced)")
    run.add_argument("--results", help="results root (default: the spec's results_dir, 'results')")
    run.add_argument("--repetitions", type=int, help="override the spec's repetitions")
    lr = run.add_mutually_exclusive_group()
    lr.add_argument("--skip-lr-search", action="store_true",
                    help="ignore the spec's lr_search: run every scheme at its given lr (recorded as 'given')")
    lr.add_argument("--lr-search-only", action="store_true",
                    help="run the spec's lr_search and stop before the trials: prints each scheme's pick and "
                         "writes lr_search/lr_search.{csv,json} (no report); run the trials later with "
                         "--lr-search-from RUN_DIR")
    lr.add_argument("--lr-search-from", metavar="DIR",
                    help="reuse the per-scheme lr picks of an earlier run's search (its run directory or "
                         "lr_search.json) instead of searching again")
    run.add_argument("--cluster", metavar="FILE",
                     help="spread every trial over the servers of this cluster file (emulate or shape mode; README "
                          "\"Several servers\"): each server builds its DCs, trainers there start over ssh, "
                          "every server is sampled, link schedules reach every server (emulate mode), and "
                          "the records come back into the trial directory on the launcher's clock; docker "
                          "hosts and cross traffic are refused (exit 2)")
    run.set_defaults(func=cmd_run)
    sw = sub.add_parser("sweep", help="run or resume a parameter grid (finished points are skipped); "
                                      "writes sweep.csv with means and 95%% CIs and the sweep figures",
                        epilog="exit status and bounds as for `testbed run` (every point is checked before "
                               "the first runs); 130 on Ctrl-C: rerun the same command to resume.")
    run.add_argument("--json", action="store_true",
                     help="print the outcome as JSON on stdout (results dir, each trial's status); "
                          "progress stays on stderr")
    sw.add_argument("sweep", help="sweep YAML")
    sw.add_argument("--out", help="output folder (default results/<name>/sweep)")
    sw.add_argument("--json", action="store_true", help="print the outcome as JSON on stdout")
    sw.add_argument("--only", action="append", metavar="KEY=VALUE",
                    help="run only the grid points with this value (repeatable; a key named twice keeps "
                         "either value), e.g. --only training.compute.factor_by_dc.west=1.5 --only "
                         "schemes=asp (a scheme entry by its label); the points keep the whole sweep's ids, "
                         "so the same command without --only resumes past them")
    sw.add_argument("--cluster", metavar="FILE",
                    help="run every point's trials across the servers of this cluster file (as `run --cluster`; "
                         "a resumed sweep must name the same servers)")
    sw.set_defaults(func=cmd_sweep)
    rr = sub.add_parser("rerun", help="rerun a run from its manifest alone (same resolved spec, seeds and "
                                      "repetitions); prints what differs since: code, libraries, kernel",
                        description="Rerun RUN_DIR's experiment from RUN_DIR/manifest.json alone: the spec with "
                                    "its topology inlined, the same seeds and repetitions. The new run goes "
                                    "beside the original (or under --results) and its manifest names the "
                                    "original (rerun_of) and the differences printed.",
                        epilog="exit status as for `testbed run`; 2 also for a directory without a usable "
                               "manifest, or --strict with differences.")
    rr.add_argument("run_dir", metavar="RUN_DIR", help="a run directory: results/<experiment>/<stamp>")
    rr.add_argument("--results", help="results root for the new run (default: beside the original)")
    rr.add_argument("--strict", action="store_true",
                    help="refuse (exit 2) when the code, libraries, kernel or capabilities differ")
    rr.add_argument("--json", action="store_true", help="print the outcome as JSON on stdout")
    rr.set_defaults(func=cmd_rerun)
    demo = sub.add_parser("demo", help="the built-in demo: three_dc_triangle, BSP/ASP/SSP/Gsyn/DiLoCo/PGCS+BLP, figures")
    demo.add_argument("--reduced", action="store_true", help="the short form make test runs")
    demo.add_argument("--results", help="results root (default results/)")
    demo.set_defaults(func=cmd_demo)
