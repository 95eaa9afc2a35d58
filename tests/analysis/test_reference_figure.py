"""benchmarks/claims/reference_figure.py: a campaign's figure from its committed per-trial summaries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "claims" / "reference_figure.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_draws_every_scheme_of_a_committed_reference(tmp_path: Path) -> None:
    import pandas as pd

    ref = tmp_path / "ref"
    ref.mkdir()
    t = pd.read_csv(ROOT / "results" / "reference" / "claims_gsyn" / "trials.csv")
    t.to_csv(ref / "trials.csv", index=False)
    res = _run(str(ref), str(tmp_path / "fig" / "schemes"), "--note", "emulated")
    assert res.returncode == 0, res.stderr
    png = tmp_path / "fig" / "schemes.png"
    assert png.stat().st_size > 10_000 and (tmp_path / "fig" / "schemes.pdf").exists()
    # the figure is taller with more schemes: all eight were drawn, not a subset
    t[t["scheme"].isin(["asp", "gsyn"])].to_csv(ref / "trials.csv", index=False)
    assert _run(str(ref), str(tmp_path / "two" / "schemes")).returncode == 0
    from matplotlib.image import imread
    assert imread(png).shape[0] > 1.5 * imread(tmp_path / "two" / "schemes.png").shape[0]


def test_a_folder_without_a_trials_table_is_refused_with_exit_2(tmp_path: Path) -> None:
    res = _run(str(tmp_path), str(tmp_path / "x"))
    assert res.returncode == 2 and "trials.csv" in res.stderr and not list(tmp_path.glob("x*"))
    (tmp_path / "trials.csv").write_text("a,b\n1,2\n")
    res = _run(str(tmp_path), str(tmp_path / "x"))
    assert res.returncode == 2 and "no column" in res.stderr
