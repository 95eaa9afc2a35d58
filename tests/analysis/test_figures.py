"""Every figure function writes a non-empty PDF and PNG without colliding labels."""

from __future__ import annotations

import colorsys
from pathlib import Path

import matplotlib.colors as mcolors
import pandas as pd
import pytest

from testbed.analysis import figures as F
from testbed.analysis import style
from testbed.analysis import tables as T


@pytest.fixture(scope="module")
def tabs(run_dir: Path) -> dict[str, pd.DataFrame]:
    return T.all_tables(T.load(run_dir))


def _ok(paths: list[Path]) -> None:
    assert [p.suffix for p in paths] == [".pdf", ".png"]
    for p in paths:
        assert p.stat().st_size > 2000, p
    assert paths[0].read_bytes().startswith(b"%PDF")
    assert paths[1].read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("trial", ["pgcs-r0", "gsyn-r0", "bsp-hier-r0"])
def test_timeline(tabs: dict, tmp_path: Path, layout_log: list[str], trial: str) -> None:
    _ok(F.timeline(tabs["spans"], tmp_path, trial=trial, name=f"tl_{trial}"))
    _ok(F.timeline(tabs["spans"], tmp_path, trial=trial, steps=(0, 0), name="tl0"))
    assert layout_log == []


def test_convergence(tabs: dict, tmp_path: Path, layout_log: list[str]) -> None:
    _ok(F.convergence(tabs["metrics"], tmp_path, "loss"))
    _ok(F.convergence(tabs["metrics"], tmp_path, "acc"))
    assert layout_log == []


def test_breakdown_links_staleness(tabs: dict, tmp_path: Path, layout_log: list[str]) -> None:
    _ok(F.breakdown(tabs["steps"], tmp_path))
    _ok(F.links(tabs["link_rates"], tmp_path, trial="bsp-ring-r0",
                capacities_bps={"dc1->dc2": 1e9, "dc2->dc1": 1e9}))
    _ok(F.staleness(tabs["staleness"], tmp_path))
    # continuous staleness takes the CDF path
    cont = tabs["staleness"].assign(staleness=tabs["staleness"]["staleness"] * 3.7)
    _ok(F.staleness(cont, tmp_path, name="stale_cdf", max_bars=5))
    assert layout_log == []


def test_schemes(tabs: dict, tmp_path: Path, layout_log: list[str]) -> None:
    trials = tabs["trials"].copy()
    _ok(F.schemes(trials, tmp_path))
    # a scheme that missed the target in some trials says how many reached it; one with none "n/a"
    trials["time_to_target_s"] = [float("nan") if i % 2 else 5.0 + i for i in range(len(trials))]
    fig, ax = _axes()
    F.draw_scheme_bars(ax, trials, "time_to_target_s")
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert any("/" in lab for lab in labels), labels
    _ok(F.schemes(trials, tmp_path, name="schemes_partial"))
    assert layout_log == []
    with pytest.raises(F.NoData):
        F.schemes(trials.assign(time_to_target_s=float("nan"), compute_utilization=float("nan")), tmp_path)


def _axes():  # noqa: ANN202
    with style.paper_style():
        return style.new_figure(2.0)


def test_sweep(tmp_path: Path, layout_log: list[str]) -> None:
    rows = [{"scheme": s, "groups": g, "steps_per_s": 10 + g * (1 if s == "gsyn" else 0.2) + r}
            for s in ("gsyn", "bsp-ring", "asp") for g in (1, 2, 4, 8) for r in range(3)]
    _ok(F.sweep(pd.DataFrame(rows), "groups", "steps_per_s", tmp_path, xlabel="Groups G (count)",
                ylabel="Throughput (steps/s)", predicted={"gsyn": 4}, logx=True))
    _ok(F.sweep(pd.DataFrame(rows), "groups", "steps_per_s", tmp_path, name="s2", predicted=2.0))
    assert layout_log == []


def test_plan(tmp_path: Path, layout_log: list[str]) -> None:
    plan = {"trees": [{"root": "a", "edges": [["b", "a"], ["c", "a"]], "share": 0.6},
                      {"root": "b", "edges": [["a", "b"], ["c", "b"]], "share": 0.4}],
            "predicted_s": 0.25}
    _ok(F.plan(plan, tmp_path))
    plan4 = dict(plan, graph={"edges": [["a", "b"], ["b", "c"], ["c", "d"], ["a", "d"]]},
                 trees=plan["trees"] + [{"root": "d", "edges": [["c", "d"]], "share": 0.0}])
    _ok(F.plan(plan4, tmp_path, positions={"a": (0, 0), "b": (1, 0), "c": (1, 1), "d": (0, 1)},
               name="plan4"))
    assert layout_log == []


def test_no_data_is_reported_not_drawn(tmp_path: Path) -> None:
    empty = pd.DataFrame()
    for call in (lambda: F.timeline(empty, tmp_path), lambda: F.convergence(empty, tmp_path),
                 lambda: F.breakdown(empty, tmp_path), lambda: F.links(empty, tmp_path),
                 lambda: F.staleness(pd.DataFrame({"staleness": [], "scheme": []}), tmp_path),
                 lambda: F.sweep(empty, "x", "y", tmp_path), lambda: F.plan({}, tmp_path)):
        with pytest.raises(F.NoData):
            call()
    assert list(tmp_path.iterdir()) == []


def test_scheme_colours_fixed_and_distinct() -> None:
    known = list(style.SCHEME_COLORS)
    assert len(set(style.SCHEME_COLORS.values())) == len(known)
    # variants keep the scheme's hue (a lighter or darker shade of it), the scheme itself its colour
    hue = [colorsys.rgb_to_hsv(*mcolors.to_rgb(style.scheme_color(n)))[0] for n in ("ssp", "ssp-s4")]
    assert abs(hue[0] - hue[1]) < 0.02 and style.scheme_color("ssp-s4") != style.scheme_color("ssp")
    assert style.scheme_color("ssp") == style.SCHEME_COLORS["ssp"].lower()
    assert style.scheme_color("pgcs-blp") != style.scheme_color("pgcs")
    assert style.scheme_color("mystery") == style.scheme_color("mystery")
    assert style.sort_schemes(["gsyn", "zzz", "bsp-ring", "asp"]) == ["bsp-ring", "asp", "gsyn", "zzz"]


def test_layout_checker_catches_collisions() -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.0, 1.0))
    ax.set_xticks(range(10), [f"label{i}" for i in range(10)])
    ax.text(0.5, 0.5, "a very long annotation that leaves the figure", transform=ax.transAxes)
    probs = style.layout_problems(fig)
    plt.close(fig)
    assert any("overlap" in p for p in probs)
    assert any("beyond the figure" in p for p in probs)


def test_a_long_note_under_a_figure_is_wrapped_inside_it(tabs: dict, tmp_path: Path) -> None:
    """The compute label and the unfaithful warning are centred under the figure: a line wider than
    the figure was cut at both ends (seen with an emulated profile's label and two trial names)."""
    note = "emulated A100 80GB ResNet-50 v1.5 profile (resnet50-a100-tf32: 272.9 ms/step x 2, cv 0.05)"
    warn = ("UNFAITHFUL: 2 of 5 trials (network not as specified or CPU saturated; see summary.md): "
            "west=3.0_schemes=asp-r1, west=3.0_schemes=asp-r4")
    with style.paper_style():
        fig, ax = style.new_figure(2.0)
        F.draw_breakdown(ax, tabs["steps"], legend=False)
        F._compute_note(fig, note, warn)
        fig.canvas.draw()
        label = fig._supxlabel
        box = label.get_window_extent(fig.canvas.get_renderer())
        width = fig.bbox.width
        assert box.x0 >= 0 and box.x1 <= width, (box, width)
        assert label.get_text().count("\n") >= 2  # wrapped, nothing dropped
        assert "asp-r4" in label.get_text() and "cv 0.05" in label.get_text().replace("\n", " ")
