"""Paper figures, each fed by the tidy tables, in two layers.

``draw_<figure>(ax, data, ...)`` draws one panel into any matplotlib Axes
(yours, in a notebook or a multi-panel figure) and returns it; with
``legend=True`` it puts its legend inside that Axes, and
:func:`legend_handles` gives the entries for a legend of your own.
``<figure>(data, out_dir, ...)`` (timeline, convergence, breakdown, schemes,
links, staleness, sweep, plan) makes a column-wide figure, draws, puts the legend
above the axes, writes ``<name>.pdf`` and ``<name>.png`` into ``out_dir``
and returns the paths.  When the input holds nothing to draw, both raise
:class:`NoData` with the reason, so the report can say what was skipped and
why instead of drawing an empty frame.

Colours, markers and dashes per scheme come from :mod:`.style` and are the
same in every figure; every line has a marker and a dash, every filled area
a luminance or hatch of its own, so each figure reads in greyscale.  Spread
over repetitions: convergence curves show the median and a min-max band (few
repetitions make a std band misleading); bar and sweep figures show the mean
with a 95 % Student-t interval.
"""

from __future__ import annotations

import math
import textwrap
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.font_manager
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Patch

from testbed.analysis import style
from testbed.analysis.tables import ci95

LINK_COLORS = ["#4477AA", "#EE6677", "#228833", "#CCBB44", "#66CCEE", "#AA3377", "#BBBBBB",
               "#332288", "#117733", "#882255", "#44AA99", "#999933"]
# 12 colours, 6 dashes and 7 markers: every direction of a 4-DC mesh differs in all three
LINK_DASHES: list[Any] = ["-", (0, (4, 1.5)), (0, (1.5, 1)), (0, (4, 1, 1, 1)),
                          (0, (6, 1, 1, 1, 1, 1, 1, 1)), (0, (4, 1, 1, 1, 1, 1))]
LINK_MARKERS = ["o", "s", "^", "v", "D", "P", "X"]

MIN_BAR_PT = 1.0
"""Timeline bars shorter than this (in points) are drawn this wide, so 1 ms of compute shows."""
BAR_GAP_PT = 0.5
"""Timeline bars wider than 3x this end this much early: consecutive spans stay apart without
an outline (an outline would hide the thin bars)."""


class NoData(Exception):
    """The input holds nothing this figure could draw; the message says what is missing."""


_HANDLES: weakref.WeakKeyDictionary[Axes, list[Any]] = weakref.WeakKeyDictionary()


def legend_handles(ax: Axes) -> list[Any]:
    """The legend entries the ``draw_*`` calls on ``ax`` made (for a legend of your own)."""
    return list(_HANDLES.get(ax, []))


def _finish(ax: Axes, handles: list[Any], legend: bool, ncol: int = 4) -> Axes:
    """Record the legend entries of ``ax``; with ``legend``, show them just above the Axes."""
    known = {h.get_label() for h in _HANDLES.get(ax, [])}
    _HANDLES[ax] = _HANDLES.get(ax, []) + [h for h in handles if h.get_label() not in known]
    if legend and handles:
        entries = legend_handles(ax)
        width = ax.get_position().width * _root(ax).get_figwidth()
        n = _legend_ncol(width, [h.get_label() for h in entries], _ncol(len(entries), ncol))
        ax.legend(handles=_row_major(entries, n), loc="lower left", bbox_to_anchor=(0.0, 1.02),
                  ncol=n, borderaxespad=0.0, columnspacing=1.0, handletextpad=0.4)
    return ax


def _root(ax: Axes) -> Any:
    """The top-level Figure of ``ax`` (also inside a SubFigure)."""
    fig = ax.figure
    while getattr(fig, "figure", fig) is not fig and getattr(fig, "figure", None) is not None:
        fig = fig.figure
    return fig


def _legend_ncol(avail_in: float, labels: list[str], ncol: int) -> int:
    """Largest column count <= ``ncol`` whose row-major layout fits ``avail_in`` inches.

    Text widths are measured with the legend font, since a legend that is
    wider than the figure is silently clipped in the saved file.
    """
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    fp = FontProperties(size=matplotlib.rcParams["legend.fontsize"])
    ttp = TextToPath()
    fs = fp.get_size_in_points()
    widths = [ttp.get_text_width_height_descent(lbl, fp, ismath=False)[0] / 72 for lbl in labels]
    handle = (matplotlib.rcParams["legend.handlelength"] + 0.4 + 1.0) * fs / 72
    for n in range(max(ncol, 1), 0, -1):
        cols = [max(widths[c::n], default=0) + handle for c in range(n)]
        if sum(cols) <= avail_in:
            return n
    return 1


def _row_major(handles: list[Any], ncol: int) -> list[Any]:
    """Reorder so that matplotlib's column-first legend reads row by row."""
    rows = -(-len(handles) // ncol)
    grid = [handles[r * ncol:(r + 1) * ncol] for r in range(rows)]
    return [row[c] for c in range(ncol) for row in grid if c < len(row)]


def _legend_top(fig: Any, handles: list[Any], ncol: int) -> None:
    """Legend above the axes, outside them, read row by row."""
    if not handles:
        return
    ncol = _legend_ncol(fig.get_figwidth() - 0.1, [h.get_label() for h in handles], ncol)
    fig.legend(handles=_row_major(handles, ncol), loc="outside upper center", ncol=ncol,
               columnspacing=1.0, handletextpad=0.4, borderaxespad=0.1)


def _ncol(n: int, max_col: int = 4) -> int:
    return min(n, max_col) if n else 1


def _markevery(n: int, i: int, k: int, most: int = 8) -> Any:
    """Markers on at most ``most`` points of an ``n``-point curve, curve ``i`` of ``k`` shifted
    so that the markers of overlapping curves do not sit on top of each other."""
    if n <= most:
        return None
    step = max(1, n // most)
    return (int(i * step / max(k, 1)) % step, step)


def _line_handle(st: dict[str, Any], label: str | None = None) -> Line2D:
    return Line2D([], [], color=st["color"], marker=st["marker"], linestyle=st["linestyle"],
                  label=label if label is not None else st["label"])


# --------------------------------------------------------------------------- 1 timeline


@dataclass
class _Timeline:
    trial: str
    rows: list[tuple[str, pd.DataFrame]]
    lo: float
    hi: float
    scale: float
    xlabel: str


def _pick(df: pd.DataFrame, trial: str | None, run: str | None) -> tuple[str, pd.DataFrame]:
    if run is not None and "run" in df.columns:
        df = df[df["run"] == run]
    if df.empty:
        raise NoData(f"run {run}: nothing recorded")
    if trial is None:
        trial = sorted(df["trial"].unique())[0]
    return str(trial), df[df["trial"] == trial]


def timeline_window(spans: pd.DataFrame, periods: float = 3.0) -> tuple[float, float]:
    """Default time window (seconds, trial clock) of the timeline of one trial's spans.

    ``periods`` step periods of the slowest worker (median time between its
    step starts), centred in the middle of the period in which every worker
    is between its first and last step.  Asynchronous schemes need a time
    window: each worker is at its own step at any moment, so a window of step
    numbers leaves most rows empty.  Where no such common period exists (the
    fast workers finished before the slow ones started), the window is the one
    nearest the middle of that gap that still reaches the most workers.
    """
    w = spans[(spans["role"] == "worker") & spans["step"].notna()]
    if w.empty:
        raise NoData("no worker spans with a step")
    hulls, per = [], []
    for _, g in w.groupby("rank"):
        hulls.append((float(g["start_s"].min()), float(g["end_s"].max())))
        starts = g.groupby("step")["start_s"].min().sort_index().to_numpy(float)
        d = np.diff(starts)
        d = d[d > 0]
        per.append(float(np.median(d)) if len(d) else hulls[-1][1] - hulls[-1][0])
    a = np.array(hulls)
    t0, t1 = float(a[:, 0].min()), float(a[:, 1].max())
    length = periods * max(per)
    if not length > 0 or length >= t1 - t0:
        return t0, t1
    target = (float(a[:, 0].max()) + float(a[:, 1].min())) / 2
    eps = 1e-6 * length

    def clip(x: float) -> float:
        return min(max(x, t0), t1 - length)

    cands = [clip(target - length / 2)]
    cands += [clip(x) for x in np.concatenate([a[:, 0] - length + eps, a[:, 1] - eps])]

    def score(x: float) -> tuple[int, float]:
        reached = int(((a[:, 0] < x + length) & (a[:, 1] > x)).sum())
        return reached, -abs(x + length / 2 - target)

    x = max(cands, key=score)
    return x, x + length


def _timeline_data(spans: pd.DataFrame, trial: str | None, steps: tuple[int, int] | None,
                   run: str | None, window: tuple[float, float] | None) -> _Timeline:
    if spans.empty:
        raise NoData("no spans")
    trial, df = _pick(spans, trial, run)
    stepped = df[df["role"].isin(["worker", "comm"]) & df["step"].notna()]
    if stepped.empty:
        raise NoData(f"{trial}: no worker spans with a step")
    if steps is not None:
        win = stepped[(stepped["step"] >= steps[0]) & (stepped["step"] <= steps[1])]
        if win.empty:
            raise NoData(f"{trial}: no spans in steps {steps[0]}..{steps[1]}")
        lo, hi = float(win["start_s"].min()), float(win["end_s"].max())
        shown = df[(df["end_s"] > lo) & (df["start_s"] < hi)]
        shown = shown[(shown["role"] == "server") | shown.index.isin(win.index)
                      | (shown["role"].isin(["worker", "comm"]) & shown["step"].isna())]
        where = f"start of step {steps[0]}"
    else:
        lo, hi = window if window is not None else timeline_window(df)
        shown = df[(df["end_s"] > lo) & (df["start_s"] < hi)]
        where = f"t = {lo:.3f} s"
    scale, unit = (1e3, "ms") if hi - lo < 5 else (1.0, "s")

    rows: list[tuple[str, pd.DataFrame]] = []
    ranks = sorted(r for r in df.loc[df["role"] != "server", "rank"].dropna().unique())
    for r in ranks:  # every rank of the trial gets its rows, so missing work shows as a gap
        mine_all = df[(df["rank"] == r) & (df["role"] != "server")]
        mine = shown[(shown["rank"] == r) & (shown["role"] != "server")]
        dc = str(mine_all["dc"].iloc[0]) if "dc" in mine_all.columns else ""
        rows.append((f"w{int(r)}" + (f" {dc}" if dc and dc != "nan" else ""),
                     mine[mine["role"] == "worker"]))
        if (mine_all["role"] == "comm").any():
            rows.append((f"w{int(r)} comm", mine[mine["role"] == "comm"]))
    server = df[df["role"] == "server"]
    if not server.empty:
        shown_server = shown[shown["role"] == "server"]
        for h in sorted(server["host"].unique()):
            rows.append((f"PS {h}" if server["host"].nunique() > 1 else "PS",
                         shown_server[shown_server["host"] == h]))
    return _Timeline(trial, rows, lo, hi, scale, f"Time ({unit}) from {where}")


def _draw_timeline(ax: Axes, tl: _Timeline, legend: bool) -> Axes:
    scale = tl.scale
    span = (tl.hi - tl.lo) * scale
    ax_pt = max(ax.get_window_extent().width * 72 / _root(ax).dpi, 1.0)
    min_w, gap = MIN_BAR_PT * span / ax_pt, BAR_GAP_PT * span / ax_pt
    phases: list[str] = []
    n = len(tl.rows)
    for i, (_, g) in enumerate(tl.rows):
        y = n - 1 - i
        for phase, pg in g.groupby("phase"):
            s = ((pg["start_s"].clip(lower=tl.lo) - tl.lo) * scale).to_numpy(float)
            e = ((pg["end_s"].clip(upper=tl.hi) - tl.lo) * scale).to_numpy(float)
            w = e - s
            keep = w >= 0
            s, w = s[keep], w[keep]
            if not len(s):
                continue
            thin = w < min_w
            w = np.where(thin, min_w, np.where(w > 3 * gap, w - gap, w))
            kw = style.phase_kw(str(phase))
            # thin bars on top of their neighbours, thin compute on top of everything
            for sel, z in ((~thin, 2.0), (thin, 2.6 if phase == "compute" else 2.5)):
                if sel.any():
                    bars = ax.barh(np.full(int(sel.sum()), y), w[sel], left=s[sel], height=0.76,
                                   zorder=z, **kw)
                    for b in bars:
                        b.set_gid(f"phase:{phase}")
            phases.append(str(phase))
    ax.set_yticks(range(n), [r[0] for r in reversed(tl.rows)])
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlim(0, span)
    ax.set_xlabel(tl.xlabel)
    ax.grid(axis="y", visible=False)
    ax.tick_params(axis="y", length=0)
    order = [p for p in style.PHASE_COLORS if p in phases]
    order += sorted(set(phases) - set(order))
    handles = [Patch(**style.phase_kw(p), label=style.PHASE_LABELS.get(p, p)) for p in order]
    return _finish(ax, handles, legend)


def draw_timeline(ax: Axes, spans: pd.DataFrame, trial: str | None = None,
                  steps: tuple[int, int] | None = None, run: str | None = None,
                  window: tuple[float, float] | None = None, legend: bool = True) -> Axes:
    """Gantt chart of one trial: a row per worker (and its comm thread, and the PS).

    Default window: :func:`timeline_window` (three step periods of the
    slowest worker where all workers are busy), showing every span that
    overlaps it, clipped.  ``steps=(a, b)``: the spans of steps a..b instead;
    ``window=(t0, t1)``: that time window (seconds, trial clock).  Bars are
    at least :data:`MIN_BAR_PT` wide so millisecond compute stays visible.
    """
    return _draw_timeline(ax, _timeline_data(spans, trial, steps, run, window), legend)


def timeline(spans: pd.DataFrame, out_dir: Path, trial: str | None = None,
             steps: tuple[int, int] | None = None, name: str = "timeline",
             run: str | None = None, window: tuple[float, float] | None = None) -> list[Path]:
    """:func:`draw_timeline` as a column-wide figure, legend on top; returns [pdf, png]."""
    tl = _timeline_data(spans, trial, steps, run, window)
    with style.paper_style():
        fig, ax = style.new_figure(0.9 + 0.2 * len(tl.rows))
        _draw_timeline(ax, tl, legend=False)
        handles = legend_handles(ax)
        _legend_top(fig, handles, _ncol(len(handles), 4))
        return style.save_figure(fig, out_dir, name)


# --------------------------------------------------------------------------- 2 convergence


def _spread(curves: list[tuple[np.ndarray, np.ndarray]], n: int = 120
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Median and min/max of step-wise curves on a shared grid (NaN where a rep has ended)."""
    xmax = max(float(x[-1]) for x, _ in curves)
    xmin = min(float(x[0]) for x, _ in curves)
    grid = np.linspace(xmin, xmax, n)
    ys = np.full((len(curves), n), np.nan)
    for i, (x, y) in enumerate(curves):
        inside = (grid >= x[0]) & (grid <= x[-1])
        ys[i, inside] = np.interp(grid[inside], x, y)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns where no rep reaches
        med = np.nanmedian(ys, axis=0)
        lo, hi = np.nanmin(ys, axis=0), np.nanmax(ys, axis=0)
    return grid, med, lo, hi


def _convergence_curves(metrics: pd.DataFrame, metric: str
                        ) -> tuple[pd.DataFrame, list[tuple[str, pd.DataFrame]]]:
    """(clean metrics, [(curve label, its rows)]): a curve per scheme, or per scheme and expert
    in multi-expert runs (their losses differ; mixed they zigzag)."""
    if metrics.empty or metric not in metrics.columns:
        raise NoData(f"no metrics with {metric}")
    m = metrics.assign(**{metric: pd.to_numeric(metrics[metric], errors="coerce")})
    m = m.dropna(subset=[metric, "wall_s", "step"])
    if m.empty:
        raise NoData(f"no {metric} values")
    curves: list[tuple[str, pd.DataFrame]] = []
    for scheme in style.sort_schemes(m["scheme"].unique()):
        ms = m[m["scheme"] == scheme]
        expert = pd.to_numeric(ms["expert"], errors="coerce") if "expert" in ms.columns else None
        if expert is not None and expert.notna().any():
            for e, me in ms.groupby(expert):
                curves.append((f"{scheme} expert {int(e)}", me))
        else:
            curves.append((str(scheme), ms))
    return m, curves


def draw_convergence(ax: Axes, metrics: pd.DataFrame, metric: str = "loss", x: str = "wall_s",
                     legend: bool = True) -> Axes:
    """Held-out ``loss`` or ``acc`` against ``x`` (``wall_s`` or ``step``), a curve per scheme.

    Multi-expert schemes get a curve per expert (``pgcs expert 1``), each a
    variant of the scheme's style.  Several repetitions: median curve and
    min-max band.
    """
    _, curves = _convergence_curves(metrics, metric)
    scale = 100.0 if metric == "acc" else 1.0
    keys = [c for c in ("run", "trial") if c in metrics.columns]
    styles = style.scheme_styles(label for label, _ in curves)
    handles = []
    for i, (label, mp) in enumerate(curves):
        st = styles[label]
        reps = []
        for _, g in (mp.groupby(keys) if keys else [(None, mp)]):
            g = g.sort_values(x)
            reps.append((g[x].to_numpy(float), g[metric].to_numpy(float) * scale))
        if len(reps) == 1:
            xs, ys = reps[0]
        else:
            xs, ys, lo, hi = _spread(reps)
            ax.fill_between(xs, lo, hi, color=st["color"], alpha=0.18, linewidth=0)
        ax.plot(xs, ys, color=st["color"], linestyle=st["linestyle"], marker=st["marker"],
                markevery=_markevery(len(xs), i, len(curves)), label=label)
        handles.append(_line_handle(st))
    ax.set_xlabel({"wall_s": "Wall time since start barrier (s)", "samples": "Training samples (all workers)"}
                  .get(x, "Training steps"))
    ax.set_ylabel("Held-out accuracy (%)" if metric == "acc" else "Held-out loss (nats)")
    ax.set_xlim(left=0)
    return _finish(ax, handles, legend)


def _compute_note(fig: Any, note: str | None, warning: str | None = None) -> None:
    """Lines under the figure: the compute model, when it is not simply real compute, and a
    warning (trials whose network or machine was not what the figure assumes)."""
    lines = ([f"compute: {note}"] if note else []) + ([warning] if warning else [])
    if lines:
        size = matplotlib.font_manager.FontProperties(size="x-small").get_size_in_points()
        # wrapped to the figure's width (a centred line wider than the figure is cut at both ends):
        # ~0.55 em per character of the sans-serif face, a little margin
        per_line = max(20, int(fig.get_figwidth() * 72 / (0.55 * size) * 0.95))
        text = "\n".join(textwrap.fill(line, per_line, break_on_hyphens=False) for line in lines)
        fig.supxlabel(text, fontsize="x-small", color="0.25" if not warning else "#a00000")


def convergence(metrics: pd.DataFrame, out_dir: Path, metric: str = "loss",
                name: str | None = None, note: str | None = None, warning: str | None = None) -> list[Path]:
    """Held-out ``loss`` or ``acc`` against wall time (top) and training samples (bottom), per scheme.

    The bottom axis is samples processed by all workers (``metrics.csv``
    ``samples``), the one progress measure every scheme shares (a BSP step, an
    ASP update and a Gsyn update hold different numbers of samples); records
    without it fall back to steps.  Several workloads get a column of panels
    each: they share no axis (a language model's loss and a classifier's).
    ``note`` (the report passes it when any trial's compute was emulated)
    is written under the figure, so the figure itself says what ran;
    ``warning`` too (the report's: which trials were unfaithful).
    """
    _convergence_curves(metrics, metric)  # NoData before a figure is made
    wls = [None]
    if "workload" in metrics.columns and metrics["workload"].nunique() > 1:
        wls = list(dict.fromkeys(metrics["workload"].dropna()))
    with style.paper_style():
        fig, axes = style.new_figure(3.6, nrows=2, ncols=len(wls),
                                     width_in=style.COLUMN_WIDTH_IN if len(wls) == 1 else style.DOUBLE_WIDTH_IN)
        cols = [axes] if len(wls) == 1 else [axes[:, i] for i in range(len(wls))]
        handles: dict[str, Any] = {}
        for wl, (ax_t, ax_s) in zip(wls, cols):
            part = metrics if wl is None else metrics[metrics["workload"] == wl]
            has_samples = "samples" in part.columns and pd.to_numeric(part["samples"], errors="coerce").notna().any()
            draw_convergence(ax_t, part, metric, "wall_s", legend=False)
            draw_convergence(ax_s, part, metric, "samples" if has_samples else "step", legend=False)
            if wl is not None:
                ax_t.set_title(f"workload: {wl}")
            for h in legend_handles(ax_t):
                handles.setdefault(h.get_label(), h)
        _legend_top(fig, list(handles.values()), _ncol(len(handles), 4 if len(wls) == 1 else 6))
        _compute_note(fig, note, warning)
        return style.save_figure(fig, out_dir, name or f"convergence_{metric}")


# --------------------------------------------------------------------------- 3 breakdown

_PARTS = {"compute": "compute_s", "exposed sync": "exposed_sync_s", "waiting": "wait_s",
          "other": "other_s"}
HIDDEN = "hidden sync (overlapped)"


def _breakdown_per_trial(steps: pd.DataFrame) -> pd.DataFrame:
    if steps.empty:
        raise NoData("no per-step breakdown (no worker spans)")
    keys = [c for c in ("run", "trial") if c in steps.columns]
    cols = list(_PARTS.values()) + ["step_s"]
    if "hidden_sync_s" in steps.columns:
        cols.append("hidden_sync_s")
    return steps.groupby(keys + ["scheme"], dropna=False)[cols].mean().reset_index()


def draw_breakdown(ax: Axes, steps: pd.DataFrame, legend: bool = True) -> Axes:
    """Mean time per step per scheme: compute, exposed sync, waiting, other (stacked bars).

    Per trial the mean over its worker steps is taken, then the mean over
    trials; the whisker is the 95 % interval of the per-trial total.  Sync
    a comm thread ran while the worker computed (PGCS) does not add to the
    step: it is drawn as a thin hatched bar under the compute segment,
    starting where compute starts ("hidden sync (overlapped)").
    """
    per_trial = _breakdown_per_trial(steps)
    schemes = style.sort_schemes(per_trial["scheme"].unique())
    hidden = {s: float(per_trial.loc[per_trial["scheme"] == s, "hidden_sync_s"].mean()) * 1e3
              if "hidden_sync_s" in per_trial.columns else 0.0 for s in schemes}
    any_hidden = any(v > 0 for v in hidden.values())
    # with hidden sync somewhere, the main bars move up to make room for the thin bars below
    main_h, main_off = (0.5, 0.1) if any_hidden else (0.62, 0.0)
    ys = np.arange(len(schemes))[::-1]
    drawn: set[str] = set()
    for y, scheme in zip(ys, schemes, strict=True):
        g = per_trial[per_trial["scheme"] == scheme]
        left = 0.0
        for label, col in _PARTS.items():
            v = float(g[col].mean()) * 1e3
            if not v > 0:
                continue
            ax.barh(y + main_off, v, left=left, height=main_h, gid=f"part:{label}",
                    **style.breakdown_kw(label))
            drawn.add(label)
            left += v
        if hidden[scheme] > 0:
            ax.barh(y + main_off - main_h / 2 - 0.13, hidden[scheme], left=0.0, height=0.16,
                    gid=f"part:{HIDDEN}", **style.breakdown_kw(HIDDEN))
            drawn.add(HIDDEN)
        mean, hw, _ = ci95(g["step_s"] * 1e3)
        if not math.isnan(hw):
            ax.errorbar(mean, y + main_off, xerr=hw, color="black", capsize=2, linewidth=0.8)
    ax.set_yticks(ys, schemes)
    ax.set_ylim(-0.6, len(schemes) - 0.4)
    ax.set_xlabel("Time per step (ms)")
    ax.set_xlim(left=0)
    ax.grid(axis="y", visible=False)
    ax.tick_params(axis="y", length=0)
    # hidden sync beside compute (it overlaps compute), then the additive parts
    order = ["compute"] + ([HIDDEN] if HIDDEN in drawn else []) + [k for k in _PARTS if k != "compute"]
    handles = [Patch(**style.breakdown_kw(k), label=k) for k in order]
    return _finish(ax, handles, legend, ncol=3)


def breakdown(steps: pd.DataFrame, out_dir: Path, name: str = "breakdown", note: str | None = None,
              warning: str | None = None) -> list[Path]:
    """:func:`draw_breakdown` as a column-wide figure, legend on top; returns [pdf, png].

    ``note``: the compute model, ``warning``: unfaithful trials, written under the figure (see
    :func:`convergence`)."""
    per_trial = _breakdown_per_trial(steps)
    with style.paper_style():
        fig, ax = style.new_figure(0.95 + 0.28 * per_trial["scheme"].nunique()
                                   + 0.2 * (bool(note) + bool(warning)))
        draw_breakdown(ax, steps, legend=False)
        handles = legend_handles(ax)
        _legend_top(fig, handles, 3)
        _compute_note(fig, note, warning)
        return style.save_figure(fig, out_dir, name)


# --------------------------------------------------------------------------- scheme comparison

#: trial_summary column -> axis label, scale; the panels of :func:`schemes`
SCHEME_METRICS = {"time_to_target_s": ("Time to target (s)", 1.0),
                  "compute_utilization": ("Compute utilization (%)", 100.0)}


def _scheme_values(trials: pd.DataFrame, metric: str) -> dict[str, np.ndarray]:
    if trials.empty or metric not in trials.columns or "scheme" not in trials.columns:
        raise NoData(f"no per-trial {metric}")
    vals = {sc: pd.to_numeric(trials.loc[trials["scheme"] == sc, metric], errors="coerce").dropna()
            .to_numpy(float) for sc in style.sort_schemes(trials["scheme"].dropna().unique())}
    if not any(len(v) for v in vals.values()):
        raise NoData(f"no trial has a {metric} (target never reached, or no worker spans)")
    return vals


def draw_scheme_bars(ax: Axes, trials: pd.DataFrame, metric: str = "time_to_target_s") -> Axes:
    """One horizontal bar per scheme: the mean over trials of ``metric`` with its 95 % interval; each
    trial as a dot.  A scheme whose trials never reached the target is listed with "n/a" (how many
    reached it is in the label, so a mean over the lucky few does not pass for the scheme's)."""
    label, scale = SCHEME_METRICS.get(metric, (metric, 1.0))
    total = trials.groupby("scheme").size()
    vals = _scheme_values(trials, metric)
    ys = np.arange(len(vals))[::-1]
    names = []
    for y, (scheme, v) in zip(ys, vals.items(), strict=True):
        st = style.scheme_style(scheme)
        n_all = int(total.get(scheme, len(v)))
        names.append(f"{scheme} ({len(v)}/{n_all})" if len(v) < n_all else scheme)
        if not len(v):
            ax.text(0, y, " n/a", va="center", ha="left", fontsize="small")
            continue
        mean, hw, _ = ci95(v * scale)
        ax.barh(y, mean, height=0.62, **style.fill_kw(st["color"], style.scheme_hatch(scheme)))
        if not math.isnan(hw):
            ax.errorbar(mean, y, xerr=hw, color="black", capsize=2, linewidth=0.8)
        ax.plot(v * scale, np.full(len(v), y), linestyle="none", marker=st["marker"], markersize=2.5,
                markerfacecolor="white", markeredgecolor="black", markeredgewidth=0.5)
    ax.set_yticks(ys, names)
    ax.set_ylim(-0.6, len(vals) - 0.4)
    ax.set_xlabel(label)
    ax.set_xlim(left=0, right=100 if metric == "compute_utilization" else None)
    ax.grid(axis="y", visible=False)
    ax.tick_params(axis="y", length=0)
    return ax


def schemes(trials: pd.DataFrame, out_dir: Path, name: str = "schemes", note: str | None = None,
            warning: str | None = None) -> list[Path]:
    """Time to target and compute utilization per scheme (mean, 95 % interval, every trial), one panel
    each, stacked; a panel with nothing to draw is left out.  Returns [pdf, png]."""
    metrics = []
    for m in SCHEME_METRICS:
        try:
            _scheme_values(trials, m)
            metrics.append(m)
        except NoData:
            continue
    if not metrics:
        raise NoData("no trial has a time to target or a compute utilization")
    n = trials["scheme"].nunique()
    with style.paper_style():
        fig, axes = style.new_figure(len(metrics) * (0.55 + 0.24 * n) + 0.2 * (bool(note) + bool(warning)),
                                     nrows=len(metrics))
        for ax, m in zip(np.atleast_1d(axes), metrics, strict=True):
            draw_scheme_bars(ax, trials, m)
        _compute_note(fig, note, warning)
        return style.save_figure(fig, out_dir, name)


# --------------------------------------------------------------------------- 4 links


def _links_data(rates: pd.DataFrame, trial: str | None, run: str | None) -> pd.DataFrame:
    if rates.empty:
        raise NoData("no link samples")
    trial, df = _pick(rates, trial, run)
    if df.empty:
        raise NoData(f"{trial}: no link samples")
    return df


def draw_links(ax: Axes, rates: pd.DataFrame, trial: str | None = None, what: str = "rate",
               capacities_bps: dict[str, float] | None = None, run: str | None = None,
               legend: bool = True) -> Axes:
    """WAN ``rate`` (Mbit/s) or egress queue ``backlog`` (KB) per link direction over time.

    Directions differ in colour, dash and marker; capacities (``rate``) are
    dotted lines in the direction's colour.  A backlog that is zero
    throughout says so instead of drawing a flat line.
    """
    df = _links_data(rates, trial, run)
    dirs = sorted(df["direction"].unique())
    caps = capacities_bps or {}
    col = "rate_bps" if what == "rate" else "backlog_bytes"
    div = 1e6 if what == "rate" else 1e3
    series = {d: df[df["direction"] == d].sort_values("t_s").dropna(subset=[col]) for d in dirs}
    quantity = "rate" if what == "rate" else "backlog"
    if not any(len(g) for g in series.values()):
        note: str | None = f"no {quantity} samples"
    elif not any((g[col] > 0).any() for g in series.values()):
        note = f"{quantity} 0 in every sample"
    else:
        note = None
    handles = []
    for i, d in enumerate(dirs):
        c = LINK_COLORS[i % len(LINK_COLORS)]
        ls = LINK_DASHES[i % len(LINK_DASHES)]
        mk = LINK_MARKERS[i % len(LINK_MARKERS)]
        g = series[d]
        if len(g) and note is None:
            # about six markers per line where it carries traffic (not on the idle baseline),
            # shifted per direction so that the markers of different directions do not coincide
            busy = np.flatnonzero(g[col].to_numpy(float) > 0)
            every = max(1, len(busy) // 6)
            marks = busy[(i * every) // len(dirs) % every::every].tolist() if len(busy) else []
            ax.step(g["t_s"], g[col] / div, where="post", color=c, linestyle=ls, linewidth=0.9,
                    marker=mk, markersize=3, markevery=marks)
        if what == "rate" and d in caps:
            ax.axhline(caps[d] / 1e6, color=c, linestyle=(0, (1, 2)), linewidth=0.7)
        handles.append(Line2D([], [], color=c, linestyle=ls, marker=mk, markersize=3,
                              label=d.replace("->", " → ")))
    if what == "rate" and caps:
        handles.append(Line2D([], [], color="#555555", linestyle=(0, (1, 2)), label="capacity"))
    if note:  # say so instead of drawing a flat line at zero a reader has to puzzle over
        ax.text(0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center",
                color="#555555")
        ax.set_ylim(0, 1)
    ax.set_ylabel("Rate (Mbit/s)" if what == "rate" else "Queue backlog (KB)")
    ax.set_xlabel("Time since trial start (s)")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    return _finish(ax, handles, legend, ncol=3)


def links(rates: pd.DataFrame, out_dir: Path, trial: str | None = None,
          capacities_bps: dict[str, float] | None = None, name: str = "links",
          run: str | None = None) -> list[Path]:
    """WAN rate per link direction (top) and egress queue backlog (bottom) over time."""
    _links_data(rates, trial, run)
    with style.paper_style():
        fig, (ax_r, ax_q) = style.new_figure(3.2, nrows=2, sharex=True)
        draw_links(ax_r, rates, trial, "rate", capacities_bps, run, legend=False)
        draw_links(ax_q, rates, trial, "backlog", None, run, legend=False)
        ax_r.set_xlabel("")
        handles = legend_handles(ax_r)
        _legend_top(fig, handles, _ncol(len(handles), 3))
        return style.save_figure(fig, out_dir, name)


# --------------------------------------------------------------------------- 5 staleness


def _staleness_values(stale: pd.DataFrame) -> dict[str, np.ndarray]:
    if stale.empty or stale["staleness"].dropna().empty:
        raise NoData("no spans report staleness (no server schemes)")
    values = {sc: stale.loc[stale["scheme"] == sc, "staleness"].dropna().to_numpy(float)
              for sc in style.sort_schemes(stale["scheme"].unique())}
    return {k: v for k, v in values.items() if len(v)}


def draw_staleness(ax: Axes, stale: pd.DataFrame, max_bars: int = 16, legend: bool = True) -> Axes:
    """Distribution of update staleness per server scheme, pooled over repetitions.

    Integer staleness over a small range is drawn as grouped bars (fraction
    of updates per value, a hatch per scheme); otherwise as an empirical CDF
    (a marker and dash per scheme).  Means are in the legend.
    """
    values = _staleness_values(stale)
    allv = np.concatenate(list(values.values()))
    discrete = bool(np.all(allv == np.round(allv))) and allv.max() - allv.min() < max_bars
    styles = style.scheme_styles(values)
    handles: list[Any] = []
    if discrete:
        xs = np.arange(int(allv.min()), int(allv.max()) + 1)
        width = 0.8 / len(values)
        for i, (scheme, v) in enumerate(values.items()):
            frac = np.array([(v == x).mean() for x in xs])
            kw = style.fill_kw(styles[scheme]["color"], style.scheme_hatch(scheme))
            ax.bar(xs - 0.4 + width * (i + 0.5), frac, width=width, **kw)
            handles.append(Patch(**kw, label=f"{scheme} (mean {v.mean():.2f})"))
        ax.set_xticks(xs)
        ax.set_ylabel("Fraction of updates")
        ax.grid(axis="x", visible=False)
    else:
        for i, (scheme, v) in enumerate(values.items()):
            v = np.sort(v)
            y = np.arange(1, len(v) + 1) / len(v)
            st = styles[scheme]
            xs, ys = np.concatenate([[v[0]], v]), np.concatenate([[0.0], y])
            ax.step(xs, ys, where="post", color=st["color"], linestyle=st["linestyle"],
                    marker=st["marker"], markevery=(0.03 + 0.1 * i / len(values), 0.1))
            handles.append(_line_handle(st, f"{scheme} (mean {v.mean():.2f})"))
        ax.set_ylabel("CDF of updates (fraction)")
        ax.set_ylim(0, 1.02)
    ax.set_xlabel("Staleness (model versions)")
    return _finish(ax, handles, legend, ncol=3)


def staleness(stale: pd.DataFrame, out_dir: Path, name: str = "staleness",
              max_bars: int = 16) -> list[Path]:
    """:func:`draw_staleness` as a column-wide figure, legend on top; returns [pdf, png]."""
    _staleness_values(stale)
    with style.paper_style():
        fig, ax = style.new_figure(2.2)
        draw_staleness(ax, stale, max_bars, legend=False)
        handles = legend_handles(ax)
        _legend_top(fig, handles, _ncol(len(handles), 3))
        return style.save_figure(fig, out_dir, name)


# --------------------------------------------------------------------------- 6 sweep


def _sweep_data(df: pd.DataFrame, x: str, y: str, x_factor: float) -> pd.DataFrame:
    if df.empty or x not in df.columns or y not in df.columns:
        raise NoData(f"no sweep data for {y} against {x}")
    d = df.assign(_x=pd.to_numeric(df[x], errors="coerce") * x_factor,
                  _y=pd.to_numeric(df[y], errors="coerce")).dropna(subset=["_x", "_y"])
    if d.empty or d["_x"].nunique() < 2:
        raise NoData(f"{x}: fewer than two swept values with {y}")
    return d


def draw_sweep(ax: Axes, df: pd.DataFrame, x: str, y: str, xlabel: str | None = None,
               ylabel: str | None = None, predicted: dict[str, float] | float | None = None,
               logx: bool = False, x_factor: float = 1.0, legend: bool = True) -> Axes:
    """``y`` against swept parameter ``x`` per scheme: mean with 95 % CI error bars.

    ``predicted``: the planner's optimum (one x for all schemes, or per scheme),
    drawn as a vertical dashed line in the scheme's colour and named in the legend.
    ``x_factor`` converts x for display (e.g. 1e-6 for bit/s -> Mbit/s).  Schemes
    are dodged sideways a little so equal values do not hide each other's bars.
    """
    d = _sweep_data(df, x, y, x_factor)
    handles = []
    schemes = style.sort_schemes(d["scheme"].unique())
    styles = style.scheme_styles(schemes)
    xvals = np.sort(d["_x"].unique())
    if logx:
        step = float(np.min(np.diff(np.log10(xvals)))) if len(xvals) > 1 else 1.0
    else:
        step = float(np.min(np.diff(xvals))) if len(xvals) > 1 else 1.0
    for i, scheme in enumerate(schemes):
        g = d[d["scheme"] == scheme]
        pts = [(xv, *ci95(gg["_y"])) for xv, gg in g.groupby("_x")]
        off = (i - (len(schemes) - 1) / 2) * 0.06 * step
        xs = np.array([p[0] for p in pts])
        xs = xs * 10 ** off if logx else xs + off
        ms = np.array([p[1] for p in pts])
        hw = np.nan_to_num(np.array([p[2] for p in pts]))
        st = styles[scheme]
        ax.errorbar(xs, ms, yerr=hw, color=st["color"], marker=st["marker"],
                    linestyle=st["linestyle"], capsize=2, elinewidth=0.8)
        handles.append(_line_handle(st))
    if predicted is not None:
        preds = predicted if isinstance(predicted, dict) else {"": float(predicted)}
        for scheme, xv in preds.items():
            c = style.scheme_color(scheme) if scheme else "#333333"
            ax.axvline(float(xv) * x_factor, color=c, linestyle=(0, (4, 2)), linewidth=0.9)
            label = f"predicted optimum ({scheme})" if scheme else "predicted optimum"
            handles.append(Line2D([], [], color=c, linestyle=(0, (4, 2)), label=label))
    if logx:
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    if len(xvals) <= 8:  # label exactly the swept values
        ax.set_xticks(xvals, [f"{v:g}" for v in xvals])
    ax.set_xlabel(xlabel or x.removeprefix("sweep_"))
    ax.set_ylabel(ylabel or y)
    return _finish(ax, handles, legend, ncol=3)


def sweep(df: pd.DataFrame, x: str, y: str, out_dir: Path, name: str | None = None,
          xlabel: str | None = None, ylabel: str | None = None,
          predicted: dict[str, float] | float | None = None, logx: bool = False,
          x_factor: float = 1.0) -> list[Path]:
    """:func:`draw_sweep` as a column-wide figure, legend on top; returns [pdf, png]."""
    _sweep_data(df, x, y, x_factor)
    with style.paper_style():
        fig, ax = style.new_figure(2.4)
        draw_sweep(ax, df, x, y, xlabel, ylabel, predicted, logx, x_factor, legend=False)
        handles = legend_handles(ax)
        _legend_top(fig, handles, _ncol(len(handles), 3))
        return style.save_figure(fig, out_dir, name or f"sweep_{y}_vs_{x}")


# --------------------------------------------------------------------------- 7 BLP plan


def _layout(nodes: list[str], edges: list[tuple[str, str]]) -> dict[str, tuple[float, float]]:
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from(edges)
    if len(nodes) <= 3:
        return {n: (math.cos(2 * math.pi * i / len(nodes) + math.pi / 2),
                    math.sin(2 * math.pi * i / len(nodes) + math.pi / 2))
                for i, n in enumerate(nodes)}
    pos = nx.kamada_kawai_layout(g.to_undirected())
    return {n: (float(p[0]), float(p[1])) for n, p in pos.items()}


def _plan_trees(plan: dict[str, Any]) -> list[dict[str, Any]]:
    trees = plan.get("trees") if isinstance(plan, dict) else None
    if not trees:
        raise NoData("plan has no trees")
    return list(trees)


def _root_label(tree: dict[str, Any]) -> str:
    """``root``, or ``root<>pair`` for a tree rooted at a link (both ends drawn as roots)."""
    return f"{tree.get('root')}<>{tree['pair']}" if tree.get("pair") else str(tree.get("root"))


def draw_plan(ax: Axes, plan: dict[str, Any],
              positions: dict[str, tuple[float, float]] | None = None, legend: bool = True) -> Axes:
    """A BLP plan on the DC graph: one colour and dash per aggregation tree, share per link.

    ``plan``: ``{"trees": [{"root", "edges": [[u, v], ...], "share"}], "predicted_s"?,
    "graph"?: {"edges": [[a, b], ...]}, "positions"?: {node: [x, y]}}``; an
    edge ``[u, v]`` carries that tree's share of the gradient from u to v.
    Graph links no tree uses are drawn in light grey; each tree's arcs are
    labelled with the share of the gradient that tree carries; roots have a
    thick outline (both ends of a link root, ``"pair"``, labelled ``root<>pair``).
    """
    trees = _plan_trees(plan)
    # edges as [[u, v], ...] or the planner's own form, {"parents": {child: parent}} (reduce direction)
    tree_edges = [[(str(u), str(v)) for u, v in t.get("edges", [])]
                  or [(str(c), str(p)) for c, p in (t.get("parents") or {}).items()] for t in trees]
    graph_edges = [(str(e[0]), str(e[1])) for e in (plan.get("graph") or {}).get("edges", [])]
    if not graph_edges and plan.get("links"):  # the planner lists every link direction it priced
        graph_edges = [(str(lk["src"]), str(lk["dst"])) for lk in plan["links"] if "src" in lk and "dst" in lk]
    nodes = sorted({n for es in tree_edges for e in es for n in e}
                   | {n for e in graph_edges for n in e} | {str(t.get("root")) for t in trees}
                   | {str(d) for d in plan.get("dcs", [])})
    pos = positions or plan.get("positions") or _layout(nodes, [e for es in tree_edges for e in es]
                                                        + graph_edges)
    pos = {str(k): (float(v[0]), float(v[1])) for k, v in pos.items()}
    used = {e for es in tree_edges for e in es}
    ax.set_aspect("equal")
    ax.axis("off")
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    span = max(max(xs) - min(xs), max(ys) - min(ys), 1e-6)
    r_node = 0.09 * span
    for a, b in graph_edges:
        if (a, b) not in used and (b, a) not in used:
            ax.plot([pos[a][0], pos[b][0]], [pos[a][1], pos[b][1]], color="#DDDDDD",
                    linewidth=1.0, zorder=0)
    pad = r_node * 2.2
    ax.set_xlim(min(xs) - pad, max(xs) + pad)
    ax.set_ylim(min(ys) - pad, max(ys) + pad)
    fig = _root(ax)
    fig.canvas.draw()  # settle the layout so data units convert to points
    px = ax.transData.transform((r_node, 0))[0] - ax.transData.transform((0, 0))[0]
    shrink = px * 72 / fig.dpi + 1.0
    handles = []
    for i, (t, es) in enumerate(zip(trees, tree_edges, strict=True)):
        c = LINK_COLORS[i % len(LINK_COLORS)]
        ls = LINK_DASHES[i % len(LINK_DASHES)]
        rad = 0.12 + 0.12 * i
        share = float(t.get("share", 0.0))
        for u, v in es:
            ax.add_patch(FancyArrowPatch(pos[u], pos[v], connectionstyle=f"arc3,rad={rad}",
                                         arrowstyle="-|>", mutation_scale=8, color=c,
                                         linewidth=0.6 + 2.5 * share, linestyle=ls,
                                         shrinkA=shrink, shrinkB=shrink, zorder=2))
        handles.append(Line2D([], [], color=c, linewidth=1.5, linestyle=ls,
                              label=f"tree at {_root_label(t)}: {100 * share:.0f} %"))
    # each arc is labelled with its tree's share at the arc's midpoint (quadratic Bezier of
    # matplotlib's arc3: control point = chord midpoint + rad * (dy, -dx))
    for i, (t, es) in enumerate(zip(trees, tree_edges, strict=True)):
        rad = 0.12 + 0.12 * i
        c = LINK_COLORS[i % len(LINK_COLORS)]
        for u, v in es:
            (x0, y0), (x1, y1) = pos[u], pos[v]
            mx = (x0 + x1) / 2 + 0.5 * rad * (y1 - y0)
            my = (y0 + y1) / 2 - 0.5 * rad * (x1 - x0)
            ax.text(mx, my, f"{100 * float(t.get('share', 0)):.0f}%", ha="center",
                    va="center", fontsize=6.5, color=c, zorder=4,
                    bbox={"boxstyle": "round,pad=0.12", "facecolor": "white",
                          "edgecolor": "none"})
    roots = {str(t.get("root")) for t in trees} | {str(t["pair"]) for t in trees if t.get("pair")}
    for n_, (x, y) in pos.items():
        if n_ not in nodes:
            continue
        ax.add_patch(matplotlib_circle((x, y), r_node, n_ in roots))
        ax.text(x, y, n_, ha="center", va="center", fontsize=7, zorder=6)
    if isinstance(plan.get("predicted_s"), (int, float)):
        ax.set_title(f"Predicted sync time {plan['predicted_s']:.3g} s")
    return _finish(ax, handles, legend, ncol=2)


def plan(plan: dict[str, Any], out_dir: Path, positions: dict[str, tuple[float, float]] | None = None,
         name: str = "blp_plan") -> list[Path]:
    """:func:`draw_plan` as a column-wide figure, legend on top; returns [pdf, png]."""
    _plan_trees(plan)
    with style.paper_style():
        fig, ax = style.new_figure(3.0)
        draw_plan(ax, plan, positions, legend=False)
        handles = legend_handles(ax)
        _legend_top(fig, handles, _ncol(len(handles), 2))
        return style.save_figure(fig, out_dir, name)


def matplotlib_circle(xy: tuple[float, float], r: float, root: bool) -> Any:
    from matplotlib.patches import Circle

    return Circle(xy, r, facecolor="white", edgecolor="black", linewidth=1.6 if root else 0.8,
                  zorder=5)
