"""Figures read in greyscale and with many variants, compose as panels, and leave the backend alone."""

from __future__ import annotations

import colorsys
import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd
import pytest
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from testbed.analysis import figures as F
from testbed.analysis import style
from testbed.analysis import tables as T

ROOT = Path(__file__).resolve().parents[2]
GREY_MARGIN = 0.12  # luminance step (0..1) that stays visible printed in black and white


@pytest.fixture(scope="module")
def tabs(run_dir: Path) -> dict[str, pd.DataFrame]:
    return T.all_tables(T.load(run_dir))


def _axes(n: int = 1, w: float = 3.4, h: float = 2.6) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(w, h * n), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, list(np.atleast_1d(fig.subplots(n, 1)))


def _dash(line: object) -> object:
    # Line2D.get_linestyle() says "--" for every custom dash tuple; the pattern itself tells them apart
    return getattr(line, "_unscaled_dash_pattern", None) or line.get_linestyle()


# --------------------------------------------------------------------------- backend


_PROBE = """
import json, sys
import matplotlib
{imports}
raw = dict.__getitem__(matplotlib.rcParams, "backend")
out = {{"raw": raw if isinstance(raw, str) else "auto (unresolved)",
        "pyplot": "matplotlib.pyplot" in sys.modules}}
{after}
out["backend"] = matplotlib.get_backend()
print(json.dumps(out))
"""

_SAVE = """
import pandas as pd
from testbed.analysis import figures as F
steps = pd.DataFrame({"trial": ["t"], "scheme": ["gsyn"], "step_s": [0.1], "compute_s": [0.05],
                      "exposed_sync_s": [0.04], "wait_s": [0.0], "other_s": [0.01]})
paths = F.breakdown(steps, sys.argv[1])
raw = dict.__getitem__(matplotlib.rcParams, "backend")
out["after_save"] = raw if isinstance(raw, str) else "auto (unresolved)"
out["pyplot_after_save"] = "matplotlib.pyplot" in sys.modules
out["sizes"] = [p.stat().st_size for p in paths]
"""


def _probe(tmp_path: Path, imports: str, after: str = "", backend: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY",
                                                            "MPLBACKEND")}
    if backend:
        env["MPLBACKEND"] = backend
    env["PYTHONPATH"] = str(ROOT)
    code = _PROBE.format(imports=imports, after=after)
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_import_does_not_force_a_backend(tmp_path: Path) -> None:
    plain = _probe(tmp_path, "")
    ours = _probe(tmp_path, "import testbed.analysis.style\nimport testbed.analysis.figures")
    assert ours == plain
    assert ours["raw"] == "auto (unresolved)" and ours["pyplot"] is False
    # a backend the user chose (a notebook's inline backend, here svg) survives the import
    for backend in ("svg", "pdf"):
        chosen = _probe(tmp_path, "import testbed.analysis.figures", backend=backend)
        assert chosen["backend"] == _probe(tmp_path, "", backend=backend)["backend"] == backend


def test_figures_save_headless_without_pyplot(tmp_path: Path) -> None:
    out = _probe(tmp_path, "", after=_SAVE)
    assert out["after_save"] == "auto (unresolved)" and out["pyplot_after_save"] is False
    assert all(s > 2000 for s in out["sizes"])
    assert (tmp_path / "breakdown.png").read_bytes().startswith(b"\x89PNG")


# --------------------------------------------------------------------------- variants


def _variant_metrics(tabs: dict, labels: list[str]) -> pd.DataFrame:
    src = tabs["metrics"]
    parts = []
    for i, lab in enumerate(labels):
        base = lab.split("-g")[0].split("-s")[0] if not lab.startswith("bsp") else lab
        d = src[src["scheme"] == base].copy()
        d["loss"] = d["loss"] * (1 + 0.03 * i)
        d["scheme"] = lab
        d["trial"] = d["trial"].str.replace(base, lab, regex=False)
        parts.append(d)
    return pd.concat(parts, ignore_index=True)


VARIANTS = [f"gsyn-g{g}" for g in range(1, 7)] + ["ssp-s2", "ssp-s4", "bsp-ring"]


def test_variants_differ_in_marker_and_dash(tabs: dict, tmp_path: Path, layout_log: list[str]
                                            ) -> None:
    m = _variant_metrics(tabs, VARIANTS)
    fig, (ax_t, ax_s) = _axes(2)
    for ax, x in ((ax_t, "wall_s"), (ax_s, "step")):
        assert F.draw_convergence(ax, m, "loss", x, legend=False) is ax
        lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        assert sorted(ln.get_label() for ln in lines) == sorted(VARIANTS)
        pairs = [(ln.get_marker(), repr(_dash(ln))) for ln in lines]
        assert len(set(pairs)) == len(pairs), pairs
        assert all(ln.get_marker() not in (None, "None", "") for ln in lines)
    handles = F.legend_handles(ax_t)
    assert len({(h.get_marker(), repr(_dash(h))) for h in handles}) == len(VARIANTS)
    # variants keep their scheme's hue: gsyn-g* are greens, ssp-s* oranges
    for lab in VARIANTS:
        base = "gsyn" if lab.startswith("gsyn") else "ssp" if lab.startswith("ssp") else lab
        h = colorsys.rgb_to_hsv(*mcolors.to_rgb(style.scheme_color(lab)))[0]
        h0 = colorsys.rgb_to_hsv(*mcolors.to_rgb(style.scheme_color(base)))[0]
        assert abs(h - h0) < 0.02, lab
    # the saved figure (legend on top) passes the layout checks too
    F.convergence(m, tmp_path, "loss", name="variants")
    assert layout_log == []


def test_scheme_style_stable_and_distinct() -> None:
    # the same label looks the same whatever else is in the figure
    alone = style.scheme_styles(["gsyn-g3"])["gsyn-g3"]
    assert alone == style.scheme_styles(VARIANTS)["gsyn-g3"] == style.scheme_style("gsyn-g3")
    # variants 0..9 of every known scheme: all (marker, dash) pairs distinct
    pairs = {}
    for base in style.SCHEME_COLORS:
        for v in range(style._VARIANTS_PER_SCHEME):
            lab = base if v == 0 else f"{base}-x{v}"
            st = style.scheme_style(lab)
            key = (st["marker"], repr(st["linestyle"]))
            assert key not in pairs, (lab, pairs.get(key))
            pairs[key] = lab
    # labels whose numbers collide still get distinct looks within one figure
    clash = style.scheme_styles(["gsyn-g2", "gsyn-e2", "gsyn-13"])
    assert len({(s["marker"], repr(s["linestyle"])) for s in clash.values()}) == 3
    # per-expert curves: "expert 0..7" of one scheme are 8 looks of one hue
    experts = style.scheme_styles([f"pgcs expert {e}" for e in range(8)])
    assert len({(s["marker"], repr(s["linestyle"])) for s in experts.values()}) == 8
    assert style.variant_index("pgcs-blp expert 3") == 3 and style.variant_index("pgcs-blp") == 0
    assert style.variant_index("ssp-fast") == style.variant_index("ssp-fast") > 0


def test_expert_curves_distinguishable(tabs: dict) -> None:
    m = tabs["metrics"]
    m = m[m["scheme"].isin(["pgcs", "pgcs-blp", "bsp-ring"])]
    fig, (ax,) = _axes(1)
    F.draw_convergence(ax, m, "loss", "step", legend=True)
    labels = [ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    assert {"pgcs expert 0", "pgcs expert 1", "pgcs-blp expert 0", "pgcs-blp expert 1",
            "bsp-ring"} == set(labels)
    lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    assert len({(ln.get_marker(), repr(_dash(ln))) for ln in lines}) == len(lines)
    assert [t.get_text() for t in ax.get_legend().get_texts()] != []


# --------------------------------------------------------------------------- greyscale


def _adjacent_phases(spans: pd.DataFrame) -> set[frozenset[str]]:
    """Phases that follow each other on one timeline row in the fake runs."""
    out: set[frozenset[str]] = set()
    for _, g in spans.groupby(["trial", "role", "rank", "host"], dropna=False):
        ph = g.sort_values("start_s")["phase"].astype(str).tolist()
        out |= {frozenset(p) for p in zip(ph, ph[1:], strict=False) if p[0] != p[1]}
    return out


def _distinct_in_grey(a_fill: str, a_hatch: str, b_fill: str, b_hatch: str) -> bool:
    return (abs(style.luminance(a_fill) - style.luminance(b_fill)) >= GREY_MARGIN
            or (a_hatch or "") != (b_hatch or ""))


def test_phases_distinct_in_greyscale(tabs: dict) -> None:
    adjacent = _adjacent_phases(tabs["spans"])
    assert frozenset({"compute", "wan_sync"}) in adjacent
    assert frozenset({"push", "pull"}) in adjacent
    for pair in adjacent:
        a, b = sorted(pair)
        assert _distinct_in_grey(style.PHASE_COLORS[a], style.PHASE_HATCHES[a],
                                 style.PHASE_COLORS[b], style.PHASE_HATCHES[b]), (a, b)
    # compute is the one dark solid fill: it reads even as a sliver too thin for a hatch
    others = [p for p in style.PHASE_COLORS if p != "compute"]
    assert all(style.luminance(style.PHASE_COLORS[p])
               >= style.luminance(style.PHASE_COLORS["compute"]) + 0.2 for p in others)
    # and every pair of phases, adjacent or not, can be told apart in the legend
    names = list(style.PHASE_COLORS)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert _distinct_in_grey(style.PHASE_COLORS[a], style.PHASE_HATCHES[a],
                                     style.PHASE_COLORS[b], style.PHASE_HATCHES[b]), (a, b)


def test_breakdown_parts_distinct_in_greyscale() -> None:
    order = ["compute", "exposed sync", "waiting", "other"]
    for a, b in [*zip(order, order[1:], strict=False), ("compute", F.HIDDEN),
                 ("exposed sync", F.HIDDEN)]:
        ka, kb = style.breakdown_kw(a), style.breakdown_kw(b)
        assert _distinct_in_grey(ka["facecolor"], ka["hatch"], kb["facecolor"], kb["hatch"]), (a, b)


def test_timeline_legend_shows_hatches_and_thin_bars_have_no_outline(tabs: dict) -> None:
    fig, (ax,) = _axes(1)
    F.draw_timeline(ax, tabs["spans"], trial="bsp-hier-r0")
    legend = {t.get_text(): h for t, h in zip(ax.get_legend().get_texts(),
                                              ax.get_legend().legend_handles, strict=True)}
    assert legend["WAN sync"].get_hatch() == style.PHASE_HATCHES["wan_sync"]
    assert legend["intra-DC sync"].get_hatch() == style.PHASE_HATCHES["intra_sync"]
    assert not legend["compute"].get_hatch()
    bars = [p for p in ax.patches if str(p.get_gid()).startswith("phase:")]
    assert bars and all(p.get_linewidth() == 0 for p in bars)


# --------------------------------------------------------------------------- timeline window


def _rows(ax: Axes) -> dict[str, dict[str, int]]:
    """Bars per phase on each labelled row."""
    names = {round(y): t.get_text() for y, t in zip(ax.get_yticks(), ax.get_yticklabels(),
                                                      strict=True)}
    out: dict[str, dict[str, int]] = {n: {} for n in names.values()}
    for p in ax.patches:
        gid = str(p.get_gid())
        if gid.startswith("phase:"):
            row = names[round(p.get_y() + p.get_height() / 2)]
            out[row][gid[6:]] = out[row].get(gid[6:], 0) + 1
    return out


def _staggered_async() -> pd.DataFrame:
    """An ASP-like trial as on the real demo: two fast workers near the PS finish all their
    steps before the two slow ones (far, straggling) have started their first."""
    rows = []
    for rank, (t0, period) in enumerate([(1.0, 0.003), (1.0, 0.003), (1.08, 0.075),
                                         (1.09, 0.08)]):
        rows.append({"rank": rank, "role": "worker", "phase": "pull", "step": None,
                     "start_s": 0.2, "end_s": t0})
        for k in range(20):
            s = t0 + k * period
            rows += [{"rank": rank, "role": "worker", "phase": "compute", "step": k,
                      "start_s": s, "end_s": s + 0.3 * period},
                     {"rank": rank, "role": "worker", "phase": "push", "step": k,
                      "start_s": s + 0.3 * period, "end_s": s + 0.35 * period},
                     {"rank": rank, "role": "worker", "phase": "pull", "step": k,
                      "start_s": s + 0.35 * period, "end_s": s + period}]
    for k in range(60):
        rows.append({"rank": 4, "role": "server", "phase": "apply", "step": None,
                     "start_s": 1.0 + 0.03 * k, "end_s": 1.0 + 0.03 * k + 0.001})
    df = pd.DataFrame(rows)
    df["trial"], df["scheme"], df["run"] = "asp-r0", "asp", "x"
    df["host"] = ["ps" if r == "server" else f"h{k}" for r, k in zip(df["role"], df["rank"],
                                                                     strict=True)]
    df["dc"] = ["east" if k < 2 else "west" for k in df["rank"]]
    return df


@pytest.mark.parametrize("trial", ["asp-r0", "ssp-r0", "gsyn-r0", "pgcs-r0", "bsp-ring-r0"])
def test_default_timeline_window_has_work_in_every_row(tabs: dict, trial: str) -> None:
    spans = tabs["spans"]
    fig, (ax,) = _axes(1)
    F.draw_timeline(ax, spans, trial=trial, legend=False)
    rows = _rows(ax)
    workers = [r for r in rows if r.startswith("w") and not r.endswith("comm")]
    assert len(workers) == 4
    for r in workers:
        assert sum(rows[r].values()) >= 1, (trial, r, rows)
        assert rows[r].get("compute", 0) >= 1, (trial, r, rows)  # compute drawn, not lost
    for r in rows:
        if r.endswith("comm") or r == "PS":
            assert sum(rows[r].values()) >= 1, (trial, r)
    # about three step periods of the slowest worker, labelled by its start time
    lo, hi = F.timeline_window(spans[spans["trial"] == trial])
    w = spans[(spans["trial"] == trial) & (spans["role"] == "worker") & spans["step"].notna()]
    period = max(float(np.median(np.diff(g.groupby("step")["start_s"].min().sort_index())))
                 for _, g in w.groupby("rank"))
    assert hi - lo == pytest.approx(3 * period, rel=1e-6)
    assert ax.get_xlabel() == f"Time (ms) from t = {lo:.3f} s"
    assert ax.get_xlim()[1] == pytest.approx((hi - lo) * 1e3)


def test_timeline_window_when_fast_workers_finish_before_slow_ones_start() -> None:
    spans = _staggered_async()
    fig, (ax,) = _axes(1)
    F.draw_timeline(ax, spans, legend=False)
    rows = _rows(ax)
    assert set(rows) == {"w0 east", "w1 east", "w2 west", "w3 west", "PS"}
    for r, phases in rows.items():
        assert sum(phases.values()) >= 1, (r, rows)
    for r in ("w0 east", "w1 east", "w2 west", "w3 west"):
        assert rows[r].get("compute", 0) >= 1, (r, rows)
    # explicit steps work as before: exactly those steps' spans of every worker
    fig, (ax2,) = _axes(1)
    F.draw_timeline(ax2, spans, steps=(10, 12), legend=False)
    assert ax2.get_xlabel() == "Time (ms) from start of step 10"
    assert all(r["compute"] == 3 and r["push"] == 3 for name, r in _rows(ax2).items()
               if name != "PS")


def test_timeline_explicit_steps_and_window(tabs: dict) -> None:
    spans = tabs["spans"]
    fig, (ax,) = _axes(1)
    F.draw_timeline(ax, spans, trial="bsp-ring-r0", steps=(2, 3), legend=False)
    sel = spans[(spans["trial"] == "bsp-ring-r0") & spans["step"].between(2, 3)]
    assert ax.get_xlim()[1] == pytest.approx((sel["end_s"].max() - sel["start_s"].min()) * 1e3)
    fig, (ax,) = _axes(1)
    F.draw_timeline(ax, spans, trial="bsp-ring-r0", window=(0.2, 0.5), legend=False)
    assert ax.get_xlim() == pytest.approx((0, 300)) and ax.get_xlabel().endswith("t = 0.200 s")


# --------------------------------------------------------------------------- breakdown


def test_breakdown_draws_hidden_sync_without_lengthening_steps(tabs: dict) -> None:
    steps = tabs["steps"]
    fig, (ax,) = _axes(1)
    F.draw_breakdown(ax, steps)
    names = {round(y): t.get_text() for y, t in zip(ax.get_yticks(), ax.get_yticklabels(),
                                                      strict=True)}
    parts: dict[str, dict[str, object]] = {}
    for p in ax.patches:
        gid = str(p.get_gid())
        if gid.startswith("part:"):
            parts.setdefault(names[round(p.get_y() + p.get_height() / 2)], {})[gid[5:]] = p
    hidden = {s for s, d in parts.items() if F.HIDDEN in d}
    assert hidden == {"pgcs", "pgcs-blp"}
    per_trial = steps.groupby(["run", "trial", "scheme"])[
        ["compute_s", "exposed_sync_s", "wait_s", "other_s", "hidden_sync_s"]].mean()
    for scheme in hidden:
        h, c = parts[scheme][F.HIDDEN], parts[scheme]["compute"]
        assert h.get_x() == 0 and 0 < h.get_width() <= c.get_width() + 1e-9
        assert h.get_height() < c.get_height() / 2  # a thin bar beside compute, not a segment
        mean = per_trial.xs(scheme, level="scheme").mean() * 1e3
        assert h.get_width() == pytest.approx(mean["hidden_sync_s"])
        right = max(p.get_x() + p.get_width() for k, p in parts[scheme].items() if k != F.HIDDEN)
        assert right == pytest.approx(mean[["compute_s", "exposed_sync_s", "wait_s",
                                            "other_s"]].sum())
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert F.HIDDEN in labels and labels.index(F.HIDDEN) == labels.index("compute") + 1


# --------------------------------------------------------------------------- panels


def test_two_panels_compose_into_one_figure(tabs: dict, tmp_path: Path) -> None:
    with style.paper_style():
        fig = Figure(figsize=(7.0, 2.8), layout="constrained")
        FigureCanvasAgg(fig)
        ax_a, ax_b = fig.subplots(1, 2)
        assert F.draw_convergence(ax_a, tabs["metrics"], "loss", legend=False) is ax_a
        assert F.draw_breakdown(ax_b, tabs["steps"], legend=False) is ax_b
        ax_a.set_title("(a) convergence", loc="left")
        ax_b.set_title("(b) time per step", loc="left")
        handles = F.legend_handles(ax_a) + F.legend_handles(ax_b)
        fig.legend(handles=handles, loc="outside upper center", ncol=5)
        assert len(ax_a.get_lines()) >= 7 and len(ax_b.patches) >= 7
        assert style.layout_problems(fig) == []
        paths = style.save_figure(fig, tmp_path, "panels")
    assert all(p.stat().st_size > 2000 for p in paths)


def test_every_draw_function_returns_its_axes(tabs: dict) -> None:
    plan = {"trees": [{"root": "a", "edges": [["b", "a"], ["c", "a"]], "share": 1.0}]}
    sweep = pd.DataFrame([{"scheme": s, "g": g, "y": g + r} for s in ("gsyn", "asp")
                          for g in (1, 2) for r in range(2)])
    calls = [
        lambda ax: F.draw_timeline(ax, tabs["spans"], trial="pgcs-r0"),
        lambda ax: F.draw_convergence(ax, tabs["metrics"], "acc", "step"),
        lambda ax: F.draw_breakdown(ax, tabs["steps"]),
        lambda ax: F.draw_links(ax, tabs["link_rates"], trial="asp-r0", what="backlog"),
        lambda ax: F.draw_staleness(ax, tabs["staleness"]),
        lambda ax: F.draw_sweep(ax, sweep, "g", "y"),
        lambda ax: F.draw_plan(ax, plan),
    ]
    fig = Figure(figsize=(7, 14), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(calls), 1)
    for ax, call in zip(axes, calls, strict=True):
        assert call(ax) is ax
        assert ax.get_legend() is not None and F.legend_handles(ax)
    fig.canvas.draw()
