"""Shared paper style: sizes, fonts, and a fixed colour per scheme and per phase.

Why fixed: a reader compares figures across a paper, so ``gsyn`` must be the
same colour in the convergence plot, the breakdown and the sweep.  Colours
come from the Okabe-Ito palette (safe for the common colour-vision
deficiencies) plus Paul Tol's wine for ``pgcs-blp`` (a darker relative of
``pgcs``); every scheme also gets its own marker and dash so figures survive
greyscale printing.  Figures are sized for a single column (3.4 in) with
8 pt text, and use matplotlib's constrained layout so labels do not collide;
:func:`text_overlaps` lets tests and the report check that they really don't.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

COLUMN_WIDTH_IN = 3.4
DOUBLE_WIDTH_IN = 7.0

# Okabe & Ito (2008) "Color Universal Design"
OKABE_ITO = {
    "black": "#000000", "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7",
}
TOL_WINE = "#882255"
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
}
SCHEME_ORDER = list(SCHEME_COLORS)
SCHEME_MARKERS = {"sequential": "*", "bsp-ring": "o", "bsp-hier": "s", "asp": "^", "ssp": "v",
                  "gsyn": "D", "pgcs": "P", "pgcs-blp": "X"}
SCHEME_DASHES = {"sequential": (0, (1, 1)), "bsp-ring": "-", "bsp-hier": (0, (5, 2)),
                 "asp": (0, (3, 1, 1, 1)), "ssp": (0, (1, 1.5)), "gsyn": "-", "pgcs": "-",
                 "pgcs-blp": (0, (5, 2))}
# Tol "muted" colours for names outside the table, picked by a stable hash
_EXTRA = ["#332288", "#117733", "#44AA99", "#999933", "#AA4499", "#CC6677", "#DDCC77", "#88CCEE"]

PHASE_COLORS: dict[str, str] = {
    "compute": OKABE_ITO["blue"],
    "intra_sync": OKABE_ITO["green"],
    "wan_sync": OKABE_ITO["vermillion"],
    "wait": "#BBBBBB",
    "push": OKABE_ITO["orange"],
    "pull": OKABE_ITO["sky"],
    "apply": OKABE_ITO["purple"],
    "eval": OKABE_ITO["yellow"],
}
PHASE_LABELS = {"compute": "compute", "intra_sync": "intra-DC sync", "wan_sync": "WAN sync",
                "wait": "wait", "push": "push", "pull": "pull", "apply": "apply (PS)",
                "eval": "eval"}
BREAKDOWN_COLORS = {"compute": PHASE_COLORS["compute"], "exposed sync": PHASE_COLORS["wan_sync"],
                    "waiting": PHASE_COLORS["wait"], "other": "#F2F2F2"}

RC: dict[str, Any] = {
    "font.size": 8,
    "axes.labelsize": 8,
    "axes.titlesize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "legend.frameon": False,
    "legend.handlelength": 2.2,
    "lines.linewidth": 1.2,
    "lines.markersize": 4,
    "axes.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.linewidth": 0.4,
    "grid.alpha": 0.35,
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
    cands = [k for k in SCHEME_COLORS if name.startswith(k + "-") or name.startswith(k + "_")]
    return max(cands, key=len) if cands else None


def scheme_color(name: str) -> str:
    base = _base(str(name))
    if base is not None:
        return SCHEME_COLORS[base]
    h = int(hashlib.sha1(str(name).encode()).hexdigest(), 16)
    return _EXTRA[h % len(_EXTRA)]


def scheme_marker(name: str) -> str:
    return SCHEME_MARKERS.get(_base(str(name)) or "", "o")


def scheme_dash(name: str) -> Any:
    return SCHEME_DASHES.get(_base(str(name)) or "", "-")


def scheme_style(name: str) -> dict[str, Any]:
    """Line kwargs for a scheme: colour, marker, dash -- the same in every figure."""
    return {"color": scheme_color(name), "marker": scheme_marker(name),
            "linestyle": scheme_dash(name), "label": str(name)}


def sort_schemes(names: Iterable[str]) -> list[str]:
    """Known schemes in table order (baselines first), then the rest alphabetically."""
    names = list(dict.fromkeys(str(n) for n in names))

    def key(n: str) -> tuple[int, str]:
        base = _base(n)
        return (SCHEME_ORDER.index(base) if base else len(SCHEME_ORDER), n)

    return sorted(names, key=key)


@contextmanager
def paper_style() -> Iterator[None]:
    with plt.rc_context(RC):
        yield


def new_figure(height_in: float, nrows: int = 1, ncols: int = 1, width_in: float = COLUMN_WIDTH_IN,
               **kw: Any) -> tuple[Figure, Any]:
    """A constrained-layout figure at column width (call inside :func:`paper_style`)."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(width_in, height_in), layout="constrained",
                             **kw)
    fig.get_layout_engine().set(w_pad=0.02, h_pad=0.02, hspace=0.04, wspace=0.04)
    return fig, axes


LAYOUT_LOG: list[str] | None = None
"""When a list, :func:`save_figure` appends ``layout_problems`` of each figure (tests set it)."""


def save_figure(fig: Figure, out_dir: Path, name: str) -> list[Path]:
    """Write ``<name>.pdf`` and ``<name>.png`` and close the figure."""
    if LAYOUT_LOG is not None:
        LAYOUT_LOG.extend(f"{name}: {p}" for p in layout_problems(fig))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.pdf", out_dir / f"{name}.png"]
    try:
        for p in paths:
            fig.savefig(p)
    finally:
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
