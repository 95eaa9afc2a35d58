"""``testbed report`` on clean, crashed and swept results, through the CLI entry points."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from testbed.analysis import cli
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
