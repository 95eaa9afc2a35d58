"""``testbed report``: traces, tables, figures and summary.md from stored records only.

Accepts a trial, run or experiment directory.  It never reruns anything
and never stops at the first damaged file: every step (a trace, a table, a
figure) is attempted on its own, and what was missing, skipped or failed is
collected into :class:`Report` and written into ``summary.md``.

Manifest keys it reads when present (none is required):

* run or trial ``manifest.json``: ``target`` = ``{"loss": x}`` or ``{"acc": y}``
  (target for time-to-target), ``sweep`` = ``{param: value}`` (swept
  parameter values of this run), ``predicted_optimum`` = ``{param: value}``
  or ``{param: {scheme: value}}`` (e.g. the Gsyn planner's G),
  ``link_capacity_bps`` = ``{"A->B": bps}``, ``plan`` = a BLP plan dict,
  ``clock_offsets_ns`` = ``{host: ns}``;
* ``plan.json`` in a trial or run directory: a BLP plan dict (figure 7).
"""

from __future__ import annotations

import json
import math
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from testbed.analysis import figures, tables
from testbed.collect.records import classify_dir, read_json, run_dirs, trial_dirs
from testbed.collect.trace import GZIP_THRESHOLD_BYTES, merge_trial
from traffic_control.files import write_atomic


@dataclass
class Report:
    """What a report run produced and what it could not."""

    root: Path
    kind: str
    outputs: list[Path] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: what makes the numbers questionable without being missing (runs of different specs pooled)
    warnings: list[str] = field(default_factory=list)
    summary: Path | None = None
    #: figures an earlier report drew in a ``figures/`` that this one did not (removed: they no longer
    #: match the records, e.g. a pooled figure from before a sweep value split it)
    removed: list[Path] = field(default_factory=list)
    #: the per-scheme summary table's rows (what summary.md shows), for ``--json``
    summary_rows: list[dict[str, Any]] = field(default_factory=list)

    def merge(self, other: Report, prefix: str = "") -> None:
        self.outputs += other.outputs
        self.missing += [prefix + m for m in other.missing]
        self.skipped += [prefix + m for m in other.skipped]
        self.errors += [prefix + m for m in other.errors]
        self.warnings += [prefix + m for m in other.warnings]
        self.removed += other.removed


@dataclass
class Options:
    target_loss: float | None = None
    target_acc: float | None = None
    steps: tuple[int, int] | None = None
    traces: bool = True
    gzip_threshold: int = GZIP_THRESHOLD_BYTES
    show_traceback: bool = False


def _attempt(rep: Report, what: str, fn: Callable[[], Any], opts: Options) -> Any:
    """Run one step; NoData -> skipped, any other exception -> error (no traceback unless asked)."""
    try:
        return fn()
    except figures.NoData as exc:
        rep.skipped.append(f"{what}: {exc}")
    except Exception as exc:
        msg = f"{what}: {type(exc).__name__}: {exc}"
        if opts.show_traceback:
            msg += "\n" + traceback.format_exc()
        rep.errors.append(msg)
    return None


def _resolve_target(opts: Options, manifests: list[dict[str, Any]], metrics: pd.DataFrame
                    ) -> tuple[float | None, float | None, str]:
    if opts.target_acc is not None:
        return None, opts.target_acc, f"held-out accuracy >= {opts.target_acc:g} (command line)"
    if opts.target_loss is not None:
        return opts.target_loss, None, f"held-out loss <= {opts.target_loss:g} (command line)"
    for m in manifests:
        tgt = m.get("target")
        if isinstance(tgt, dict):
            if isinstance(tgt.get("acc"), (int, float)):
                return None, float(tgt["acc"]), f"held-out accuracy >= {tgt['acc']:g} (manifest)"
            if isinstance(tgt.get("loss"), (int, float)):
                return float(tgt["loss"]), None, f"held-out loss <= {tgt['loss']:g} (manifest)"
    loss, why = tables.default_target(metrics)
    if loss is None:
        return None, None, f"none ({why})"
    return loss, None, f"held-out loss <= {loss:.4g}: the {why}"


def _first_trial_per_scheme(t: tables.Tables) -> list[tuple[str, str, str]]:
    """(run, trial, scheme) of the lowest repetition of each scheme (per run)."""
    if t.trials.empty:
        return []
    df = t.trials.sort_values(["run", "scheme", "rep", "trial"], na_position="last")
    first = df.groupby(["run", "scheme"], sort=True).head(1)
    return [(str(r.run), str(r.trial), str(r.scheme)) for r in first.itertuples()]


def _trial_manifest(t: tables.Tables, run: str, trial: str) -> dict[str, Any]:
    row = t.trials[(t.trials["run"] == run) & (t.trials["trial"] == trial)]
    if row.empty:
        return {}
    man, _ = read_json(Path(row["path"].iloc[0]) / "manifest.json")
    return man


def _plan_for(trial_path: Path, trial_manifest: dict[str, Any]) -> dict[str, Any] | None:
    for p in (trial_path / "plan.json", trial_path.parent.parent / "plan.json"):
        if p.exists():
            plan, _ = read_json(p)
            if plan:
                return plan
    plan = trial_manifest.get("plan")
    return plan if isinstance(plan, dict) else None


def _nan(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _fmt(mean: float, hw: float, digits: int = 3, scale: float = 1.0) -> str:
    """``mean ± hw`` with ``digits`` significant digits on the mean, hw to the same decimals."""
    if _nan(mean):
        return "n/a"
    m = mean * scale
    dec = 0 if m == 0 else max(0, digits - 1 - int(math.floor(math.log10(abs(m)))))
    s = f"{m:.{dec}f}"
    if not _nan(hw):
        s += f" ± {hw * scale:.{dec}f}"
    return s


def _pct(mean: float, hw: float) -> str:
    if _nan(mean):
        return "n/a"
    s = f"{100 * mean:.1f} %"
    if not _nan(hw):
        s += f" ± {100 * hw:.1f}"
    return s


def compute_text(t: tables.Tables, manifests: list[dict[str, Any]]) -> str:
    """Which compute ran (the trial manifests' ``compute.label``), per scheme when they differ:
    an emulated accelerator is a sleep, so every result says whether it is one."""
    mans = [m for m in manifests if isinstance(m, dict) and isinstance(m.get("compute"), dict)]
    if not mans and not t.trials.empty and {"run", "trial", "path"} <= set(t.trials.columns):
        mans = [m for m in (_trial_manifest(t, str(r.run), str(r.trial)) for r in t.trials.itertuples())
                if isinstance(m.get("compute"), dict)]
    by_label: dict[str, set[str]] = {}
    for m in mans:
        label = m["compute"].get("label") or m["compute"].get("mode")
        if label:
            by_label.setdefault(str(label), set()).add(str(m.get("scheme") or m.get("label") or "?"))
    if not by_label:
        return "not recorded (trials from before `training.compute` computed for real)"
    if len(by_label) == 1:
        return next(iter(by_label))
    return "; ".join(f"{lab} ({', '.join(sorted(schemes))})" for lab, schemes in sorted(by_label.items()))


def _unfaithful(trials: pd.DataFrame) -> pd.DataFrame:
    """The trials whose manifest says ``faithful: false`` (self-test failed or CPU saturated)."""
    if trials.empty or "faithful" not in trials.columns:
        return trials.iloc[0:0]
    return trials[trials["faithful"].map(lambda v: _flag(v) is False)]


def _flag(v: Any) -> bool | None:
    """A manifest's boolean as read back through pandas (numpy bools, NaN where absent)."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    return None


def unfaithful_text(trials: pd.DataFrame, where: str = "summary.md") -> str | None:
    """One line for figures: how many trials, and which, were unfaithful, and ``where`` says why (None: none)."""
    bad = _unfaithful(trials)
    if bad.empty:
        return None
    names = ", ".join(sorted(str(x) for x in bad["trial"]))
    return (f"UNFAITHFUL: {len(bad)} of {len(trials)} trials (network not as specified or CPU saturated; "
            f"see {where}): {names}")


def _scheme_table(summary: pd.DataFrame, group_cols: list[str]) -> list[str]:
    head = [c.removeprefix("sweep_") for c in group_cols] + [
        "trials", "time to target (s)", "throughput (worker steps/s)", "updates/s", "compute utilization",
        "exposed sync share", "waiting share", "mean staleness", "WAN (MB)", "final loss"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in summary.iterrows():
        def g(m: str, r: pd.Series = r) -> tuple[float, float]:
            return r.get(m, math.nan), r.get(f"{m}_ci95", math.nan)
        cells = [str(r[c]) for c in group_cols] + [
            str(int(r["trials"])), _ttt_cell(r, g("time_to_target_s")), _fmt(*g("steps_per_s")),
            _fmt(*g("updates_per_s")), _pct(*g("compute_utilization")), _pct(*g("exposed_sync_share")), _pct(*g("wait_share")),
            _fmt(*g("mean_staleness")), _fmt(*g("wan_bytes"), scale=1e-6),
            _fmt(*g("final_loss"))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _ttt_cell(r: pd.Series, mean_hw: tuple[float, float]) -> str:
    """A scheme's time to target; where some trials never reached it, how many did, so a mean over
    the few that did (the faster ones: the others were cut off) does not pass for the scheme's."""
    cell = _fmt(*mean_hw)
    n = r.get("time_to_target_s_n", math.nan)
    trials = int(r["trials"])
    if not _nan(n) and 0 < int(n) < trials:
        cell += f" (reached in {int(n)} of {trials}; the others not: slower than this)"
    return cell


def summary_markdown(root: Path, kind: str, summary: pd.DataFrame, trials: pd.DataFrame,
                     target_text: str | dict[str | None, str], rep: Report, group_cols: list[str],
                     compute: str = "") -> str:
    """The summary.md text: per-scheme table(s), per-trial table, outputs, what is missing.

    ``target_text`` is one sentence, or one per workload (then ``summary``
    has a ``workload`` column and each workload gets its own section).
    """
    lines = [f"# Report: {root.name}", "",
             f"Generated by `testbed report` from the stored records of this {kind} directory "
             "(nothing was rerun).", ""]
    per_workload = isinstance(target_text, dict)
    if per_workload:
        lines += ["Comparisons are per workload: each workload below has its own target, "
                  "time-to-target, table and convergence panel; no number compares across workloads.", ""]
    else:
        lines += [f"Target for time-to-target: {target_text}.", ""]
    if compute:
        lines += [f"Compute: {compute}.", ""]
    bad = _unfaithful(trials)
    if not bad.empty:
        lines += [f"**UNFAITHFUL trials: {len(bad)} of {len(trials)}.** Their network was not what the spec "
                  "says (the self-test before training) or the machine's CPU, or an impairment daemon's, was "
                  "saturated (>= 95 % in more than 10 % of the samples), so their times measure the machine "
                  "as much as the scheme. They are kept in the tables below, marked in the per-trial table:", ""]
        for _, r in bad.iterrows():
            name = f"{r['run']}/{r['trial']}" if r.get("run") else str(r["trial"])
            lines.append(f"- {name}: {r.get('unfaithful_reasons') or 'reason not recorded'}")
        lines.append("")
    if summary.empty:
        lines += ["No trial produced usable records, so there is no table.", ""]
    else:
        lines += ["## Per scheme", "",
                  "Mean ± half-width of the 95 % confidence interval over trials (Student t); "
                  "no interval with one trial. Time to target counts from the trial's start barrier "
                  "(every process ready), not from process start.", ""]
        if per_workload:
            cols = [c for c in group_cols if c != "workload"]
            for wl, text in target_text.items():
                part = summary[summary["workload"] == wl] if wl is not None else summary[summary["workload"].isna()]
                lines += [f"### Workload {wl}", "", f"Target for time-to-target: {text}.", ""]
                lines += _scheme_table(part, cols) + [""]
        else:
            lines += _scheme_table(summary, group_cols)
        lines += ["",
                  "Definitions: *throughput* = worker steps completed per second of trial wall "
                  "time, summed over workers (multiply by the batch size for samples/s); "
                  "*updates/s* = model updates applied per second (metrics.csv); *compute "
                  "utilization* = time the workers spent computing over workers x the trial's wall "
                  "time (as cross-continent training reports give it); *exposed sync "
                  "share* = time a worker's main thread spent synchronizing (or blocked on its "
                  "comm thread) while not computing, over step time; *waiting* = other blocked "
                  "time (barriers, SSP bound); *WAN* = bytes sent on all sampled WAN egresses "
                  "(interface counters, so protocol overhead included); *time to target* = first "
                  "evaluation reaching the target (n/a: never reached or no metrics).", ""]
    if not trials.empty:
        lines += ["## Per trial", "",
                  "| trial | faithful | lr (rule, source) | time to target (s) | worker steps/s | exposed sync | "
                  "mean staleness | WAN MB (links) | WAN MB (spans) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for _, r in trials.iterrows():
            name = f"{r['run']}/{r['trial']}" if r.get("run") else str(r["trial"])
            lr = r.get("lr")
            lr_cell = "-" if lr is None or (isinstance(lr, float) and math.isnan(lr)) else (
                f"{lr:.4g}" if isinstance(lr, (int, float)) else str(lr))
            if lr_cell != "-" and isinstance(r.get("lr_rule"), str):
                lr_cell += f" ({r['lr_rule']}, {r.get('lr_source') or 'given'})"
            faithful = _flag(r.get("faithful"))
            f_cell = "yes" if faithful is True else ("**NO**" if faithful is False else "-")
            lines.append(
                f"| {name} | {f_cell} | {lr_cell} | {_fmt(r['time_to_target_s'], math.nan)} | "
                f"{_fmt(r['steps_per_s'], math.nan)} | {_pct(r['exposed_sync_share'], math.nan)} | "
                f"{_fmt(r['mean_staleness'], math.nan)} | {_fmt(r['wan_bytes'], math.nan, scale=1e-6)}"
                f" | {_fmt(r['wan_bytes_spans'], math.nan, scale=1e-6)} |")
        lines += ["", "WAN bytes from interface counters include headers and retransmissions; "
                  "span bytes count the payload each process says it sent across DCs (`wan_bytes`).", ""]
    figs = sorted({p.with_suffix("").name for p in rep.outputs if p.suffix == ".pdf"})
    if figs:
        lines += ["## Figures", "", "In `figures/` (PDF for papers, PNG for viewing): "
                  + ", ".join(f"`{f}`" for f in figs) + "."
                  + (f" Compute in these figures: {compute}." if compute else ""), ""]
    traces = [p for p in rep.outputs if p.name.startswith("trace.json")]
    if traces:
        lines += [f"Traces: {len(traces)} (`trials/*/trace.json[.gz]`; open in ui.perfetto.dev "
                  "or chrome://tracing).", ""]
    if rep.warnings:
        lines += ["## Warnings", ""] + [f"- {w}" for w in rep.warnings] + [""]
    if rep.missing or rep.skipped or rep.errors:
        lines += ["## Missing or damaged records", ""]
        lines += [f"- {m}" for m in rep.missing] or ["- none"]
        if rep.skipped:
            lines += ["", "Skipped (nothing to draw):", ""] + [f"- {m}" for m in rep.skipped]
        if rep.errors:
            lines += ["", "Failed:", ""] + [f"- {m.splitlines()[0]}" for m in rep.errors]
        lines.append("")
    return "\n".join(lines)


def _draw_common(t: tables.Tables, tabs: dict[str, pd.DataFrame], fig_dir: Path, rep: Report,
                 opts: Options, per_trial: bool = True, suffix: str = "") -> None:
    """The per-trial figures (timeline, links, plan of each scheme's first trial) and the pooled ones
    (convergence, breakdown, schemes, staleness); ``suffix`` ends the pooled figures' names."""
    def add(what: str, fn: Callable[[], list[Path]]) -> None:
        out = _attempt(rep, what, fn, opts)
        if out:
            rep.outputs.extend(out)

    firsts = _first_trial_per_scheme(t) if per_trial else []
    multi_run = t.trials["run"].nunique() > 1 if not t.trials.empty else False
    for run, trial, _scheme in firsts:
        tag = f"{run}_{trial}" if multi_run else trial
        add(f"figure timeline_{tag}", lambda run=run, trial=trial, tag=tag: figures.timeline(
            tabs["spans"], fig_dir, trial=trial, run=run, steps=opts.steps, name=f"timeline_{tag}"))
        man = _trial_manifest(t, run, trial)
        caps = man.get("link_capacity_bps")
        add(f"figure links_{tag}", lambda run=run, trial=trial, tag=tag, caps=caps: figures.links(
            tabs["link_rates"], fig_dir, trial=trial, run=run,
            capacities_bps=caps if isinstance(caps, dict) else None, name=f"links_{tag}"))
        path = Path(t.trials[(t.trials["run"] == run) & (t.trials["trial"] == trial)]["path"].iloc[0])
        plan = _plan_for(path, man)
        if plan is not None:
            add(f"figure blp_plan_{tag}", lambda plan=plan, tag=tag: figures.plan(
                plan, fig_dir, name=f"blp_plan_{tag}"))
    compute = compute_text(t, [])
    note = compute if "emulated" in compute else None  # real compute everywhere: the default, unsaid
    warn = unfaithful_text(t.trials)
    add(f"figure convergence_loss{suffix}", lambda: figures.convergence(
        tabs["metrics"], fig_dir, "loss", note=note, warning=warn, name=f"convergence_loss{suffix}"))
    if "acc" in tabs["metrics"].columns and pd.to_numeric(
            tabs["metrics"]["acc"], errors="coerce").notna().any():
        add(f"figure convergence_acc{suffix}", lambda: figures.convergence(
            tabs["metrics"], fig_dir, "acc", note=note, warning=warn, name=f"convergence_acc{suffix}"))
    add(f"figure breakdown{suffix}", lambda: figures.breakdown(tabs["steps"], fig_dir, name=f"breakdown{suffix}",
                                                              note=note, warning=warn))
    trials = tabs["trials"]
    wls = trials["workload"].dropna().unique() if "workload" in trials.columns else []
    if len(wls) > 1:  # a time to target is per workload: one figure each
        for wl in wls:
            add(f"figure schemes_{wl}{suffix}", lambda wl=wl: figures.schemes(
                trials[trials["workload"] == wl], fig_dir, name=f"schemes_{wl}{suffix}", note=note,
                warning=warn))
    else:
        add(f"figure schemes{suffix}", lambda: figures.schemes(trials, fig_dir, name=f"schemes{suffix}", note=note,
                                                              warning=warn))
    add(f"figure staleness{suffix}", lambda: figures.staleness(tabs["staleness"], fig_dir,
                                                              name=f"staleness{suffix}"))


def _draw_common_per_value(t: tables.Tables, tabs: dict[str, pd.DataFrame], fig_dir: Path, rep: Report,
                           opts: Options, per_trial: bool, split: list[str]) -> None:
    """The pooled figures once per combination of the swept values in ``split``.

    A curve or bar pooled over ``topology.ps: [central, west]`` or over two slowdowns would
    average two regimes, as the summary table once did; each combination gets its own figures,
    named ``..._ps-central`` or ``..._west-1.5``, when it compares schemes (two or more: a lone
    scheme's figures are its run's own)."""
    for suffix, grp in _split_by(tabs["trials"], split):
        if not suffix:
            _draw_common(t, tabs, fig_dir, rep, opts, per_trial=per_trial)
            continue
        if "scheme" in grp.columns and grp["scheme"].nunique() < 2:
            continue
        keys = set(zip(grp["run"], grp["trial"], strict=True))
        part = {k: tables.select_rows(df, keys) for k, df in tabs.items()}
        _draw_common(tables.select_trials(t, keys), part, fig_dir, rep, opts, per_trial=per_trial, suffix=suffix)


# display label and factor of well-known swept parameters (manifest values in SI units)
SWEEP_X = {
    "groups": ("Group count G", 1.0), "experts": ("Expert count E", 1.0),
    "rate_bps": ("WAN bandwidth (Mbit/s)", 1e-6), "bandwidth_bps": ("WAN bandwidth (Mbit/s)", 1e-6),
    "bandwidth_mbps": ("WAN bandwidth (Mbit/s)", 1.0), "rtt_s": ("WAN RTT (ms)", 1e3),
    "rtt_ms": ("WAN RTT (ms)", 1.0), "delay_s": ("WAN one-way delay (ms)", 1e3),
    "delay_ms": ("WAN one-way delay (ms)", 1.0), "loss_pct": ("WAN loss (%)", 1.0),
    "staleness": ("Staleness bound s (versions)", 1.0), "workers": ("Workers (count)", 1.0),
}
_SWEEP_Y = {"steps_per_s": "Throughput (worker steps/s)", "time_to_target_s": "Time to target (s)"}


def _predicted(manifests: list[dict[str, Any]], param: str) -> dict[str, float] | float | None:
    for m in manifests:
        p = m.get("predicted_optimum")
        if isinstance(p, dict) and param in p:
            v = p[param]
            if isinstance(v, (int, float)):
                return float(v)
            if isinstance(v, dict):
                return {str(k): float(x) for k, x in v.items() if isinstance(x, (int, float))}
    return None


def varying_sweep_columns(trials: pd.DataFrame) -> list[str]:
    """The sweep values that differ between trials, numeric or not: the summary keeps them apart.

    A categorical value (``topology.ps: [central, west]``, a topology's name) must split the
    summary as a number does; pooled, the table would average two regimes into one row."""
    return [c for c in trials.columns if c.startswith("sweep_") and trials[c].astype(str).nunique() >= 2]


def splitting_sweep_columns(trials: pd.DataFrame) -> list[str]:
    """The varying sweep values that separate figures: all but the ``schemes`` grid key and ``seed``
    (seeds pool, as repetitions do).

    ``schemes`` only names each point's scheme, which every figure already tells apart; split by it,
    each scheme would get a figure of its own and none would compare them.  Any other value splits,
    even one that happens to differ per scheme (a partial grid: bsp-hier at west 3x, the rest at
    1.5x); a part with a single scheme then draws no comparison, which is the honest outcome."""
    return [c for c in varying_sweep_columns(trials) if c not in ("sweep_schemes", "sweep_seed")]


def _split_by(trials: pd.DataFrame, cols: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """``trials`` per combination of the values of ``cols``, each with its figure-name suffix
    (``_ps-central``, ``_delay_s-0.005``); one part with no suffix when ``cols`` is empty."""
    if not cols:
        return [("", trials)]
    parts = []
    for values, grp in trials.groupby(cols, dropna=False, sort=True):
        vals = values if isinstance(values, tuple) else (values,)
        suffix = "".join(f"_{c.removeprefix('sweep_')}-{v}" for c, v in zip(cols, vals, strict=True))
        parts.append((re.sub(r"[^A-Za-z0-9_.=-]+", "-", suffix), grp))
    return parts


def _draw_sweeps(trials: pd.DataFrame, fig_dir: Path, rep: Report, opts: Options,
                 manifests: list[dict[str, Any]]) -> None:
    """A figure per numeric sweep value but ``seed`` (an axis needs numbers).

    The other swept values (a second numeric one, a placement) are never pooled along the axis: the
    figure is drawn once per combination of them (``sweep_steps_per_s_vs_rate_bps_delay_s-0.005``).
    Only ``seed`` is pooled, as repetitions are."""
    varying = splitting_sweep_columns(trials)
    cols = [c for c in varying if pd.to_numeric(trials[c], errors="coerce").nunique() >= 2]
    for c in cols:
        param = c.removeprefix("sweep_")
        xlabel, factor = SWEEP_X.get(param, (f"{param} (as in the spec)", 1.0))
        vals = pd.to_numeric(trials[c], errors="coerce").dropna()
        logx = bool((vals > 0).all() and vals.max() / vals.min() >= 8)
        others = [o for o in varying if o != c]
        for suffix, part in _split_by(trials, others):
            for y, ylabel in _SWEEP_Y.items():
                name = f"sweep_{y}_vs_{param}{suffix}"
                out = _attempt(rep, f"figure {name}", lambda c=c, y=y, ylabel=ylabel, param=param, xlabel=xlabel,
                               factor=factor, logx=logx, part=part, name=name: figures.sweep(
                                   part, c, y, fig_dir, name=name, xlabel=xlabel, ylabel=ylabel,
                                   predicted=_predicted(manifests, param), logx=logx, x_factor=factor), opts)
                if out:
                    rep.outputs.extend(out)


def _workload_manifests(tw: tables.Tables, manifests: list[dict[str, Any]], several: bool) -> list[dict[str, Any]]:
    """Manifests that may name ``tw``'s target: its own trials' (and, for one workload, the given ones)."""
    own = [read_json(Path(p) / "manifest.json")[0] for p in tw.trials.get("path", [])] if not tw.trials.empty else []
    return own if several else manifests + own


def _report_tables(root: Path, kind: str, t: tables.Tables, manifests: list[dict[str, Any]],
                   rep: Report, opts: Options) -> None:
    """Tables, figures and summary.md for one directory.

    Comparisons are per workload: each workload gets its own target (a loss
    a language model reaches says nothing about a digits classifier), its
    own time-to-target, its own table in summary.md and its own convergence
    panel.  At experiment level the per-trial figures (timeline, links,
    plan) are left to the runs, and the pooled figures (convergence,
    breakdown, schemes) are drawn once per combination of swept values that
    compares two or more schemes (pooling different bandwidths into one
    curve would mislead); seeds pool as repetitions.
    """
    rep.missing.extend(t.problems)
    wls = tables.workloads(t)
    several = len(wls) > 1
    parts: list[tuple[str | None, str, dict[str, pd.DataFrame]]] = []
    for wl in wls:
        tw = tables.select_workload(t, wl)
        tl, ta, target_text = _resolve_target(opts, _workload_manifests(tw, manifests, several), tw.metrics)
        what = f"tables of workload {wl}" if several else "tables"
        tabs_w = _attempt(rep, what, lambda tw=tw, tl=tl, ta=ta: tables.all_tables(tw, tl, ta), opts) or {}
        parts.append((wl, target_text, tabs_w))
    tabs: dict[str, pd.DataFrame] = {}
    if all(p[2] for p in parts):
        tabs = {k: tables._concat([p[2][k] for p in parts]) for k in parts[0][2]} if several else parts[0][2]
    sweep_cols: list[str] = []
    by = (["workload"] if several else []) + ["scheme"]
    if tabs:
        fig_dir = root / "figures"
        first = len(rep.outputs)
        _draw_sweeps(tabs["trials"], fig_dir, rep, opts, manifests)
        sweep_cols = varying_sweep_columns(tabs["trials"])
        _draw_common_per_value(t, tabs, fig_dir, rep, opts, kind != "experiment",
                               splitting_sweep_columns(tabs["trials"]))
        _retire_figures(fig_dir, [q for q in rep.outputs[first:] if q.parent == fig_dir], rep)
        if sweep_cols or several:
            tabs["summary"] = tables.scheme_summary(tabs["trials"], by=by + sweep_cols)
        written = _attempt(rep, "write tables", lambda: tables.write_tables(tabs, root / "tables"),
                           opts)
        if written:
            rep.outputs.extend(written[0])
            rep.skipped.extend(written[1])
    summary = tabs.get("summary", pd.DataFrame())
    trials = tabs.get("trials", pd.DataFrame())
    rep.summary_rows = _records(summary)
    targets = {wl: text for wl, text, _ in parts}
    text = summary_markdown(root, kind, summary, trials, targets if several else parts[0][1], rep,
                            by + sweep_cols if not summary.empty else [], compute=compute_text(t, manifests))
    path = root / "summary.md"
    try:
        write_atomic(path, text)
        rep.summary = path
        rep.outputs.append(path)
    except OSError as exc:
        rep.errors.append(f"summary.md: {exc}")


#: In ``figures/``: the names of the files the last report drew there (JSON), so the next one can remove
#: what it no longer draws without touching anything else a user put in the folder.
FIGURE_INDEX = ".drawn.json"


def _retire_figures(fig_dir: Path, drawn: list[Path], rep: Report) -> None:
    """Remove the figures the previous report listed in :data:`FIGURE_INDEX` and this one did not draw
    (a stale figure next to fresh ones reads as a result); then list this report's."""
    index = fig_dir / FIGURE_INDEX
    try:
        before = json.loads(index.read_text())["figures"]
        before = [n for n in before if isinstance(n, str)]
    except (OSError, ValueError, KeyError, TypeError):
        before = []
    now = sorted({q.name for q in drawn})
    for name in sorted(set(before) - set(now)):
        old = fig_dir / name
        if Path(name).name != name or name.startswith(".") or not old.is_file():
            continue  # only plain files this folder's index named
        try:
            old.unlink()
            rep.removed.append(old)
        except OSError as exc:
            rep.errors.append(f"stale figure {old}: {exc}")
    if now or before:
        try:
            fig_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(index, json.dumps({"figures": now}, indent=1) + "\n")
        except OSError as exc:
            rep.errors.append(f"figures/{FIGURE_INDEX}: {exc}")


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain JSON values (NaN -> None)."""
    out = []
    for row in df.to_dict(orient="records"):
        clean: dict[str, Any] = {}
        for k, v in row.items():
            if isinstance(v, float) and math.isnan(v):
                v = None
            elif hasattr(v, "item"):  # numpy scalar
                v = v.item()
            clean[str(k)] = v
        out.append(clean)
    return out


def report_run(path: Path, opts: Options | None = None) -> Report:
    """Report on a trial dir or a run dir (outputs go into that directory)."""
    opts = opts or Options()
    path = Path(path)
    kind = classify_dir(path)
    rep = Report(path, kind)
    tdirs = [path] if kind == "trial" else trial_dirs(path)
    if opts.traces:
        for d in tdirs:
            res = _attempt(rep, f"trace {d.name}",
                           lambda d=d: merge_trial(d, opts.gzip_threshold), opts)
            if res is None:
                continue
            out, problems = res
            if out is not None:
                rep.outputs.append(out)
            else:
                rep.skipped.append(f"{d.name}/trace: no spans or samples to merge")
            rep.missing.extend(f"{d.name}/{p}" for p in problems if p.startswith("trace: "))
    t = tables.load(path)
    manifests = []
    if kind == "run":
        m, _ = read_json(path / "manifest.json")
        manifests.append(m)
    manifests += [read_json(d / "manifest.json")[0] for d in tdirs]
    _report_tables(path, kind, t, manifests, rep, opts)
    return rep


def report_experiment(path: Path, opts: Options | None = None) -> Report:
    """Report on every run, then experiment-wide tables, sweep figures and summary.md."""
    opts = opts or Options()
    path = Path(path)
    rep = Report(path, "experiment")
    runs = run_dirs(path)
    for rd in runs:
        sub = report_run(rd, opts)
        rep.outputs += sub.outputs
        rep.errors += [f"{rd.name}: {e}" for e in sub.errors]
        rep.skipped += [f"{rd.name}: {s}" for s in sub.skipped]
    t = tables.load(path)
    manifests = [read_json(rd / "manifest.json")[0] for rd in runs]
    rep.warnings += pooling_warnings(runs, manifests)
    _report_tables(path, "experiment", t, manifests, rep, opts)
    return rep


def pooling_warnings(runs: list[Path], manifests: list[dict[str, Any]]) -> list[str]:
    """Runs pooled into one row must be the same experiment: warn when runs with the same sweep
    point (or no sweep) carry different spec hashes (an edited spec or topology file), or were
    made by different code (git commit) - their trials would otherwise be averaged silently."""
    out: list[str] = []
    groups: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for rd, m in zip(runs, manifests, strict=True):
        key = json.dumps(m.get("sweep") or {}, sort_keys=True, default=str)
        groups.setdefault(key, []).append((rd.name, m))
    for key, members in groups.items():
        where = "" if key == "{}" else f" (sweep point {key})"
        hashes: dict[str, list[str]] = {}
        for name, m in members:
            hashes.setdefault(str(m.get("spec_hash", "?")), []).append(name)
        if len(hashes) > 1:
            out.append("runs with different specs are pooled" + where + ": "
                       + "; ".join(f"spec {h}: {', '.join(n)}" for h, n in sorted(hashes.items()))
                       + " - report each run directory on its own, or rerun them from one spec")
        commits: dict[str, list[str]] = {}
        for name, m in members:
            git = (m.get("provenance") or {}).get("git") or {}
            commits.setdefault(str(git.get("commit", "?"))[:12], []).append(name)
        if len(commits) > 1:
            out.append("runs made by different code are pooled" + where + ": "
                       + "; ".join(f"commit {c}: {', '.join(n)}" for c, n in sorted(commits.items())))
    return out


def report(path: Path, opts: Options | None = None) -> Report:
    """Report on whatever ``path`` is: trial, run or experiment directory."""
    path = Path(path)
    kind = classify_dir(path)
    if kind == "experiment":
        return report_experiment(path, opts)
    if kind in ("trial", "run"):
        return report_run(path, opts)
    rep = Report(path, kind)
    rep.errors.append(f"{path}: not a trial, run or experiment directory "
                      "(expected events/, samples/ or metrics.csv; trials/; or run directories)")
    return rep
