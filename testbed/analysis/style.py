"""Shared paper style: sizes, fonts, and a fixed look per scheme and per phase.

Why fixed: a reader compares figures across a paper, so ``gsyn`` must look
the same in the convergence plot, the breakdown and the sweep.  Colours come
from the Okabe-Ito palette (safe for the common colour-vision deficiencies)
plus Paul Tol's wine for ``pgcs-blp`` (a darker relative of ``pgcs``).

Greyscale and many variants: colour alone never carries meaning.  Every
line gets a marker *and* a dash from :func:`scheme_style`; variants of a
scheme (``gsyn-g1`` .. ``gsyn-g6``, ``ssp-s2``/``ssp-s4``, ``pgcs-blp
expert 3``) keep the scheme's hue, change lightness, and walk to the next
(marker, dash) pairs, so they stay apart printed in black and white.  Filled
areas (timeline phases, breakdown parts, staleness bars) get hatches where
their luminances are close.

No backend is chosen here: figures are :class:`matplotlib.figure.Figure`
objects with an Agg canvas attached (which renders and saves without a
display and without pyplot), so importing this module in a notebook leaves
the notebook's backend alone.

Figures are sized for a single column (3.4 in) with 8 pt text, and use
constrained layout so labels do not collide; :func:`layout_problems` lets
tests and the report check that they really don't.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.colors as mcolors
import matplotlib.text
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

COLUMN_WIDTH_IN = 3.4
DOUBLE_WIDTH_IN = 7.0

# Okabe & Ito (2008) "Color Universal Design"
OKABE_ITO = {
    "black": "#000000", "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7",
}
TOL_WINE = "#882255"
TOL_INDIGO = "#332288"  # Paul Tol's indigo: DiLoCo, the local-SGD state of the art
GREY = "#999999"

SCHEME_COLORS: dict[str, str] = {
    "sequential": OKABE_ITO["black"],
    "bsp-ring": OKABE_ITO["blue"],
    "bsp-hier": OKABE_ITO["sky"],
    "asp": OKABE_ITO["vermillion"],
    "ssp": OKABE_ITO["orange"],
    "gsyn": OKABE_ITO["green"],
    "pgcs": OKABE_ITO["purple"],
    "pgcs-blp": TOL_WINE,
    "diloco": TOL_INDIGO,
}
SCHEME_ORDER = list(SCHEME_COLORS)
# Tol "muted" colours for names outside the table, picked by a stable hash
_EXTRA = ["#117733", "#44AA99", "#999933", "#AA4499", "#CC6677", "#DDCC77", "#88CCEE"]

# ------------------------------------------------------------------ markers and dashes
#
# A style is a position p on a cycle of len(MARKER_CYCLE) * len(DASH_CYCLE) = 91 pairs
# (13 and 7 are coprime, so p -> (MARKER_CYCLE[p % 13], DASH_CYCLE[p % 7]) is one-to-one).
# The known schemes sit 10 apart (_BASE_POS), and variant v of a scheme takes
# position base + v, so variants 0..9 of all schemes are pairwise distinct.

DASH_NAMES = ["solid", "dotted", "sparse dots", "short dash", "dashed", "dash-dot",
              "dash-dot-dot"]
# short periods only: a legend's marker sits in the middle of its line and hides a long dash's gap
DASH_CYCLE: list[Any] = ["-", (0, (1, 1.2)), (0, (1, 2.5)), (0, (2, 1.2)), (0, (5, 2)),
                         (0, (4, 1.5, 1, 1.5)), (0, (4, 1, 1, 1, 1, 1))]
MARKER_CYCLE = ["o", "X", "<", "P", ">", "s", "p", "^", "h", "*", "d", "D", "v"]
# 9 schemes, 7 dashes: bsp-ring and ssp share the solid line (their greys differ most, 0.34 and
# 0.64), diloco and gsyn the short dash (markers '<' and 'd', greys 0.20 and 0.42)
_BASE_POS = {"bsp-ring": 0, "gsyn": 10, "sequential": 20, "asp": 30, "bsp-hier": 40, "pgcs": 50,
             "pgcs-blp": 60, "ssp": 70, "diloco": 80}
_CYCLE = len(MARKER_CYCLE) * len(DASH_CYCLE)
_VARIANTS_PER_SCHEME = 10  # distinct positions before the next scheme's


def _pair(pos: int) -> tuple[str, Any]:
    return MARKER_CYCLE[pos % len(MARKER_CYCLE)], DASH_CYCLE[pos % len(DASH_CYCLE)]


SCHEME_MARKERS = {k: _pair(p)[0] for k, p in _BASE_POS.items()}
SCHEME_DASHES = {k: _pair(p)[1] for k, p in _BASE_POS.items()}
# bars per scheme (staleness): a hatch per scheme, cycled like the dashes for variants
HATCH_CYCLE = ["", "////", "....", "xxxx", "\\\\\\\\", "||||", "----", "++++", "oo"]
_BASE_HATCH = {"sequential": 0, "bsp-ring": 0, "bsp-hier": 1, "asp": 0, "ssp": 2, "gsyn": 3,
               "pgcs": 4, "pgcs-blp": 5, "diloco": 6}

# ------------------------------------------------------------------ phases

# Grey levels (luminance): compute 0.24 (the only dark solid fill: Okabe-Ito blue 30 % darker),
# WAN sync 0.47, intra-DC sync 0.62 (Okabe-Ito green 35 % lighter), push/pull/apply ~0.6,
# wait 0.80, eval 0.84; phases of similar grey differ by hatch.
PHASE_COLORS: dict[str, str] = {
    "compute": "#00507D",
    "intra_sync": "#59C0A4",
    "wan_sync": OKABE_ITO["vermillion"],
    "wait": "#CCCCCC",
    "push": OKABE_ITO["orange"],
    "pull": OKABE_ITO["sky"],
    "apply": OKABE_ITO["purple"],
    "eval": OKABE_ITO["yellow"],
}
# compute is the only dark solid fill; sync phases are hatched, each with its own pattern
PHASE_HATCHES: dict[str, str] = {
    "compute": "", "intra_sync": "....", "wan_sync": "////", "wait": "", "push": "\\\\\\\\",
    "pull": "xxxx", "apply": "||||", "eval": "++",
}
PHASE_LABELS = {"compute": "compute", "intra_sync": "intra-DC sync", "wan_sync": "WAN sync",
                "wait": "wait", "push": "push", "pull": "pull", "apply": "apply update",
                "eval": "eval"}
BREAKDOWN_COLORS = {"compute": PHASE_COLORS["compute"], "exposed sync": PHASE_COLORS["wan_sync"],
                    "waiting": PHASE_COLORS["wait"], "other": "#F2F2F2",
                    "hidden sync (overlapped)": "#FFFFFF"}
BREAKDOWN_HATCHES = {"compute": "", "exposed sync": "////", "waiting": "", "other": "",
                     "hidden sync (overlapped)": "////"}
# hatch (and outline) colour where the default (a darker shade of the fill) is not wanted
_HATCH_COLOR_OVERRIDE = {"hidden sync (overlapped)": OKABE_ITO["vermillion"], "other": "#555555"}

RC: dict[str, Any] = {
    "font.size": 8,
    "axes.labelsize": 8,
    "axes.titlesize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "legend.frameon": False,
    "legend.handlelength": 2.6,
    "lines.linewidth": 1.1,
    "lines.markersize": 3.6,
    "lines.markeredgewidth": 0.6,
    "axes.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.linewidth": 0.4,
    "grid.alpha": 0.35,
    "hatch.linewidth": 0.45,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "pdf.fonttype": 42,  # TrueType in PDFs: editable text, accepted by paper submission systems
    "ps.fonttype": 42,
    "savefig.dpi": 300,
    "figure.dpi": 100,
}


def _base(name: str) -> str | None:
    """Known scheme a name belongs to: exact, else longest known prefix (``ssp-s4`` -> ``ssp``)."""
    if name in SCHEME_COLORS:
        return name
    cands = [k for k in SCHEME_COLORS if any(name.startswith(k + sep) for sep in "-_ ")]
    return max(cands, key=len) if cands else None


def _hash(name: str) -> int:
    return int(hashlib.sha1(name.encode()).hexdigest(), 16)


def variant_index(name: str) -> int:
    """Which variant of its scheme a label is: 0 for the scheme itself, else from its suffix.

    A trailing number names the variant (``gsyn-g3`` -> 3, ``ssp-s4`` -> 4,
    ``pgcs-blp expert 0`` -> 0), so a series keeps its order and every figure
    gives the same label the same look; a suffix without a number gets a
    stable hash in 1..10.  Numbers wrap after 10.
    """
    name = str(name)
    base = _base(name)
    rest = name[len(base):] if base else name
    if base and not rest:
        return 0
    m = re.search(r"(\d+)\D*$", rest)
    if m:
        return int(m.group(1)) % _VARIANTS_PER_SCHEME
    return 1 + _hash(rest) % (_VARIANTS_PER_SCHEME - 1)


def _position(name: str, variant: int | None = None) -> int:
    base = _base(name)
    v = variant_index(name) if variant is None else variant
    start = _BASE_POS[base] if base else _hash(name) % _CYCLE
    return (start + v) % _CYCLE


def _shade(color: str, variant: int) -> str:
    """Variant ``v`` of a colour: the same hue mixed with black or white, v = 1..6 dark to light.

    Dark colours only lighten and light ones mostly darken, so every shade
    stays readable on white; after 6 the steps repeat (marker and dash differ).
    """
    if variant == 0:
        return mcolors.to_hex(color)
    lum = luminance(color)
    lo, hi = (0.2, 0.65) if lum < 0.2 else (-0.55, 0.25) if lum > 0.55 else (-0.5, 0.42)
    t = lo + (hi - lo) * ((variant - 1) % 6) / 5
    rgb = mcolors.to_rgb(color)
    mixed = [c * (1 + t) for c in rgb] if t < 0 else [c + (1 - c) * t for c in rgb]
    return mcolors.to_hex(mixed)


def scheme_color(name: str, variant: int | None = None) -> str:
    """The scheme's colour; variants (``gsyn-g2``) a lighter or darker shade of it."""
    name = str(name)
    base = _base(name)
    color = SCHEME_COLORS[base] if base is not None else _EXTRA[_hash(name) % len(_EXTRA)]
    return _shade(color, variant_index(name) if variant is None else variant) if base else color


def scheme_marker(name: str) -> str:
    return _pair(_position(str(name)))[0]


def scheme_dash(name: str) -> Any:
    return _pair(_position(str(name)))[1]


def scheme_hatch(name: str) -> str:
    """Hatch for a scheme's bars (staleness): per scheme, stepped for variants."""
    name = str(name)
    base = _base(name)
    start = _BASE_HATCH[base] if base else _hash(name)
    return HATCH_CYCLE[(start + variant_index(name)) % len(HATCH_CYCLE)]


def scheme_style(name: str) -> dict[str, Any]:
    """Line kwargs for a label: colour, marker, dash -- the same in every figure.

    Use :func:`scheme_styles` for all labels of one figure: it also settles
    the (rare) labels whose suffix numbers make two of them look alike.
    """
    name = str(name)
    return _style_at(name, variant_index(name))


def _style_at(name: str, variant: int) -> dict[str, Any]:
    marker, dash = _pair(_position(name, variant))
    return {"color": scheme_color(name, variant), "marker": marker, "linestyle": dash,
            "label": name}


def scheme_styles(names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """:func:`scheme_style` for each label of one figure, every (marker, dash) pair distinct.

    Labels keep their own style unless an earlier label (in the given order)
    already has its pair; then the variant steps on to the next free pair.
    """
    out: dict[str, dict[str, Any]] = {}
    used: set[tuple[str, str]] = set()
    for name in dict.fromkeys(str(n) for n in names):
        v = variant_index(name)
        for _ in range(_CYCLE):
            st = _style_at(name, v)
            key = (st["marker"], repr(st["linestyle"]))
            if key not in used:
                break
            v += 1
        used.add(key)
        out[name] = st
    return out


def sort_schemes(names: Iterable[str]) -> list[str]:
    """Known schemes in table order (baselines first), variants by number, then the rest."""
    names = list(dict.fromkeys(str(n) for n in names))

    def key(n: str) -> tuple[int, str, int, str]:
        base = _base(n)
        rest = n[len(base):] if base else n
        m = re.search(r"(\d+)\D*$", rest)
        stem = n[:len(n) - len(rest) + m.start(1)] if m else n
        return (SCHEME_ORDER.index(base) if base else len(SCHEME_ORDER), stem,
                int(m.group(1)) if m else -1, n)

    return sorted(names, key=key)


def luminance(color: Any) -> float:
    """Grey level 0..1 of a colour printed in greyscale (ITU-R 601 luma, as PIL's ``L`` mode)."""
    r, g, b = mcolors.to_rgb(color)
    return 0.299 * r + 0.587 * g + 0.114 * b


def hatch_color(fill: Any) -> str:
    """Colour of hatch lines over ``fill``: a dark shade on light fills, a light one on dark."""
    r, g, b = mcolors.to_rgb(fill)
    if luminance(fill) >= 0.4:
        return mcolors.to_hex((r * 0.45, g * 0.45, b * 0.45))
    return mcolors.to_hex((0.35 * r + 0.65, 0.35 * g + 0.65, 0.35 * b + 0.65))


def fill_kw(fill: Any, hatch: str = "", hatch_col: Any = None, outline: float = 0.0
            ) -> dict[str, Any]:
    """Patch kwargs for a filled area with an optional hatch.

    The hatch colour rides on the edge colour (how matplotlib colours
    hatches in every version), so the outline is off unless ``outline`` asks
    for one: a white outline would hide bars only a few points wide.
    """
    return {"facecolor": fill, "hatch": hatch or None,
            "edgecolor": hatch_col if hatch_col is not None else hatch_color(fill),
            "linewidth": outline}


def phase_kw(phase: str) -> dict[str, Any]:
    """Patch kwargs of a timeline phase: its colour and its hatch."""
    return fill_kw(PHASE_COLORS.get(phase, GREY), PHASE_HATCHES.get(phase, ""))


def breakdown_kw(part: str) -> dict[str, Any]:
    """Patch kwargs of a breakdown part (``compute``, ``exposed sync``, ...)."""
    over = _HATCH_COLOR_OVERRIDE.get(part)
    return fill_kw(BREAKDOWN_COLORS[part], BREAKDOWN_HATCHES.get(part, ""), over,
                   outline=0.5 if over else 0.0)


@contextmanager
def paper_style() -> Iterator[None]:
    with matplotlib.rc_context(RC):
        yield


def new_figure(height_in: float, nrows: int = 1, ncols: int = 1, width_in: float = COLUMN_WIDTH_IN,
               **kw: Any) -> tuple[Figure, Any]:
    """A constrained-layout figure at column width (call inside :func:`paper_style`).

    A plain :class:`~matplotlib.figure.Figure` on an Agg canvas: no pyplot,
    no backend switch, nothing registered globally (nothing to close).
    """
    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=True, **kw)
    fig.get_layout_engine().set(w_pad=0.02, h_pad=0.02, hspace=0.04, wspace=0.04)
    return fig, axes


LAYOUT_LOG: list[str] | None = None
"""When a list, :func:`save_figure` appends ``layout_problems`` of each figure (tests set it)."""


def save_figure(fig: Figure, out_dir: Path, name: str) -> list[Path]:
    """Write ``<name>.pdf`` and ``<name>.png`` (and close ``fig`` if pyplot manages it)."""
    if LAYOUT_LOG is not None:
        LAYOUT_LOG.extend(f"{name}: {p}" for p in layout_problems(fig))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.pdf", out_dir / f"{name}.png"]
    try:
        for p in paths:
            fig.savefig(p)
    finally:
        plt = sys.modules.get("matplotlib.pyplot")  # only a caller's pyplot figure needs closing
        if plt is not None:
            plt.close(fig)
    return paths


def _drawn_texts(fig: Figure) -> list[tuple[str, Any]]:
    """(text, window bbox) of every non-empty text drawn in one render of ``fig``.

    Only texts actually drawn count (matplotlib keeps Text objects for ticks
    outside the view), so the boxes are recorded during the draw itself.
    """
    drawn: list[tuple[str, Any]] = []
    original = matplotlib.text.Text.draw

    def recording_draw(self: Any, renderer: Any) -> None:
        original(self, renderer)
        if self.get_visible() and self.get_text().strip():
            bb = self.get_window_extent(renderer)
            if bb.width > 0 and bb.height > 0:
                drawn.append((self.get_text(), bb))

    matplotlib.text.Text.draw = recording_draw  # type: ignore[method-assign]
    try:
        fig.canvas.draw()
    finally:
        matplotlib.text.Text.draw = original  # type: ignore[method-assign]
    return drawn


def text_overlaps(fig: Figure, pad_px: float = 0.5) -> list[tuple[str, str]]:
    """Pairs of drawn texts (ticks, labels, titles, legend, annotations) whose boxes overlap."""
    drawn = [(t, bb.padded(-pad_px)) for t, bb in _drawn_texts(fig)]
    out = []
    for i in range(len(drawn)):
        for j in range(i + 1, len(drawn)):
            if drawn[i][1].overlaps(drawn[j][1]):
                out.append((drawn[i][0], drawn[j][0]))
    return out


def layout_problems(fig: Figure, pad_px: float = 0.5) -> list[str]:
    """Overlapping texts and texts cut off at the figure's edge, as readable messages.

    Tests call this on every figure before saving (and :func:`save_figure` when ``LAYOUT_LOG`` is a list).
    """
    drawn = _drawn_texts(fig)
    fb = fig.bbox
    out = [f"text {t!r} extends beyond the figure" for t, bb in drawn
           if bb.x0 < fb.x0 - pad_px or bb.y0 < fb.y0 - pad_px or bb.x1 > fb.x1 + pad_px
           or bb.y1 > fb.y1 + pad_px]
    boxes = [(t, bb.padded(-pad_px)) for t, bb in drawn]
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            if boxes[i][1].overlaps(boxes[j][1]):
                out.append(f"texts {boxes[i][0]!r} and {boxes[j][0]!r} overlap")
    return out


def fmt_bytes_axis(unit: str) -> float:
    """Divisor for a byte unit label (``KB``, ``MB``, ``GB``; decimal, as network people count)."""
    return {"B": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
