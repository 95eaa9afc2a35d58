"""``testbed sweep``: a grid over spec fields, resumable, summarised with 95 % CIs.

```yaml
name: rate_sweep
experiment: demo.yaml         # base experiment (path, relative to this file) or an inline mapping
repetitions: 2                # per point (overrides the base)
grid:                         # the cartesian product of these lists
  wan.rate: [20Mbit, 50Mbit]  # wan.<field>: every WAN link, both directions (rate, delay, rtt, jitter, loss)
  wan.delay: [5ms, 20ms]
  training.scheme.groups: [1, 3]   # any dotted path into the experiment mapping
  schemes: [[bsp], [gsyn]]    # top-level keys too
```
Each point runs as its own experiment under ``points/<id>/``; a point is
done once ``points/<id>/done.json`` exists, so an interrupted sweep resumes
where it stopped and never redoes finished points.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import io
import itertools
import json
import math
import re
import time
from pathlib import Path
from typing import Any

from topologies.loader import read_mapping
from traffic_control.errors import ValidationError, check_keys
from traffic_control.files import write_atomic, write_json_atomic
from traffic_control.shape import SHAPE_KEYS

from .runner import RecordsUnwritable, run_experiment
from .spec import parse_experiment

SWEEP_KEYS = ("name", "experiment", "grid", "repetitions", "results_dir", "metric")


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


def _apply_wan(exp: dict[str, Any], key: str, value: Any, source: str) -> None:
    """Set a WAN shape field on every link of the experiment's topology (inlined)."""
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
    check_keys(sweep, SWEEP_KEYS)
    name = sweep.get("name") or (Path(source).stem if source else "sweep")
    base = sweep.get("experiment")
    if isinstance(base, str):
        p = Path(source).parent / base if source else Path(base)
        if not p.is_file():
            raise ValidationError("experiment", f"no experiment file {base!r}", "give a path relative to the sweep file")
        base_map = read_mapping(p)
        base_src = str(p)
    elif isinstance(base, dict):
        base_map, base_src = base, source
    else:
        raise ValidationError("experiment", "missing base experiment", "experiment: demo.yaml or an inline mapping")
    grid = sweep.get("grid")
    if not isinstance(grid, dict) or not grid:
        raise ValidationError("grid", "expected a non-empty mapping of field -> list of values",
                              "e.g. grid: {wan.rate: [20Mbit, 50Mbit]}")
    for k, vals in grid.items():
        if not isinstance(vals, list) or not vals:
            raise ValidationError(f"grid.{k}", "expected a non-empty list of values", f"e.g. {k}: [a, b]")
        if k.startswith("wan.") and k[4:] not in SHAPE_KEYS:
            raise ValidationError(f"grid.{k}", f"unknown WAN field {k[4:]!r}", f"use wan.<{'|'.join(SHAPE_KEYS)}>")
    reps = sweep.get("repetitions")
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
            else:
                _set_path(exp, k, v, f"grid.{k}")
        try:
            parse_experiment(exp, source=base_src)  # validate every point before running any
        except ValidationError as e:
            raise ValidationError(f"grid point {point}: {e.field}", e.problem, e.fix) from None
        points.append((point, exp))
    return name, points


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the sweep; finished points are kept (``out``), rerunning resumes."""

    def __init__(self, out: Path) -> None:
        super().__init__(str(out))
        self.out = out


def run_sweep(path: str | Path, out: Path | None = None, log: Any = print, limit: int | None = None,
              preflight: Any = None) -> Path:
    """Run (or resume) a sweep; ``limit`` stops after that many *new* points (for tests).

    ``preflight(spec)`` is called for every point before the first runs (what would make its
    trials fail: not root, no impairment backend...), so a bad machine stops the sweep at once.
    """
    path = Path(path)
    sweep = read_mapping(path)
    name, points = expand(sweep, str(path))
    if preflight is not None:
        for _, exp in points:
            preflight(parse_experiment(exp, source=str(path)))
    out = out or Path(sweep.get("results_dir", "results")) / name / "sweep"
    try:
        (out / "points").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValidationError("results_dir", f"cannot write the sweep's results to {out}: {e.strerror}",
                              "use a writable directory (results_dir: in the sweep, or --out DIR)") from None
    write_json_atomic(out / "sweep.json", {"spec": sweep, "points": [p for p, _ in points]}, indent=2)
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
        spec = parse_experiment(exp, source=str(path))
        res = run_experiment(spec, run_dir=pdir, report=False)
        ran += 1
        if res.disk_error:
            raise RecordsUnwritable(f"point {point}: {res.disk_error} (finished points are kept; rerunning resumes)")
        if res.interrupted:
            log("sweep interrupted; rerun the same command to resume")
            raise SweepInterrupted(out)
        write_json_atomic(pdir / "done.json", {"point": point, "finished": time.time(),
                                               "failed": [f"{t.label}-r{t.rep}" for t in res.failed]})
    summarise(out, points)
    return out


def _trial_stats(tdir: Path) -> dict[str, float] | None:
    p = tdir / "metrics.csv"
    if not p.exists():
        return None
    rows = list(csv.DictReader(p.open()))
    if not rows:
        return None
    last = rows[-1]
    try:
        wall = float(last["wall_s"])
        steps = float(last["step"])
        loss = float(last["loss"]) if last.get("loss") not in (None, "") else math.nan
    except (KeyError, ValueError):
        return None
    return {"wall_s": wall, "steps": steps, "throughput": steps / wall if wall > 0 else math.nan, "loss": loss}


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of the 95 % confidence interval (Student t; :mod:`testbed.analysis.stats`)."""
    from ..analysis.stats import ci95

    mean, half, _ = ci95(values)
    return mean, half


def summarise(out: Path, points: list[tuple[dict[str, Any], dict[str, Any]]]) -> Path:
    """``sweep.csv``: per point and scheme, mean and 95 % CI of throughput, final loss and wall time."""
    rows = []
    for point, _ in points:
        pdir = out / "points" / point_id(point)
        by_label: dict[str, list[dict[str, float]]] = {}
        for tdir in sorted((pdir / "trials").glob("*-r*")):
            label = tdir.name.rsplit("-r", 1)[0]
            st = _trial_stats(tdir)
            if st:
                by_label.setdefault(label, []).append(st)
        for label, sts in by_label.items():
            row: dict[str, Any] = {**{k: v for k, v in point.items()}, "scheme": label, "n": len(sts)}
            for metric in ("throughput", "loss", "wall_s"):
                m, ci = mean_ci([s[metric] for s in sts])
                row[f"{metric}_mean"], row[f"{metric}_ci95"] = m, ci
            rows.append(row)
    path = out / "sweep.csv"
    if rows:
        cols: list[str] = []
        for r in rows:
            cols += [c for c in r if c not in cols]
        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
        write_atomic(path, buf.getvalue())
    try:
        from ..analysis.report import Options, report

        report(out / "points", Options(traces=False))
    except Exception as e:  # the sweep's records and sweep.csv stand on their own
        print(f"sweep report failed: {e} (rerun: testbed report {out / 'points'})")
    return path
