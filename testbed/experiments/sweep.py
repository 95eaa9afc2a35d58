"""``testbed sweep``: a grid over spec fields, resumable, summarised with 95 % CIs.

```yaml
name: rate_sweep
experiment: demo.yaml         # base experiment (path, relative to this file) or an inline mapping
repetitions: 2                # per point (overrides the base)
grid:                         # the cartesian product of these lists
  wan.rate: [20Mbit, 50Mbit]  # wan.<field>: every WAN link, both directions (rate, delay, rtt, jitter, loss)
  wan.delay: [5ms, 20ms]
  training.scheme.groups: [1, 3]   # any dotted path into the experiment mapping
  topology.ps: [east, west]   # topology.<field>: a bundled or file topology is inlined first
  schemes: [[bsp], [gsyn]]    # top-level keys too
```
Each point runs as its own experiment under ``points/<id>/``; a point is
done once ``points/<id>/done.json`` exists, so an interrupted sweep resumes
where it stopped and never redoes finished points.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
import time
from pathlib import Path
from typing import Any

from topologies.loader import read_mapping
from traffic_control.errors import ValidationError
from traffic_control.fields import SpecModel, unit_field, validate
from traffic_control.files import write_atomic, write_json_atomic
from traffic_control.shape import SHAPE_KEYS
from traffic_control.units import parse_percent, parse_rate, parse_time

from ..ownership import hand_over, missing_parents
from .runner import RecordsUnwritable, run_experiment
from .spec import parse_experiment, rebase_files, resolve_extends


class SweepSpec(SpecModel):
    """A grid over experiment fields (module doc)."""

    name: str | None = unit_field(None, pattern=r"^[A-Za-z0-9_.-]+$", fix="use letters, digits, '_', '-', '.'")
    """results go to results/<name>/sweep (default: the file name)"""
    experiment: str | dict[str, Any] = unit_field(..., fix="experiment: demo.yaml or an inline mapping")
    """the base experiment: a path relative to the sweep file, or an inline mapping"""
    grid: dict[str, list[Any]] = unit_field(..., min_length=1,
                                            fix="e.g. grid: {wan.rate: [20Mbit, 50Mbit]}")
    """field -> values; every combination is one point (wan.<field> sets every WAN link)"""
    repetitions: int | None = unit_field(None, ge=1, fix="e.g. repetitions: 3")
    """trials per scheme and point (overrides the base experiment's)"""
    results_dir: str = "results"
    """results root"""


SWEEP_KEYS = tuple(SweepSpec.model_fields)

#: wan.<field> -> (manifest name, parser to SI units); the report labels these axes (report.SWEEP_X)
_WAN_SI = {"rate": ("rate_bps", parse_rate), "delay": ("delay_s", parse_time), "rtt": ("rtt_s", parse_time),
           "jitter": ("jitter_s", parse_time), "loss": ("loss_pct", parse_percent)}


def sweep_values(point: dict[str, Any]) -> dict[str, Any]:
    """A grid point as the manifest's ``sweep`` block: ``{param: value}`` with WAN fields in SI
    units (``wan.rate: 20Mbit`` -> ``rate_bps: 2e7``) and other paths by their last component
    (``training.scheme.groups`` -> ``groups``; the full path when two would clash)."""
    out: dict[str, Any] = {}
    lasts = [k.split(".")[-1] for k in point]
    for k, v in point.items():
        if k.startswith("wan.") and k[4:] in _WAN_SI:
            name, parse = _WAN_SI[k[4:]]
            out[name] = parse(v, f"grid.{k}")
        else:
            last = k.split(".")[-1]
            name = last if lasts.count(last) == 1 and last not in out else k
            out[name] = v if isinstance(v, (int, float, str, bool)) or v is None else json.dumps(v)
    return out



def _set_path(d: dict[str, Any], dotted: str, value: Any, field: str) -> None:
    parts = dotted.split(".")
    cur: Any = d
    for p in parts[:-1]:
        if not isinstance(cur, dict):
            raise ValidationError(field, f"cannot descend into {p!r}", "use a dotted path into mappings")
        cur = cur.setdefault(p, {})
    if not isinstance(cur, dict):
        raise ValidationError(field, "path does not lead to a mapping", "check the dotted path")
    cur[parts[-1]] = value


def _inline_topology(exp: dict[str, Any], source: str) -> dict[str, Any]:
    """The experiment's topology as a mapping in the experiment (a bundled name or file is loaded)."""
    from topologies import load

    topo = exp.get("topology")
    if not isinstance(topo, dict):
        base = Path(source).parent if source else Path(".")
        cand = base / str(topo)
        t = load(str(cand) if cand.is_file() else str(topo))
        topo = t.to_dict()
        if t.scale != 1.0:
            topo.pop("scale", None)
            topo.setdefault("description", "")
            topo["description"] += f" (rates pre-scaled by {t.scale})"
        exp["topology"] = topo
    return topo


def _apply_wan(exp: dict[str, Any], key: str, value: Any, source: str) -> None:
    """Set a WAN shape field on every link of the experiment's topology (inlined)."""
    topo = _inline_topology(exp, source)
    for lk in topo.get("links", []):
        for side in ("forward", "reverse"):
            lk.get(side, {}).pop(key, None)
            if key == "rtt":
                lk.get(side, {}).pop("delay", None)
        if key == "rtt":
            lk.pop("delay", None)
        if key == "delay":
            lk.pop("rtt", None)
        lk[key] = value


def point_id(point: dict[str, Any]) -> str:
    slug = "_".join(f"{k.split('.')[-1]}={v}" for k, v in point.items())
    slug = re.sub(r"[^A-Za-z0-9_.=-]+", "-", slug)[:60]
    h = hashlib.sha256(json.dumps(point, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{slug}-{h}"


def expand(sweep: dict[str, Any], source: str = "") -> tuple[str, list[tuple[dict[str, Any], dict[str, Any]]]]:
    """Validate a sweep spec; return its name and (point, experiment mapping) for every grid point."""
    if not isinstance(sweep, dict):
        raise ValidationError("sweep", "expected a mapping", "see README: sweep spec")
    m = validate(SweepSpec, sweep)
    name = m.name or (Path(source).stem if source else "sweep")
    base = m.experiment
    if isinstance(base, str):
        p = Path(source).parent / base if source else Path(base)
        if not p.is_file():
            raise ValidationError("experiment", f"no experiment file {base!r}", "give a path relative to the sweep file")
        # every point is parsed with the sweep file as its source: the base's own files stay found
        base_map = rebase_files(resolve_extends(read_mapping(p), str(p)), p.parent, Path(source).parent)
        base_src = str(p)
    else:
        base_map, base_src = resolve_extends(dict(base), source), source
    grid = m.grid
    for k, vals in grid.items():
        if not vals:
            raise ValidationError(f"grid.{k}", "expected a non-empty list of values", f"e.g. {k}: [a, b]")
        if k.startswith("wan.") and k[4:] not in SHAPE_KEYS:
            raise ValidationError(f"grid.{k}", f"unknown WAN field {k[4:]!r}", f"use wan.<{'|'.join(SHAPE_KEYS)}>")
    reps = m.repetitions
    points = []
    keys = list(grid)
    for combo in itertools.product(*(grid[k] for k in keys)):
        point = dict(zip(keys, combo))
        exp = copy.deepcopy(base_map)
        exp["name"] = name
        if reps is not None:
            exp["repetitions"] = reps
        for k, v in point.items():
            if k.startswith("wan."):
                _apply_wan(exp, k[4:], v, base_src)
            elif k.startswith("topology."):  # e.g. topology.ps: [east, west]: the named topology, inlined
                _inline_topology(exp, base_src)
                _set_path(exp, k, v, f"grid.{k}")
            else:
                _set_path(exp, k, v, f"grid.{k}")
        try:
            parse_experiment(exp, source=base_src)  # validate every point before running any
        except ValidationError as e:
            raise ValidationError(f"grid point {point}: {e.field}", e.problem, e.fix) from None
        points.append((point, exp))
    return name, points


def value_name(v: Any) -> str:
    """A grid value as ``--only`` names it: a scalar as written, a scheme entry by its label (else its
    name), a list by its items' names joined with ``+`` (``schemes: [[{label: asp, ...}]]`` -> ``asp``)."""
    if isinstance(v, dict):
        return str(v.get("label") or v.get("name") or json.dumps(v, sort_keys=True))
    if isinstance(v, list):
        return "+".join(value_name(x) for x in v)
    return str(v)


def select_points(grid: dict[str, list[Any]], points: list[tuple[dict[str, Any], dict[str, Any]]],
                  only: list[str]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The points ``--only KEY=VALUE`` keeps: every named key at one of its named values (a key
    named twice keeps either value).  A point keeps its id, so the whole sweep later resumes past it.

    Raises ValidationError (field ``--only``) for a key not in the grid or a value no point has."""
    import yaml

    wanted: dict[str, list[Any]] = {}
    for item in only:
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key:
            raise ValidationError("--only", f"{item!r} is not KEY=VALUE", "e.g. --only wan.rate=20Mbit")
        if key not in grid:
            raise ValidationError("--only", f"{key!r} is not a key of the grid",
                                  f"use one of: {', '.join(grid)}")
        names = [value_name(v) for v in grid[key]]
        try:
            parsed = yaml.safe_load(raw)
        except yaml.YAMLError:
            parsed = raw
        hits = [v for v, n in zip(grid[key], names, strict=True) if n == raw or v == parsed]
        if not hits:
            raise ValidationError("--only", f"{key} has no value {raw!r}",
                                  f"use one of: {', '.join(dict.fromkeys(names))}")
        wanted.setdefault(key, []).extend(hits)
    return [(p, e) for p, e in points if all(p[k] in vals for k, vals in wanted.items())]


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the sweep; finished points are kept (``out``), rerunning resumes."""

    def __init__(self, out: Path) -> None:
        super().__init__(str(out))
        self.out = out


def run_sweep(path: str | Path, out: Path | None = None, log: Any = print, limit: int | None = None,
              preflight: Any = None, cluster: Any = None, only: list[str] | None = None) -> Path:
    """Run (or resume) a sweep; ``limit`` stops after that many *new* points (for tests).

    ``only`` (``sweep --only KEY=VALUE``): run just the points with those grid values, e.g. one
    slowdown of a campaign now and the rest another day; the points and their ids are those of the
    whole sweep, so rerunning without ``only`` skips them as done.

    ``preflight(spec)`` is called for every point before the first runs (what would make its
    trials fail: not root, no impairment backend...), so a bad machine stops the sweep at once.
    ``cluster(spec)``: the servers every point's trials spread over (``sweep --cluster``: the cluster file
    checked against the point's spec), or None for this machine; finished points ran on the same servers
    or the sweep is refused (a point's ``done.json`` records them).
    """
    path = Path(path)
    sweep = read_mapping(path)
    name, points = expand(sweep, str(path))
    out = out or Path(sweep.get("results_dir", "results")) / name / "sweep"
    everything = points
    if only:
        points = select_points(sweep["grid"], points, only)

    def spec_of(exp: dict[str, Any]) -> Any:
        spec = parse_experiment(exp, source=str(path))
        if cluster is not None:
            spec.cluster = cluster(spec)
        return spec

    specs = [spec_of(exp) for _, exp in points]  # every point's spec and cluster errors before anything runs
    servers = _servers(specs[0]) if specs else None
    _refuse_changed_points(out, points, servers)  # a spec error: said before anything about the machine
    if preflight is not None:
        for spec in specs:
            preflight(spec)
    fresh = missing_parents(out)
    try:
        if only:
            log(f"sweep: {len(points)} of {len(everything)} points ({', '.join(only)})")
        return _run_points(out, sweep, points, everything, log, limit, spec_of, servers)
    finally:  # under sudo, the results belong to the user who typed it (also after Ctrl-C)
        hand_over([fresh[-1] if fresh else out])


def _servers(spec: Any) -> dict[str, Any] | None:
    """Where a point's trials run, as ``done.json`` records it: None for this machine, else the cluster."""
    c = getattr(spec, "cluster", None)
    return None if c is None else c.to_dict()


def _run_points(out: Path, sweep: dict[str, Any], points: list[tuple[dict[str, Any], dict[str, Any]]],
                everything: list[tuple[dict[str, Any], dict[str, Any]]], log: Any, limit: int | None,
                spec_of: Any, servers: dict[str, Any] | None) -> Path:
    try:
        (out / "points").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValidationError("results_dir", f"cannot write the sweep's results to {out}: {e.strerror}",
                              "use a writable directory (results_dir: in the sweep, or --out DIR)") from None
    write_json_atomic(out / "sweep.json", {"spec": sweep, "points": [p for p, _ in everything]}, indent=2)
    ran = 0
    for i, (point, exp) in enumerate(points):
        pdir = out / "points" / point_id(point)
        if (pdir / "done.json").exists():
            log(f"point {i + 1}/{len(points)} {point}: done already, skipped")
            continue
        if limit is not None and ran >= limit:
            break
        if pdir.exists():  # a point interrupted half-way: start it again from scratch
            import shutil

            shutil.rmtree(pdir)
        log(f"point {i + 1}/{len(points)} {point}")
        spec = spec_of(exp)
        spec.sweep_point = sweep_values(point)
        res = run_experiment(spec, run_dir=pdir, report=False, heading=f"point {i + 1}/{len(points)}")
        ran += 1
        if res.disk_error:
            raise RecordsUnwritable(f"point {point}: {res.disk_error} (finished points are kept; rerunning resumes)")
        if res.interrupted:
            log("sweep interrupted; rerun the same command to resume")
            raise SweepInterrupted(out)
        write_json_atomic(pdir / "done.json", {"point": point, "experiment_hash": experiment_hash(exp),
                                               "finished": time.time(), **({"servers": servers} if servers else {}),
                                               "failed": [f"{t.label}-r{t.rep}" for t in res.failed]})
    summarise(out, log)
    return out


def experiment_hash(exp: dict[str, Any]) -> str:
    """A point's whole experiment (the base with the point applied), hashed: what it really ran."""
    return hashlib.sha256(json.dumps(exp, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _refuse_changed_points(out: Path, points: list[tuple[dict[str, Any], dict[str, Any]]],
                           servers: dict[str, Any] | None = None) -> None:
    """Resuming must never pool a finished point run under another spec with new ones.

    A point's id names its grid values only, so editing the base experiment (a target, a learning
    rate, the compute model) and rerunning would otherwise skip the old points as "done" and mix two
    experiments in one table.  Checked for every finished point before any point runs.
    """
    stale = []
    for point, exp in points:
        done = out / "points" / point_id(point) / "done.json"
        if not done.is_file():
            continue
        try:
            rec = json.loads(done.read_text())
        except (OSError, ValueError):
            continue
        old = rec.get("experiment_hash")
        if (old is not None and old != experiment_hash(exp)) or rec.get("servers") != servers:
            stale.append(point_id(point))
    if stale:
        raise ValidationError(
            "sweep", f"{len(stale)} finished point(s) in {out} ran a different experiment than the sweep now "
            f"describes (the base experiment or the sweep was edited since, or its servers differ: --cluster): "
            f"{', '.join(stale[:3])}"
            + (" ..." if len(stale) > 3 else ""),
            f"run the changed sweep into a new folder (--out, or another name:), or delete those points' "
            f"folders under {out / 'points'} to redo them")


def summarise(out: Path, log: Any = print) -> Path:
    """Report on every point (figures per point, sweep figures) and write ``sweep.csv``.

    ``sweep.csv`` *is* the report's summary table of ``points/`` (one row per scheme and
    sweep value: time to target, throughput, sync shares, staleness, WAN bytes, final loss,
    each with its Student-t 95 % CI half-width and n), so a sweep and a report can never
    disagree on a definition (docs/CONTRACTS.md "Definitions").
    """
    from ..analysis.report import Options, report

    path = out / "sweep.csv"
    try:
        rep = report(out / "points", Options(traces=False))
    except Exception as e:  # the points' own records stand on their own
        log(f"sweep report failed: {type(e).__name__}: {e} (rerun: testbed report {out / 'points'})")
        return path
    table = out / "points" / "tables" / "summary.csv"
    if table.is_file():
        text = table.read_text()
        header, _, rest = text.partition("\n")
        write_atomic(path, ",".join(c.removeprefix("sweep_") for c in header.split(",")) + "\n" + rest)
    else:
        log("sweep: no summary table (no trial produced records)"
            + (f"; {'; '.join(rep.errors[:3])}" if getattr(rep, "errors", None) else ""))
    return path
