"""``testbed report`` on clean, crashed and swept results, through the CLI entry points."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from testbed.analysis import cli, figures
from testbed.analysis.report import Options, report
from tests.analysis.fakes import truncate_run, write_run


def test_register_sets_func() -> None:
    parser = argparse.ArgumentParser(prog="testbed")
    sub = parser.add_subparsers(dest="command")
    cli.register(sub)
    args = parser.parse_args(["report", "/x", "--steps", "3:5", "--target-acc", "0.9"])
    assert args.func is cli.run and args.steps == (3, 5) and args.target_acc == 0.9
    with pytest.raises(SystemExit):
        parser.parse_args(["report", "/x", "--steps", "5:3"])


def test_report_on_truncated_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "exp" / "run1", schemes=("bsp-ring", "asp", "gsyn"), reps=2,
                    steps=6)
    truncate_run(run)
    rc = cli.main([str(run), "--gzip-mb", "0.001"])
    out = capsys.readouterr()
    assert rc == 0, out
    assert "Traceback" not in out.out + out.err
    assert "missing: run1/asp-r1/metrics.csv: missing" in out.out
    assert "last line truncated" in out.out
    summary = (run / "summary.md").read_text()
    assert "## Per scheme" in summary and "| gsyn |" in summary
    assert "metrics.csv: missing" in summary and "procs.jsonl: missing" in summary
    figs = {p.name for p in (run / "figures").iterdir()}
    assert {"breakdown.pdf", "breakdown.png", "convergence_loss.pdf", "staleness.png",
            "timeline_asp-r0.pdf", "links_gsyn-r0.png"} <= figs
    assert (run / "tables" / "trials.csv").exists()
    traces = list(run.glob("trials/*/trace.json.gz"))
    assert len(traces) == 6  # over the 1 KB threshold: gzipped


def test_report_on_trial_dir(run_dir: Path, tmp_path: Path) -> None:
    trial = tmp_path / "pgcs-r0"
    shutil.copytree(run_dir / "trials" / "pgcs-r0", trial)
    rep = report(trial, Options(target_loss=1.0))
    assert rep.kind == "trial" and rep.errors == []
    assert (trial / "trace.json").exists() and (trial / "summary.md").exists()
    assert "held-out loss <= 1 (command line)" in (trial / "summary.md").read_text()
    assert (trial / "figures" / "timeline_pgcs-r0.png").exists()


def test_report_on_hopeless_dirs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([str(tmp_path / "nope")]) == 2
    assert cli.main([str(tmp_path)]) == 2
    run = tmp_path / "run"
    (run / "trials" / "asp-r0").mkdir(parents=True)
    (run / "trials" / "asp-r0" / "metrics.csv").write_text("step,wall")
    rc = cli.main([str(run)])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert rc == 0
    text = (run / "summary.md").read_text()
    assert "events/*.jsonl: missing" in text and "no complete rows" in text


def test_report_on_sweep_experiment(sweep_experiment: Path) -> None:
    rep = report(sweep_experiment, Options(traces=False))
    assert rep.errors == [], rep.errors
    figs = {p.name for p in (sweep_experiment / "figures").iterdir()}
    assert {"sweep_steps_per_s_vs_groups.pdf", "sweep_time_to_target_s_vs_groups.png"} <= figs
    summary = (sweep_experiment / "summary.md").read_text()
    assert "| scheme | groups | trials |" in summary
    for run in ("g1", "g2", "g4"):
        assert (sweep_experiment / run / "summary.md").exists()
        assert (sweep_experiment / run / "figures" / "breakdown.pdf").exists()


def test_a_categorical_sweep_value_splits_the_summary(tmp_path: Path) -> None:
    """``topology.ps: [central, west]``: one summary row per scheme and placement, never the two pooled
    (the first version kept only numeric sweep values apart and averaged the placements)."""
    exp = tmp_path / "ps"
    for ps, wan_ms in (("central", 20.0), ("west", 60.0)):
        write_run(exp / f"ps-{ps}", schemes=("asp", "gsyn"), reps=2, steps=8, wan_ms=wan_ms,
                  manifest={"sweep": {"ps": ps}})
    rep = report(exp, Options(traces=False))
    assert rep.errors == [], rep.errors
    summary = pd.read_csv(exp / "tables" / "summary.csv")
    assert sorted(zip(summary["scheme"], summary["sweep_ps"], strict=True)) == [
        ("asp", "central"), ("asp", "west"), ("gsyn", "central"), ("gsyn", "west")]
    assert set(summary["trials"]) == {2}
    assert "| scheme | ps | trials |" in (exp / "summary.md").read_text()


def test_a_categorical_sweep_value_splits_the_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pooled figures (schemes, convergence, breakdown) are drawn once per placement, each from its
    own trials; the first version drew one ``schemes`` figure averaging central and west."""
    seen: dict[str, list[str]] = {}
    real = figures.schemes

    def spy(trials: pd.DataFrame, out_dir: Path, name: str = "schemes", **kw: Any) -> list[Path]:
        if out_dir == exp / "figures":  # each run's own report draws its own (one placement)
            seen[name] = (sorted(set(trials["sweep_ps"])), sorted(set(trials["scheme"])))
        return real(trials, out_dir, name=name, **kw)

    monkeypatch.setattr(figures, "schemes", spy)
    exp = tmp_path / "ps"
    for ps, wan_ms in (("central", 20.0), ("west", 60.0)):  # as `testbed sweep` lays out ps x schemes
        for scheme in ("asp", "gsyn"):
            write_run(exp / f"ps-{ps}-{scheme}", schemes=(scheme,), reps=2, steps=8, wan_ms=wan_ms,
                      manifest={"sweep": {"ps": ps, "schemes": f'[{{"label": "{scheme}"}}]'}})
    rep = report(exp, Options(traces=False))
    assert rep.errors == [], rep.errors
    # split by placement only: the `schemes` value just names each point's scheme
    assert seen == {"schemes_ps-central": (["central"], ["asp", "gsyn"]),
                    "schemes_ps-west": (["west"], ["asp", "gsyn"])}
    figs = {p.name for p in (exp / "figures").glob("*.pdf")}
    for ps in ("central", "west"):
        assert {f"schemes_ps-{ps}.pdf", f"convergence_loss_ps-{ps}.pdf", f"breakdown_ps-{ps}.pdf"} <= figs
    assert not {"schemes.pdf", "convergence_loss.pdf", "breakdown.pdf"} & figs
    assert "`schemes_ps-west`" in (exp / "summary.md").read_text()


def test_a_figure_an_earlier_report_drew_and_this_one_does_not_is_removed(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A campaign reported after its first placement draws a pooled ``schemes`` figure; once the second
    placement's points land the figures split per placement, and the pooled one (now a mix of nothing the
    records say) must go, while a file the user put in ``figures/`` stays.  The first version left it."""
    exp = tmp_path / "ps"

    def point(ps: str, wan_ms: float) -> None:
        for scheme in ("asp", "gsyn"):
            write_run(exp / f"ps-{ps}-{scheme}", schemes=(scheme,), reps=2, steps=8, wan_ms=wan_ms,
                      manifest={"sweep": {"ps": ps, "schemes": f'[{{"label": "{scheme}"}}]'}})

    point("central", 20.0)
    assert cli.main([str(exp), "--no-trace", "--quiet"]) == 0
    figs = exp / "figures"
    assert (figs / "schemes.png").exists() and (figs / "schemes.pdf").exists()
    (figs / "my_notes.png").write_bytes(b"not the report's")
    capsys.readouterr()
    point("west", 60.0)
    assert cli.main([str(exp), "--no-trace"]) == 0
    out = capsys.readouterr().out
    names = {p.name for p in figs.iterdir()}
    assert {"schemes_ps-central.png", "schemes_ps-west.pdf"} <= names
    assert not {"schemes.png", "schemes.pdf", "convergence_loss.pdf", "breakdown.png"} & names, sorted(names)
    assert "my_notes.png" in names and (figs / "my_notes.png").read_bytes() == b"not the report's"
    assert "figure file(s) an earlier report drew and this one does not: breakdown.pdf" in out, out
    # a report that draws the same again removes nothing
    assert cli.main([str(exp), "--no-trace", "--json"]) == 0
    assert '"removed": []' in capsys.readouterr().out


def test_two_numeric_sweep_values_are_never_pooled_along_an_axis(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A rate x delay grid: the throughput-vs-rate figure is drawn once per delay (and vice versa) from
    that delay's trials alone; seeds pool as repetitions do.  The first version drew one figure per
    axis, averaging both delays at each rate."""
    seen: dict[str, tuple[list[float], int]] = {}
    real = figures.sweep

    def spy(df: pd.DataFrame, x: str, y: str, out_dir: Path, name: str | None = None, **kw: Any) -> list[Path]:
        assert out_dir == exp / "figures"
        other = "sweep_delay_s" if x == "sweep_rate_bps" else "sweep_rate_bps"
        seen[str(name)] = (sorted(set(df[other])), df["sweep_seed"].nunique())
        return real(df, x, y, out_dir, name=name, **kw)

    monkeypatch.setattr(figures, "sweep", spy)
    exp = tmp_path / "grid"
    for rate in (2e7, 4e7):
        for delay in (0.005, 0.02):
            for seed in (1, 2):
                write_run(exp / f"r{rate:g}-d{delay:g}-s{seed}", schemes=("asp",), reps=1, steps=8,
                          wan_ms=delay * 1e3, manifest={"sweep": {"rate_bps": rate, "delay_s": delay, "seed": seed}})
    rep = report(exp, Options(traces=False))
    assert rep.errors == [], rep.errors
    tput = {n: v for n, v in seen.items() if n.startswith("sweep_steps_per_s")}
    assert tput == {"sweep_steps_per_s_vs_rate_bps_delay_s-0.005": ([0.005], 2),
                    "sweep_steps_per_s_vs_rate_bps_delay_s-0.02": ([0.02], 2),
                    "sweep_steps_per_s_vs_delay_s_rate_bps-20000000.0": ([2e7], 2),
                    "sweep_steps_per_s_vs_delay_s_rate_bps-40000000.0": ([4e7], 2)}
    figs = {p.name for p in (exp / "figures").glob("*.pdf")}
    assert "sweep_steps_per_s_vs_rate_bps_delay_s-0.005.pdf" in figs
    assert "sweep_steps_per_s_vs_rate_bps.pdf" not in figs


def test_each_slowdown_of_a_numeric_sweep_gets_its_own_scheme_comparison(tmp_path: Path) -> None:
    """west 1.5x and 3x, one run per point as `testbed sweep` writes them: besides the curves over the
    slowdown, a `schemes` figure per slowdown compares the schemes there.  The first version drew no
    comparison once a numeric value was swept; the next took a value each scheme had one of (as here)
    for a scheme's name and pooled both slowdowns into one figure."""
    exp = tmp_path / "straggler"
    # a partial grid, as campaigns are: at 3x only SSP has run, and no scheme has run at both slowdowns
    for west, scheme in ((1.5, "asp"), (1.5, "gsyn"), (3.0, "ssp")):
        write_run(exp / f"w{west}-{scheme}", schemes=(scheme,), reps=2, steps=8, wan_ms=20.0 * west,
                  manifest={"sweep": {"west": west, "schemes": f'[{{"label": "{scheme}"}}]'}})
    rep = report(exp, Options(traces=False))
    assert rep.errors == [], rep.errors
    figs = {p.name for p in (exp / "figures").glob("*.pdf")}
    assert {"schemes_west-1.5.pdf", "breakdown_west-1.5.pdf", "sweep_steps_per_s_vs_west.pdf"} <= figs, figs
    assert not {"schemes.pdf", "breakdown.pdf", "schemes_west-3.0.pdf"} & figs  # 3x: one scheme, no comparison


def test_report_survives_random_damage(tmp_path: Path) -> None:
    """Seeded damage (truncation, deletion, garbage, wrong types): problems, never failures."""
    import random

    base = write_run(tmp_path / "base", schemes=("gsyn", "pgcs"), reps=1, steps=4)
    rng = random.Random(7)
    for it in range(3):
        d = tmp_path / f"run{it}"
        shutil.copytree(base, d)
        files = sorted(f for f in d.rglob("*") if f.is_file())
        for f in rng.sample(files, k=5):
            data = f.read_bytes()
            act = rng.choice(["trunc", "delete", "garbage", "types"])
            if act == "trunc":
                f.write_bytes(data[: rng.randint(0, len(data))])
            elif act == "delete":
                f.unlink()
            elif act == "garbage":
                f.write_bytes(data[: len(data) // 2] + bytes(rng.randrange(256) for _ in range(40))
                              + data[len(data) // 2:])
            else:
                f.write_bytes(data.replace(b'"step": ', b'"step": null, "z": ')
                              .replace(b'"rank": ', b'"rank": "r", "y": ')
                              .replace(b'"tx_bytes": ', b'"tx_bytes": "many", "w": '))
        rep = report(d, Options(traces=True))
        assert rep.errors == [], rep.errors
        assert rep.summary is not None and rep.summary.exists()


def test_report_compares_per_workload(tmp_path: Path) -> None:
    """Two workloads in one run: a target, a time-to-target, a table and a panel each, never pooled."""
    import json

    import pandas as pd

    from tests.analysis.fakes import write_trial

    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"schemes": ["bsp-ring", "asp", "pgcs"]}))
    for scheme, wl, tgt in (("bsp-ring", "digits", 0.9), ("asp", "digits", 0.9), ("pgcs", "experts", 1.5)):
        for r in range(2):
            write_trial(run / "trials" / f"{scheme}-r{r}", scheme, r, manifest={
                "training": {"workload": {"name": wl}}, "target": {"loss": tgt},
                "lr": {"rule": "linear", "lr": 0.6 if scheme == "bsp-ring" else 0.1},
                "lr_provenance": {"source": "searched" if scheme == "asp" else "given"}})
    rep = report(run, Options(traces=False))
    assert rep.errors == [], rep.errors
    text = (run / "summary.md").read_text()
    assert "Comparisons are per workload" in text
    assert "### Workload digits" in text and "### Workload experts" in text
    assert "held-out loss <= 0.9 (manifest)" in text and "held-out loss <= 1.5 (manifest)" in text
    assert "| run/bsp-ring-r0 | - | 0.6 (linear, given) |" in text and \
        "| run/asp-r1 | - | 0.1 (linear, searched) |" in text
    digits = text.split("### Workload digits")[1].split("### Workload experts")[0]
    assert "bsp-ring" in digits and "asp" in digits and "pgcs" not in digits
    trials = pd.read_csv(run / "tables" / "trials.csv")
    assert set(trials["workload"]) == {"digits", "experts"}
    summary = pd.read_csv(run / "tables" / "summary.csv")
    assert list(summary[["workload", "scheme"]].itertuples(index=False, name=None)) == [
        ("digits", "asp"), ("digits", "bsp-ring"), ("experts", "pgcs")]
    # each trial's time to target against its own workload's target
    metrics = pd.read_csv(run / "tables" / "metrics.csv")
    for _, tr in trials.iterrows():
        m = metrics[(metrics["trial"] == tr["trial"])].sort_values("wall_s")
        tgt = 0.9 if tr["workload"] == "digits" else 1.5
        hit = m[m["loss"] <= tgt]
        expect = float(hit["wall_s"].iloc[0]) if len(hit) else float("nan")
        assert (pd.isna(expect) and pd.isna(tr["time_to_target_s"])) or tr["time_to_target_s"] == expect
    assert (run / "figures" / "convergence_loss.pdf").exists()


def test_figures_say_when_compute_was_emulated(tmp_path: Path) -> None:
    """A figure from an emulated accelerator carries that under it; the layout stays clean."""
    import json

    from testbed.analysis import style
    from tests.analysis.fakes import write_trial

    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"schemes": ["bsp-ring", "asp"]}))
    for scheme in ("bsp-ring", "asp"):
        write_trial(run / "trials" / f"{scheme}-r0", scheme, 0, manifest={
            "compute": {"mode": "emulated", "label": "emulated A100 80GB ResNet-50 v1.5 profile"}})
    style.LAYOUT_LOG = []
    try:
        rep = report(run, Options(traces=False))
        problems = list(style.LAYOUT_LOG)
    finally:
        style.LAYOUT_LOG = None
    assert rep.errors == [], rep.errors
    assert not [p for p in problems if p.startswith(("convergence", "breakdown"))], problems
    assert "Compute: emulated A100 80GB ResNet-50 v1.5 profile." in (run / "summary.md").read_text()


def test_compute_note_is_drawn_under_the_figure(tmp_path: Path) -> None:
    from testbed.analysis import figures

    captured = []
    orig = figures.style.save_figure

    def grab(fig, out_dir, name):  # noqa: ANN001, ANN202
        captured.append([t.get_text() for t in fig.texts] + [fig._supxlabel.get_text() if fig._supxlabel else ""])
        return orig(fig, out_dir, name)

    from testbed.analysis import tables
    from tests.analysis.fakes import write_trial

    write_trial(tmp_path / "t" / "bsp-ring-r0", "bsp-ring", 0)
    t = tables.load(tmp_path / "t" / "bsp-ring-r0")
    figures.style.save_figure = grab
    try:
        figures.convergence(t.metrics, tmp_path / "f", "loss", note="emulated X profile")
        figures.breakdown(tables.step_breakdown(t.spans), tmp_path / "f")
    finally:
        figures.style.save_figure = orig
    assert "compute: emulated X profile" in captured[0]
    assert not any("compute:" in x for x in captured[1])


def test_unfaithful_trials_are_marked_in_summary_and_figures(tmp_path: Path) -> None:
    """A trial whose self-test failed (or whose CPU saturated) is kept, and said to be unfaithful
    in the summary (a section naming why, a per-trial column) and under the aggregate figures."""
    import json

    from testbed.analysis import figures
    from tests.analysis.fakes import write_trial

    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"schemes": ["bsp-ring", "asp"]}))
    write_trial(run / "trials" / "bsp-ring-r0", "bsp-ring", 0, manifest={"faithful": True,
                                                                        "unfaithful_reasons": []})
    why = "self-test: east->west: rate 61.2 Mbit/s, spec 100.0 Mbit/s"
    write_trial(run / "trials" / "asp-r0", "asp", 0, manifest={"faithful": False, "unfaithful_reasons": [why]})
    captured: list[str] = []
    orig = figures.style.save_figure

    def grab(fig, out_dir, name):  # noqa: ANN001, ANN202
        captured.append(f"{name}: {fig._supxlabel.get_text() if fig._supxlabel else ''}")
        return orig(fig, out_dir, name)

    figures.style.save_figure = grab
    try:
        rep = report(run, Options(traces=False))
    finally:
        figures.style.save_figure = orig
    assert rep.errors == [], rep.errors
    summary = (run / "summary.md").read_text()
    assert "**UNFAITHFUL trials: 1 of 2.**" in summary
    assert f"- run/asp-r0: {why}" in summary
    assert "| run/asp-r0 | **NO** |" in summary and "| run/bsp-ring-r0 | yes |" in summary
    marked = [c for c in captured if "UNFAITHFUL: 1 of 2 trials" in c and "asp-r0" in c]
    assert {c.split(":")[0] for c in marked} >= {"convergence_loss", "breakdown"}, captured


def test_trials_without_a_verdict_are_not_called_unfaithful(tmp_path: Path) -> None:
    import json

    from tests.analysis.fakes import write_trial

    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"schemes": ["asp"]}))
    write_trial(run / "trials" / "asp-r0", "asp", 0)  # records from before the self-test existed
    report(run, Options(traces=False))
    summary = (run / "summary.md").read_text()
    assert "UNFAITHFUL" not in summary and "| run/asp-r0 | - |" in summary


def test_scheme_table_says_how_many_trials_reached_the_target() -> None:
    """A mean over the trials that reached the target, when others were cut off first, is the faster
    ones' mean: the table says how many reached it (BSP with a 3x straggler: 2 of 5)."""
    import pandas as pd

    from testbed.analysis.report import _scheme_table
    from testbed.analysis.tables import scheme_summary

    trials = pd.DataFrame({"scheme": ["bsp"] * 5 + ["asp"] * 2,
                           "time_to_target_s": [227.0, 302.0, float("nan"), float("nan"), float("nan"), 70.0, 72.0]})
    lines = _scheme_table(scheme_summary(trials), ["scheme"])
    asp = next(x for x in lines if x.startswith("| asp"))
    bsp = next(x for x in lines if x.startswith("| bsp"))
    assert "reached in 2 of 5" in bsp and "slower than this" in bsp
    assert "reached" not in asp  # every trial reached it: a plain mean
    none = _scheme_table(scheme_summary(trials.assign(time_to_target_s=float("nan"))), ["scheme"])
    assert all("reached" not in x for x in none) and "| bsp | 5 | n/a |" in none[-1]
