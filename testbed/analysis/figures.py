"""Paper figures, one function per figure, each fed by the tidy tables.

Every function takes DataFrames from :mod:`testbed.analysis.tables` (or a
plain dict for the BLP plan), writes ``<name>.pdf`` and ``<name>.png`` into
``out_dir`` and returns the paths.  When its input holds nothing to draw it
raises :class:`NoData` with the reason, so the report can say what was
skipped and why instead of drawing an empty frame.

Colours, markers and dashes per scheme come from :mod:`.style` and are the
same in every figure.  Spread over repetitions: convergence curves show the
median and a min-max band (few repetitions make a std band misleading);
bar and sweep figures show the mean with a 95 % Student-t interval.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Patch

from testbed.analysis import style
from testbed.analysis.tables import ci95

LINK_COLORS = ["#4477AA", "#EE6677", "#228833", "#CCBB44", "#66CCEE", "#AA3377", "#BBBBBB",
               "#332288", "#117733", "#882255", "#44AA99", "#999933"]


LINK_DASHES = ["-", (0, (4, 1.5)), (0, (1.5, 1)), (0, (4, 1, 1, 1))]


class NoData(Exception):
    """The input holds nothing this figure could draw; the message says what is missing."""


def _legend_ncol(fig: Any, labels: list[str], ncol: int) -> int:
    """Largest column count <= ``ncol`` whose row-major layout fits the figure width.

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
    avail = fig.get_figwidth() - 0.1
    for n in range(max(ncol, 1), 0, -1):
        cols = [max(widths[c::n], default=0) + handle for c in range(n)]
        if sum(cols) <= avail:
            return n
    return 1


def _legend_top(fig: Any, handles: list[Any], ncol: int) -> None:
    """Legend above the axes, outside them, read row by row (matplotlib fills columns first)."""
    ncol = _legend_ncol(fig, [h.get_label() for h in handles], ncol)
    rows = -(-len(handles) // ncol)
    grid = [handles[r * ncol:(r + 1) * ncol] for r in range(rows)]
    handles = [row[c] for c in range(ncol) for row in grid if c < len(row)]
    fig.legend(handles=handles, loc="outside upper center", ncol=ncol, columnspacing=1.0,
               handletextpad=0.4, borderaxespad=0.1)


def _ncol(n: int, max_col: int = 4) -> int:
    return min(n, max_col) if n else 1


# --------------------------------------------------------------------------- 1 timeline


def timeline(spans: pd.DataFrame, out_dir: Path, trial: str | None = None,
             steps: tuple[int, int] | None = None, name: str = "timeline",
             run: str | None = None) -> list[Path]:
    """Gantt chart per worker (and its comm thread, and the PS) over a window of steps.

    Default window: three steps from the middle of the trial (past warm-up).
    """
    if spans.empty:
        raise NoData("no spans")
    df = spans
    if run is not None and "run" in df.columns:
        df = df[df["run"] == run]
    if trial is None:
        trial = sorted(df["trial"].unique())[0]
    df = df[df["trial"] == trial]
    stepped = df[df["role"].isin(["worker", "comm"]) & df["step"].notna()]
    if stepped.empty:
        raise NoData(f"{trial}: no worker spans with a step")
    all_steps = np.sort(stepped["step"].astype(int).unique())
    if steps is None:
        mid = int(all_steps[len(all_steps) // 2])
        steps = (mid, mid + 2)
    win = stepped[(stepped["step"] >= steps[0]) & (stepped["step"] <= steps[1])]
    if win.empty:
        raise NoData(f"{trial}: no spans in steps {steps[0]}..{steps[1]}")
    lo, hi = float(win["start_s"].min()), float(win["end_s"].max())
    shown = df[(df["end_s"] > lo) & (df["start_s"] < hi)]
    shown = shown[(shown["role"] == "server") | shown.index.isin(win.index)
                  | (shown["role"].isin(["worker", "comm"]) & shown["step"].isna())]

    scale, unit = (1e3, "ms") if hi - lo < 5 else (1.0, "s")
    rows: list[tuple[str, pd.DataFrame]] = []
    ranks = sorted(r for r in shown.loc[shown["role"] != "server", "rank"].dropna().unique())
    for r in ranks:
        mine = shown[shown["rank"] == r]
        dc = str(mine["dc"].iloc[0]) if "dc" in mine.columns and len(mine) else ""
        main = mine[mine["role"] == "worker"]
        comm = mine[mine["role"] == "comm"]
        label = f"w{int(r)}" + (f" {dc}" if dc else "")
        rows.append((label, main))
        if not comm.empty:
            rows.append((f"w{int(r)} comm", comm))
    server = shown[shown["role"] == "server"]
    if not server.empty:
        for h, g in server.groupby("host"):
            rows.append((f"PS {h}" if server["host"].nunique() > 1 else "PS", g))

    with style.paper_style():
        fig, ax = style.new_figure(0.9 + 0.2 * len(rows))
        phases = []
        for i, (_, g) in enumerate(rows):
            y = len(rows) - 1 - i
            for phase, pg in g.groupby("phase"):
                s = (pg["start_s"].clip(lower=lo) - lo) * scale
                e = (pg["end_s"].clip(upper=hi) - lo) * scale
                ax.broken_barh(list(zip(s, e - s, strict=True)), (y - 0.38, 0.76),
                               facecolors=style.PHASE_COLORS.get(str(phase), style.GREY),
                               edgecolor="white", linewidth=0.3)
                phases.append(str(phase))
        ax.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)])
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.set_xlim(0, (hi - lo) * scale)
        ax.set_xlabel(f"Time from start of step {steps[0]} ({unit})")
        ax.grid(axis="y", visible=False)
        ax.tick_params(axis="y", length=0)
        order = [p for p in style.PHASE_COLORS if p in phases]
        order += sorted(set(phases) - set(order))
        handles = [Patch(facecolor=style.PHASE_COLORS.get(p, style.GREY),
                         label=style.PHASE_LABELS.get(p, p)) for p in order]
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


def convergence(metrics: pd.DataFrame, out_dir: Path, metric: str = "loss",
                name: str | None = None) -> list[Path]:
    """Held-out ``loss`` or ``acc`` against wall time (top) and steps (bottom), per scheme."""
    if metrics.empty or metric not in metrics.columns:
        raise NoData(f"no metrics with {metric}")
    m = metrics.assign(**{metric: pd.to_numeric(metrics[metric], errors="coerce")})
    m = m.dropna(subset=[metric, "wall_s", "step"])
    if m.empty:
        raise NoData(f"no {metric} values")
    scale = 100.0 if metric == "acc" else 1.0
    ylabel = "Held-out accuracy (%)" if metric == "acc" else "Held-out loss (nats)"
    keys = [c for c in ("run", "trial") if c in m.columns]
    with style.paper_style():
        fig, (ax_t, ax_s) = style.new_figure(3.6, nrows=2)
        handles = []
        for scheme in style.sort_schemes(m["scheme"].unique()):
            ms = m[m["scheme"] == scheme]
            st = style.scheme_style(scheme)
            # multi-expert runs: one curve per expert (their losses differ; mixed they zigzag)
            per_expert = "expert" in ms.columns and pd.to_numeric(ms["expert"], errors="coerce").notna().any()
            parts = list(ms.groupby(pd.to_numeric(ms["expert"], errors="coerce"))) if per_expert else [(None, ms)]
            for ax, xcol in ((ax_t, "wall_s"), (ax_s, "step")):
                for _, mp in parts:
                    curves = []
                    for _, g in mp.groupby(keys):
                        g = g.sort_values(xcol)
                        curves.append((g[xcol].to_numpy(float), g[metric].to_numpy(float) * scale))
                    if len(curves) == 1:
                        x, y = curves[0]
                        ax.plot(x, y, color=st["color"], linestyle=st["linestyle"])
                        continue
                    grid, med, lo, hi = _spread(curves)
                    ax.fill_between(grid, lo, hi, color=st["color"], alpha=0.18, linewidth=0)
                    ax.plot(grid, med, color=st["color"], linestyle=st["linestyle"])
            handles.append(Line2D([], [], color=st["color"], linestyle=st["linestyle"],
                                  label=f"{scheme} (per expert)" if per_expert else scheme))
        ax_t.set_xlabel("Wall time (s)")
        ax_s.set_xlabel("Training steps")
        for ax in (ax_t, ax_s):
            ax.set_ylabel(ylabel)
            ax.set_xlim(left=0)
        _legend_top(fig, handles, _ncol(len(handles), 4))
        return style.save_figure(fig, out_dir, name or f"convergence_{metric}")


# --------------------------------------------------------------------------- 3 breakdown


def breakdown(steps: pd.DataFrame, out_dir: Path, name: str = "breakdown") -> list[Path]:
    """Mean time per step per scheme: compute, exposed sync, waiting, other (stacked bars).

    Per trial the mean over its worker steps is taken, then the mean over
    trials; the whisker is the 95 % interval of the per-trial total.
    """
    if steps.empty:
        raise NoData("no per-step breakdown (no worker spans)")
    parts = {"compute": "compute_s", "exposed sync": "exposed_sync_s", "waiting": "wait_s",
             "other": "other_s"}
    keys = [c for c in ("run", "trial") if c in steps.columns]
    per_trial = steps.groupby(keys + ["scheme"], dropna=False)[
        list(parts.values()) + ["step_s"]].mean().reset_index()
    schemes = style.sort_schemes(per_trial["scheme"].unique())
    with style.paper_style():
        fig, ax = style.new_figure(0.9 + 0.26 * len(schemes))
        ys = np.arange(len(schemes))[::-1]
        for y, scheme in zip(ys, schemes, strict=True):
            g = per_trial[per_trial["scheme"] == scheme]
            left = 0.0
            for label, col in parts.items():
                v = float(g[col].mean()) * 1e3
                if not v > 0:
                    continue
                ax.barh(y, v, left=left, height=0.62, color=style.BREAKDOWN_COLORS[label],
                        edgecolor="#555555" if label == "other" else "white", linewidth=0.4)
                left += v
            mean, hw, _ = ci95(g["step_s"] * 1e3)
            if not math.isnan(hw):
                ax.errorbar(mean, y, xerr=hw, color="black", capsize=2, linewidth=0.8)
        ax.set_yticks(ys, schemes)
        ax.set_xlabel("Time per step (ms)")
        ax.set_xlim(left=0)
        ax.grid(axis="y", visible=False)
        ax.tick_params(axis="y", length=0)
        handles = [Patch(facecolor=c, edgecolor="#555555" if k == "other" else c, linewidth=0.4,
                         label=k) for k, c in style.BREAKDOWN_COLORS.items()]
        _legend_top(fig, handles, 4)
        return style.save_figure(fig, out_dir, name)


# --------------------------------------------------------------------------- 4 links


def links(rates: pd.DataFrame, out_dir: Path, trial: str | None = None,
          capacities_bps: dict[str, float] | None = None, name: str = "links",
          run: str | None = None) -> list[Path]:
    """WAN rate per link direction (top) and egress queue backlog (bottom) over time."""
    if rates.empty:
        raise NoData("no link samples")
    df = rates
    if run is not None and "run" in df.columns:
        df = df[df["run"] == run]
    if trial is None:
        trial = sorted(df["trial"].unique())[0]
    df = df[df["trial"] == trial]
    if df.empty:
        raise NoData(f"{trial}: no link samples")
    dirs = sorted(df["direction"].unique())
    caps = capacities_bps or {}
    with style.paper_style():
        fig, (ax_r, ax_q) = style.new_figure(3.2, nrows=2, sharex=True)
        handles = []
        for i, d in enumerate(dirs):
            # colour and dash both vary, so directions carrying the same traffic stay visible
            c = LINK_COLORS[i % len(LINK_COLORS)]
            ls = LINK_DASHES[i % len(LINK_DASHES)]
            g = df[df["direction"] == d].sort_values("t_s")
            ax_r.step(g["t_s"], g["rate_bps"] / 1e6, where="post", color=c, linestyle=ls,
                      linewidth=0.9)
            q = g.dropna(subset=["backlog_bytes"])
            if not q.empty:
                ax_q.step(q["t_s"], q["backlog_bytes"] / 1e3, where="post", color=c, linestyle=ls,
                          linewidth=0.9)
            if d in caps:
                ax_r.axhline(caps[d] / 1e6, color=c, linestyle=(0, (1, 2)), linewidth=0.7)
            handles.append(Line2D([], [], color=c, linestyle=ls, label=d.replace("->", " → ")))
        if caps:
            handles.append(Line2D([], [], color="#555555", linestyle=(0, (1, 2)), label="capacity"))
        ax_r.set_ylabel("Rate (Mbit/s)")
        ax_q.set_ylabel("Queue backlog (KB)")
        ax_q.set_xlabel("Time since trial start (s)")
        for ax in (ax_r, ax_q):
            ax.set_ylim(bottom=0)
        ax_q.set_xlim(left=0)
        _legend_top(fig, handles, _ncol(len(handles), 3))
        return style.save_figure(fig, out_dir, name)


# --------------------------------------------------------------------------- 5 staleness


def staleness(stale: pd.DataFrame, out_dir: Path, name: str = "staleness",
              max_bars: int = 16) -> list[Path]:
    """Distribution of update staleness per server scheme, pooled over repetitions.

    Integer staleness over a small range is drawn as grouped bars (fraction
    of updates per value); otherwise as an empirical CDF.  Means are in the legend.
    """
    if stale.empty or stale["staleness"].dropna().empty:
        raise NoData("no spans report staleness (no server schemes)")
    values = {sc: stale.loc[stale["scheme"] == sc, "staleness"].dropna().to_numpy(float)
              for sc in style.sort_schemes(stale["scheme"].unique())}
    values = {k: v for k, v in values.items() if len(v)}
    allv = np.concatenate(list(values.values()))
    discrete = bool(np.all(allv == np.round(allv))) and allv.max() - allv.min() < max_bars
    with style.paper_style():
        fig, ax = style.new_figure(2.2)
        handles = []
        if discrete:
            xs = np.arange(int(allv.min()), int(allv.max()) + 1)
            width = 0.8 / len(values)
            for i, (scheme, v) in enumerate(values.items()):
                frac = np.array([(v == x).mean() for x in xs])
                c = style.scheme_color(scheme)
                ax.bar(xs - 0.4 + width * (i + 0.5), frac, width=width, color=c, linewidth=0)
                handles.append(Patch(facecolor=c, label=f"{scheme} (mean {v.mean():.2f})"))
            ax.set_xticks(xs)
            ax.set_ylabel("Fraction of updates")
            ax.grid(axis="x", visible=False)
        else:
            for scheme, v in values.items():
                v = np.sort(v)
                y = np.arange(1, len(v) + 1) / len(v)
                st = style.scheme_style(scheme)
                ax.step(np.concatenate([[v[0]], v]), np.concatenate([[0.0], y]), where="post",
                        color=st["color"], linestyle=st["linestyle"])
                handles.append(Line2D([], [], color=st["color"], linestyle=st["linestyle"],
                                      label=f"{scheme} (mean {v.mean():.2f})"))
            ax.set_ylabel("CDF of updates (fraction)")
            ax.set_ylim(0, 1.02)
        ax.set_xlabel("Staleness (model versions)")
        _legend_top(fig, handles, _ncol(len(handles), 3))
        return style.save_figure(fig, out_dir, name)


# --------------------------------------------------------------------------- 6 sweep


def sweep(df: pd.DataFrame, x: str, y: str, out_dir: Path, name: str | None = None,
          xlabel: str | None = None, ylabel: str | None = None,
          predicted: dict[str, float] | float | None = None, logx: bool = False,
          x_factor: float = 1.0) -> list[Path]:
    """``y`` against swept parameter ``x`` per scheme: mean with 95 % CI error bars.

    ``predicted``: the planner's optimum (one x for all schemes, or per scheme),
    drawn as a vertical dashed line in the scheme's colour and named in the legend.
    ``x_factor`` converts x for display (e.g. 1e-6 for bit/s -> Mbit/s).  Schemes
    are dodged sideways a little so equal values do not hide each other's bars.
    """
    if df.empty or x not in df.columns or y not in df.columns:
        raise NoData(f"no sweep data for {y} against {x}")
    d = df.assign(_x=pd.to_numeric(df[x], errors="coerce") * x_factor,
                  _y=pd.to_numeric(df[y], errors="coerce")).dropna(subset=["_x", "_y"])
    if d.empty or d["_x"].nunique() < 2:
        raise NoData(f"{x}: fewer than two swept values with {y}")
    with style.paper_style():
        fig, ax = style.new_figure(2.4)
        handles = []
        schemes = style.sort_schemes(d["scheme"].unique())
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
            st = style.scheme_style(scheme)
            ax.errorbar(xs, ms, yerr=hw, color=st["color"], marker=st["marker"],
                        linestyle=st["linestyle"], capsize=2, elinewidth=0.8)
            handles.append(Line2D([], [], color=st["color"], marker=st["marker"],
                                  linestyle=st["linestyle"], label=scheme))
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


def plan(plan: dict[str, Any], out_dir: Path, positions: dict[str, tuple[float, float]] | None = None,
         name: str = "blp_plan") -> list[Path]:
    """A BLP plan on the DC graph: one colour per aggregation tree, share of the gradient per link.

    ``plan``: ``{"trees": [{"root", "edges": [[u, v], ...], "share"}], "predicted_s"?,
    "graph"?: {"edges": [[a, b], ...]}, "positions"?: {node: [x, y]}}``; an
    edge ``[u, v]`` carries that tree's share of the gradient from u to v.
    Graph links no tree uses are drawn in light grey; each tree's arcs are
    labelled with the share of the gradient that tree carries; roots have a
    thick outline.
    """
    trees = plan.get("trees") if isinstance(plan, dict) else None
    if not trees:
        raise NoData("plan has no trees")
    # edges as [[u, v], ...] or the planner's own form, {"parents": {child: parent}} (reduce direction)
    tree_edges = [[(str(u), str(v)) for u, v in t.get("edges", [])]
                  or [(str(c), str(p)) for c, p in (t.get("parents") or {}).items()] for t in trees]
    graph_edges = [(str(e[0]), str(e[1])) for e in (plan.get("graph") or {}).get("edges", [])]
    if not graph_edges and plan.get("links"):  # the planner lists every link direction it priced
        graph_edges = [(str(lk["src"]), str(lk["dst"])) for lk in plan["links"] if "src" in lk and "dst" in lk]
    if not graph_edges and plan.get("dcs"):
        graph_edges = []
    nodes = sorted({n for es in tree_edges for e in es for n in e}
                   | {n for e in graph_edges for n in e} | {str(t.get("root")) for t in trees}
                   | {str(d) for d in plan.get("dcs", [])})
    pos = positions or plan.get("positions") or _layout(nodes, [e for es in tree_edges for e in es]
                                                        + graph_edges)
    pos = {str(k): (float(v[0]), float(v[1])) for k, v in pos.items()}
    used = {e for es in tree_edges for e in es}
    with style.paper_style():
        fig, ax = style.new_figure(3.0)
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
        fig.canvas.draw()  # settle the layout so data units convert to points
        px = ax.transData.transform((r_node, 0))[0] - ax.transData.transform((0, 0))[0]
        shrink = px * 72 / fig.dpi + 1.0
        handles = []
        for i, (t, es) in enumerate(zip(trees, tree_edges, strict=True)):
            c = LINK_COLORS[i % len(LINK_COLORS)]
            rad = 0.12 + 0.12 * i
            share = float(t.get("share", 0.0))
            for u, v in es:
                ax.add_patch(FancyArrowPatch(pos[u], pos[v], connectionstyle=f"arc3,rad={rad}",
                                             arrowstyle="-|>", mutation_scale=8, color=c,
                                             linewidth=0.6 + 2.5 * share, shrinkA=shrink,
                                             shrinkB=shrink, zorder=2))
            handles.append(Line2D([], [], color=c, linewidth=1.5,
                                  label=f"tree at {t.get('root')}: {100 * share:.0f} %"))
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
        roots = {str(t.get("root")) for t in trees}
        for n_, (x, y) in pos.items():
            if n_ not in nodes:
                continue
            ax.add_patch(matplotlib_circle((x, y), r_node, n_ in roots))
            ax.text(x, y, n_, ha="center", va="center", fontsize=7, zorder=6)
        if isinstance(plan.get("predicted_s"), (int, float)):
            ax.set_title(f"Predicted sync time {plan['predicted_s']:.3g} s")
        _legend_top(fig, handles, _ncol(len(handles), 2))
        return style.save_figure(fig, out_dir, name)


def matplotlib_circle(xy: tuple[float, float], r: float, root: bool) -> Any:
    from matplotlib.patches import Circle

    return Circle(xy, r, facecolor="white", edgecolor="black", linewidth=1.6 if root else 0.8,
                  zorder=5)
