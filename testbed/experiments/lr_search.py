"""A per-scheme learning-rate search before the trials (README "Learning rates").

Why: one lr for every scheme favours whichever scheme it happens to suit; a reviewer asks
that every baseline be tuned.  With an ``lr_search:`` section, ``testbed run`` first trains
each compared scheme at several log-spaced learning rates on a *separate seed* (never one of
the repetitions' seeds, so the reported trials are not the ones the lr was picked on), keeps
each scheme's best, and then runs the real trials with it::

    lr_search:
      values: [0.01, 0.03, 0.1, 0.3]       # or {low: 0.01, high: 1.0, count: 5}; default:
                                           # each scheme's own lr x 10^[-1, -0.5, 0, 0.5, 1]
      seed: 1001                           # default: the experiment's seed + 1000
      steps: 40                            # optional budget per search trial (else the trial's stop)
      wall_s: 30s
      target: {metric: loss, value: 0.5}   # default: the trial's stop.target
      give_up: {metric: loss, value: 2.0, after_s: 60s}   # optional: stop hopeless values early
      schemes: [bsp-ring, asp]             # labels to search (default: all)

A value is ``training.optimizer.lr`` as written: the scheme's ``lr_rule`` still applies to it
(the records show both).  Best = the shortest time to the target
(``testbed.analysis.tables.time_to_target``, the reports' one definition); values that tie
or never reach it are ranked by their final held-out loss; failed trials rank last (a scheme
whose every value failed keeps its given lr, and the record says so).  ``give_up`` becomes the
search trials' ``stop.give_up`` (``testbed.training.config.GiveUpConfig``), so a diverged value
stops at ``after_s`` instead of training to the cap; such a row's ``reason`` says when and why.
The real trials keep their own ``stop`` (every repetition runs to its target or its cap).

Records: ``lr_search/<label>/lr=<v>/`` (each an ordinary trial directory, manifest and all),
``lr_search/lr_search.csv`` (one row per value) and ``lr_search/lr_search.json`` (values,
seed, target, every result, each scheme's pick).  Every real trial's manifest gets
``lr_provenance``: ``{"source": "searched", "search": <path of lr_search.json>, "value"}``
or ``{"source": "given"}``.  ``testbed run --skip-lr-search`` runs at the given lrs;
``--lr-search-from DIR`` reuses the picks of an earlier run's search.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from traffic_control.errors import ValidationError
from traffic_control.fields import Duration, SpecModel, unit_field
from traffic_control.files import write_atomic, write_json_atomic

if TYPE_CHECKING:
    from .spec import ExperimentSpec, SchemeRun

__all__ = ["LrSearch", "LrSearchSpec", "SEED_OFFSET", "apply_picks", "choose", "load_picks", "log_spaced",
           "check_seed", "parse_lr_search", "run_lr_search"]

#: default search seed = the experiment's seed + this (apart from every repetition's seed + r)
SEED_OFFSET = 1000
#: default grid: each scheme's own lr times 10 ** these exponents (5 log-spaced values, ratio sqrt(10))
DEFAULT_EXPONENTS = (-1.0, -0.5, 0.0, 0.5, 1.0)
MIN_VALUES = 4


class LrTargetSpec(SpecModel):
    """the held-out metric the search times (acc >= value, loss <= value)"""

    metric: Literal["loss", "acc"] = unit_field(..., fix="metric: loss or metric: acc")
    value: float = unit_field(..., fix="e.g. value: 0.5")


class LrGiveUpSpec(SpecModel):
    """stop a search trial whose metric is still worse than ``value`` after ``after_s`` seconds"""

    metric: Literal["loss", "acc"] = unit_field(..., fix="metric: loss or metric: acc")
    value: float = unit_field(..., fix="e.g. value: 2.0 (past chance-level loss)")
    after_s: Duration = unit_field(..., ge=0, fix="e.g. after_s: 60s")


class LrRangeSpec(SpecModel):
    """``count`` log-spaced values from ``low`` to ``high`` (both included)"""

    low: float = unit_field(..., gt=0, fix="e.g. low: 0.01")
    high: float = unit_field(..., gt=0, fix="e.g. high: 1.0")
    count: int = unit_field(5, ge=MIN_VALUES, fix=f"at least {MIN_VALUES} values")


class LrSearchSpec(SpecModel):
    """Per-scheme lr search before the trials (module doc of testbed.experiments.lr_search)."""

    values: list[float] | LrRangeSpec | None = unit_field(
        None, fix="e.g. values: [0.01, 0.03, 0.1, 0.3] or values: {low: 0.01, high: 1, count: 5}")
    """learning rates tried per scheme (default: each scheme's lr x 10^[-1, -0.5, 0, 0.5, 1])"""
    seed: int | None = unit_field(None, fix="a seed none of the repetitions uses, e.g. seed: 1001")
    """training seed of the search trials (default: the experiment's seed + 1000)"""
    steps: int | None = unit_field(None, ge=1, fix="e.g. steps: 40")
    """step budget of each search trial (default: the trial's own stop.steps)"""
    wall_s: Duration | None = unit_field(None, gt=0, fix="e.g. wall_s: 30s")
    """wall-clock budget of each search trial (default: the trial's own stop.wall_s)"""
    target: LrTargetSpec | None = unit_field(None, fix="e.g. target: {metric: loss, value: 0.5}")
    """what time-to-target means for the pick (default: the trial's stop.target)"""
    give_up: LrGiveUpSpec | None = unit_field(None, fix="e.g. give_up: {metric: loss, value: 2.0, after_s: 60s}")
    """each search trial's stop.give_up: hopeless values stop early (default: none; the trial's own)"""
    schemes: list[str] | None = unit_field(None, min_length=1, fix="labels from schemes:, e.g. [bsp, asp]")
    """labels of the compared schemes to search (default: all)"""


@dataclass
class LrSearch:
    """The validated ``lr_search`` section."""

    seed: int
    values: list[float] | None = None  # None: DEFAULT_EXPONENTS around each scheme's lr
    steps: int | None = None
    wall_s: float | None = None
    target: dict[str, Any] | None = None  # {metric, value}
    schemes: list[str] | None = None  # labels; None = all
    give_up: dict[str, Any] | None = None  # {metric, value, after_s}: the search trials' stop.give_up

    def values_for(self, base_lr: float) -> list[float]:
        if self.values is not None:
            return list(self.values)
        return [float(f"{base_lr * 10 ** e:.6g}") for e in DEFAULT_EXPONENTS]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def log_spaced(low: float, high: float, count: int) -> list[float]:
    """``count`` values from ``low`` to ``high``, each the previous times one constant ratio."""
    ratio = (high / low) ** (1.0 / (count - 1))
    return [float(f"{low * ratio ** i:.6g}") for i in range(count)]


def parse_lr_search(m: LrSearchSpec | None, exp_seed: int, repetitions: int, labels: Sequence[str],
                    field: str = "lr_search") -> LrSearch | None:
    """The section validated against the experiment (its seeds, its labels)."""
    if m is None:
        return None
    values: list[float] | None = None
    if isinstance(m.values, LrRangeSpec):
        if m.values.high <= m.values.low:
            raise ValidationError(f"{field}.values.high", f"must be > low ({m.values.low}), got {m.values.high}",
                                  "give low < high")
        values = log_spaced(m.values.low, m.values.high, m.values.count)
    elif m.values is not None:
        values = [float(v) for v in m.values]
        bad = [v for v in values if not v > 0]
        if bad:
            raise ValidationError(f"{field}.values", f"learning rates must be > 0, got {bad[0]}", "use positive values")
        if len(set(values)) < MIN_VALUES:
            raise ValidationError(f"{field}.values", f"{len(set(values))} distinct values; a search needs at least "
                                  f"{MIN_VALUES}", "e.g. values: [0.01, 0.03, 0.1, 0.3] (log-spaced)")
        values = sorted(set(values))
    seed = exp_seed + SEED_OFFSET if m.seed is None else m.seed
    if exp_seed <= seed < exp_seed + repetitions:
        raise ValidationError(f"{field}.seed", f"seed {seed} is repetition {seed - exp_seed}'s seed "
                              f"(repetitions use {exp_seed}..{exp_seed + repetitions - 1})",
                              "search on a seed no trial uses, or drop seed (default: seed + 1000)")
    for i, label in enumerate(m.schemes or []):
        if label not in labels:
            raise ValidationError(f"{field}.schemes[{i}]", f"no compared scheme is labelled {label!r}",
                                  f"use labels from: {', '.join(labels)}")
    target = m.target.model_dump() if m.target is not None else None
    give_up = None
    if m.give_up is not None:
        give_up = dict(m.give_up.model_dump(), after_s=float(m.give_up.after_s))
    return LrSearch(seed, values, m.steps, float(m.wall_s) if m.wall_s is not None else None, target,
                    list(m.schemes) if m.schemes else None, give_up)


def check_seed(spec: ExperimentSpec) -> None:
    """The search seed is no repetition's seed (again after a ``--repetitions`` override)."""
    search = spec.lr_search
    if search is not None and spec.seed <= search.seed < spec.seed + spec.repetitions:
        raise ValidationError("lr_search.seed", f"seed {search.seed} is repetition {search.seed - spec.seed}'s "
                              f"seed (repetitions use {spec.seed}..{spec.seed + spec.repetitions - 1})",
                              "search on a seed no trial uses, or drop seed (default: seed + 1000)")


# ----------------------------------------------------------------------------- the pick
@dataclass
class Row:
    """One search trial's outcome."""

    scheme: str
    lr: float  # training.optimizer.lr tried
    status: str
    time_to_target_s: float  # NaN: not reached
    final_loss: float  # NaN: none recorded
    lr_used: Any = None  # the resolved lr(s) the processes applied (the trial manifest's lr.lr)
    dir: str = ""
    reason: str = ""
    picked: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _key(row: Row) -> tuple[int, float, float]:
    ok = row.status == "ok"
    reached = ok and not math.isnan(row.time_to_target_s)
    loss = row.final_loss if ok and not math.isnan(row.final_loss) else math.inf
    return (0 if reached else 1 if ok else 2, row.time_to_target_s if reached else math.inf, loss)


def choose(rows: Sequence[Row]) -> Row | None:
    """The best row: reached the target soonest; ties and never-reached by final loss; failed last.

    None when every trial failed (nothing to learn from them)."""
    usable = [r for r in rows if r.status == "ok"]
    if not usable:
        return None
    return min(usable, key=lambda r: (_key(r), r.lr))


# ----------------------------------------------------------------------------- running
def _stop_with_budget(training: dict[str, Any], search: LrSearch) -> dict[str, Any]:
    stop = dict(training.get("stop") or {})
    if search.steps is not None:
        stop["steps"] = search.steps
    if search.wall_s is not None:
        stop["wall_s"] = search.wall_s
    if search.target is not None:
        stop["target"] = dict(search.target)
    if search.give_up is not None:
        stop["give_up"] = dict(search.give_up)
    return stop


def _target_of(training: dict[str, Any]) -> dict[str, Any] | None:
    t = (training.get("stop") or {}).get("target")
    return dict(t) if isinstance(t, dict) and t.get("metric") in ("loss", "acc") else None


def _outcome(trial_dir: Path, target: dict[str, Any] | None) -> tuple[float, float]:
    """(time to target, final held-out loss) from the trial's metrics.csv (NaN where unknown).

    Multi-expert metrics: the final loss is the mean of every expert's last loss."""
    m = _metrics(trial_dir)
    if m is None:
        return math.nan, math.nan

    from ..analysis.tables import time_to_target

    ttt = math.nan
    if target is not None:
        ttt = time_to_target(m, target["value"] if target["metric"] == "loss" else None,
                             target["value"] if target["metric"] == "acc" else None)
    ordered = m.sort_values("wall_s", kind="stable")
    if "expert" in ordered.columns and ordered["expert"].notna().any():
        final = float(ordered.groupby("expert")["loss"].last().mean())
    else:
        final = float(ordered["loss"].iloc[-1])
    return float(ttt), final


def _metrics(trial_dir: Path) -> Any:
    """The trial's metrics.csv as a frame with numeric loss, or None when there is none."""
    import pandas as pd

    try:
        m = pd.read_csv(trial_dir / "metrics.csv")
    except (OSError, ValueError):
        return None
    if m.empty or "loss" not in m.columns:
        return None
    return m.assign(loss=pd.to_numeric(m["loss"], errors="coerce"))


def gave_up_reason(trial_dir: Path, rule: dict[str, Any] | None) -> str:
    """"gave up at T s (loss L > V)" when the trial's metrics show ``stop.give_up`` stopping it, else "".

    The first evaluation (in the order written) that meets the rule
    (``testbed.training.evaluator.gives_up``, the rule the evaluator applied) is the one it stopped at.
    An empty ``acc`` cell (a workload without accuracy) is no value, as in the evaluator."""
    m = _metrics(trial_dir) if rule is not None else None
    if m is None:
        return ""
    import pandas as pd

    from ..training.config import GiveUpConfig
    from ..training.evaluator import gives_up

    g = GiveUpConfig(**rule)
    for row in m.to_dict("records"):
        res = {"loss": row["loss"], "acc": None if pd.isna(row.get("acc")) else row["acc"]}
        if gives_up(g, res, float(row["wall_s"])):
            v = res.get(g.metric)
            if not math.isfinite(float(res["loss"])) or v is None:
                why = "non-finite loss"
            else:
                why = f"{g.metric} {float(v):.4g} {'>' if g.metric == 'loss' else '<'} {g.value:g}"
            return f"gave up at {float(row['wall_s']):.1f} s ({why})"
    return ""


def _lr_used(trial_dir: Path) -> Any:
    try:
        man = json.loads((trial_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    rec = man.get("lr")
    return rec.get("lr") if isinstance(rec, dict) else None


def _name(v: float) -> str:
    return f"lr={v:.6g}"


TrialFn = Callable[..., Any]  # run_trial(spec, scheme, rep, trial_dir, progress=, log=, stop_flag=, name=) -> TrialResult


def run_lr_search(spec: ExperimentSpec, run_dir: Path, trial_fn: TrialFn | None = None,
                  log: Callable[[str], None] = print, stop_flag: Callable[[], bool] | None = None,
                  progress: Any = None) -> dict[str, dict[str, Any]]:
    """Run the search of ``spec.lr_search``; write its records; return ``{label: pick}``.

    ``trial_fn`` defaults to :func:`testbed.experiments.trial.run_trial` (a fresh network per
    trial); tests pass a fake with the same signature.  A pick is ``{"lr", "source":
    "searched", "search", "value"}``, or ``{"source": "given", ...}`` when every value failed.
    """
    search = spec.lr_search
    assert search is not None
    if trial_fn is None:
        from .trial import run_trial as trial_fn
    stopped = stop_flag or (lambda: False)
    out = run_dir / "lr_search"
    out.mkdir(parents=True, exist_ok=True)
    sspec = dataclasses.replace(spec, seed=search.seed)  # run_trial seeds with spec.seed + rep (rep 0)
    labels = search.schemes or [s.label for s in spec.schemes]
    rows: list[Row] = []
    record: dict[str, Any] = {"seed": search.seed, "search": search.to_dict(), "schemes": {}}
    picks: dict[str, dict[str, Any]] = {}
    json_path = out / "lr_search.json"
    for scheme in spec.schemes:
        if scheme.label not in labels:
            continue
        base_lr = float((scheme.training.get("optimizer") or {}).get("lr", _default_lr()))
        values = search.values_for(base_lr)
        training0 = copy.deepcopy(scheme.training)
        training0["stop"] = _stop_with_budget(training0, search)
        target = _target_of(training0)
        mine: list[Row] = []
        for v in values:
            if stopped():
                break
            training = copy.deepcopy(training0)
            training.setdefault("optimizer", {})
            training["optimizer"] = dict(training["optimizer"], lr=v)
            run = dataclasses.replace(scheme, training=training)
            tdir = out / scheme.label / _name(v)
            log(f"lr search {scheme.label}: lr {v:g} (seed {search.seed}) ...")
            if progress is not None:
                progress.start_trial(f"lr search {scheme.label} {_name(v)}", training["stop"].get("steps"),
                                     training["stop"].get("wall_s"))
            tr = trial_fn(sspec, run, 0, tdir, progress=getattr(progress, "update", None), log=log,
                          stop_flag=stopped, name=f"lr search {scheme.label} lr={v:g}")
            if progress is not None:
                progress.finish_trial()
            ttt, final = _outcome(tdir, target)
            gave_up = gave_up_reason(tdir, training["stop"].get("give_up")) if math.isnan(ttt) else ""
            row = Row(scheme.label, v, tr.status, ttt, final, _lr_used(tdir), str(tdir.relative_to(run_dir)),
                      "; ".join(r for r in (tr.reason, gave_up) if r))
            log(f"lr search {scheme.label}: lr {v:g}: {tr.status}, time to target "
                f"{'-' if math.isnan(ttt) else f'{ttt:.2f} s'}, final loss {final:.4g}"
                + (f", {gave_up}" if gave_up else ""))
            mine.append(row)
        best = choose(mine)
        if best is not None:
            best.picked = True
            picks[scheme.label] = {"lr": best.lr, "source": "searched", "search": str(json_path),
                                   "value": best.lr, "seed": search.seed}
            edge = grid_edge(best.lr, [r.lr for r in mine])
            if edge is not None:  # the best lr may lie beyond what was tried: a tuned baseline it is not
                picks[scheme.label]["at_edge"] = edge
                log(f"warning: lr search {scheme.label}: the pick {best.lr:g} is the {edge} value tried; "
                    f"the best lr may lie beyond it: extend lr_search.values past {best.lr:g} and rerun")
        else:
            picks[scheme.label] = {"lr": base_lr, "source": "given",
                                   "note": "every search trial failed; the given lr was kept", "search": str(json_path)}
        criterion = "time_to_target, then final_loss" if target else "final_loss (no target)"
        record["schemes"][scheme.label] = {"values": values, "given_lr": base_lr, "target": target,
                                           "criterion": criterion, "pick": picks[scheme.label],
                                           "results": [_row_json(r) for r in mine]}
        rows += mine
        _write(out, rows, record)
        if stopped():
            break
    record["picks"] = picks
    _write(out, rows, record)
    return picks


def grid_edge(pick: float, tried: Sequence[float]) -> str | None:
    """``"largest"``/``"smallest"`` when ``pick`` is an end of the values tried (3 or more), else None."""
    if len(set(tried)) < 3:
        return None
    if pick >= max(tried):
        return "largest"
    if pick <= min(tried):
        return "smallest"
    return None


def _default_lr() -> float:
    from ..training.config import OptimizerConfig

    return OptimizerConfig().lr


def _row_json(r: Row) -> dict[str, Any]:
    d = dataclasses.asdict(r)
    d.pop("extra")
    for k in ("time_to_target_s", "final_loss"):
        if isinstance(d[k], float) and math.isnan(d[k]):
            d[k] = None
    return d


COLUMNS = ("scheme", "lr", "lr_used", "status", "time_to_target_s", "final_loss", "picked", "seed", "dir", "reason")


def _write(out: Path, rows: Sequence[Row], record: dict[str, Any]) -> None:
    seed = record["seed"]
    lines: list[list[Any]] = [list(COLUMNS)]
    for r in rows:
        lines.append([r.scheme, r.lr, json.dumps(r.lr_used), r.status,
                      "" if math.isnan(r.time_to_target_s) else r.time_to_target_s,
                      "" if math.isnan(r.final_loss) else r.final_loss, r.picked, seed, r.dir, r.reason])
    import io

    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(lines)
    write_atomic(out / "lr_search.csv", buf.getvalue())
    write_json_atomic(out / "lr_search.json", record, indent=2)


def load_picks(path: Path | str, field: str = "--lr-search-from") -> dict[str, dict[str, Any]]:
    """The picks of an earlier search: a run directory, its ``lr_search/`` or the JSON itself."""
    p = Path(path)
    for cand in (p, p / "lr_search.json", p / "lr_search" / "lr_search.json"):
        if cand.is_file():
            try:
                data = json.loads(cand.read_text())
            except ValueError as e:
                raise ValidationError(field, f"{cand} is not valid JSON: {e}", "give an lr_search.json") from None
            picks = data.get("picks") or {k: v.get("pick") for k, v in (data.get("schemes") or {}).items()}
            out = {}
            for label, pick in picks.items():
                if isinstance(pick, dict) and "lr" in pick:
                    out[label] = dict(pick, search=str(cand.resolve()),
                                      source="searched" if pick.get("source") == "searched" else "given",
                                      reused=True)
            return out
    raise ValidationError(field, f"no lr_search.json at {p}", "give a run directory whose run had lr_search:")


def apply_picks(schemes: Sequence[SchemeRun], picks: dict[str, dict[str, Any]]) -> list[SchemeRun]:
    """The schemes with each picked lr put into ``training.optimizer.lr`` and its provenance noted."""
    out = []
    for s in schemes:
        pick = picks.get(s.label)
        if pick is None:
            out.append(dataclasses.replace(s, lr_provenance={"source": "given"}))
            continue
        training = copy.deepcopy(s.training)
        training["optimizer"] = dict(training.get("optimizer") or {}, lr=float(pick["lr"]))
        prov = {k: v for k, v in pick.items() if k != "lr"}
        prov["given_lr"] = (s.training.get("optimizer") or {}).get("lr")
        out.append(dataclasses.replace(s, training=training, lr_provenance=prov))
    return out
