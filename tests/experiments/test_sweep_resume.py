"""A sweep of 8 points interrupted half-way and resumed redoes no finished point (real runs)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import yaml

from testbed.experiments.sweep import run_sweep

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.torch,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


def test_interrupted_sweep_resumes_without_redoing(tmp_path: Path) -> None:
    exp = {
        "name": "sw",
        "topology": {"name": "tiny", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
                     "links": [{"a": "a", "b": "b", "rate": "50Mbit"}]},
        "impairment": "none",
        "timeout": "60s",
        "training": {"workload": {"name": "synthetic", "grad_bytes": 4096, "compute_s": 0.001},
                     "stop": {"steps": 3}, "eval_every": 3},
        "schemes": [{"label": "bsp", "scheme": {"name": "bsp"}}],
        "collectors": {"links": False, "procs": False, "trace": False},
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp))
    sweep = {"name": "sw", "experiment": "exp.yaml",
             "grid": {"wan.rate": ["20Mbit", "40Mbit"], "wan.delay": ["0ms", "1ms"], "seed": [1, 2]}}
    sp = tmp_path / "sweep.yaml"
    sp.write_text(yaml.safe_dump(sweep))
    out = tmp_path / "out"
    logs: list[str] = []
    # --only seed=1 picks 4 of the 8 points; "interrupted" after 3 of them
    run_sweep(sp, out, log=logs.append, limit=3, only=["seed=1"])
    done_first = {p.parent.name: p.stat().st_mtime_ns for p in (out / "points").glob("*/done.json")}
    assert len(done_first) == 3
    assert all(json.loads((out / "points" / n / "done.json").read_text())["point"]["seed"] == 1 for n in done_first)
    # a point that was half-way when interrupted (no done.json) is redone from scratch
    (out / "points" / "half-done-point").mkdir()
    logs.clear()
    run_sweep(sp, out, log=logs.append)
    done = {p.parent.name: p.stat().st_mtime_ns for p in (out / "points").glob("*/done.json")}
    assert len(done) == 8
    for name, mtime in done_first.items():
        assert done[name] == mtime, f"finished point {name} was redone"
    assert sum("done already, skipped" in m for m in logs) == 3  # the whole sweep resumes past --only's points
    for p in (out / "points").glob("*/done.json"):
        assert json.loads(p.read_text())["failed"] == []
    # every point's manifests carry its values in SI units, and sweep.csv has one row per point
    for p in (out / "points").glob("*/done.json"):
        run_m = json.loads((p.parent / "manifest.json").read_text())
        trial_m = json.loads((p.parent / "trials" / "bsp-r0" / "manifest.json").read_text())
        assert run_m["sweep"] == trial_m["sweep"]
        assert set(run_m["sweep"]) == {"rate_bps", "delay_s", "seed"}
        assert run_m["sweep"]["rate_bps"] in (20e6, 40e6) and run_m["sweep"]["delay_s"] in (0.0, 0.001)
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    assert len(rows) == 8 and {r["scheme"] for r in rows} == {"bsp"}
    assert {(float(r["rate_bps"]), float(r["delay_s"]), int(r["seed"])) for r in rows} == {
        (r, d, s) for r in (20e6, 40e6) for d in (0.0, 0.001) for s in (1, 2)}
    assert all(float(r["steps_per_s"]) > 0 for r in rows)
    figs = {p.name for p in (out / "points" / "figures").glob("sweep_steps_per_s_vs_*.pdf")}
    # one figure per rate axis and delay (seeds pool as repetitions), never the two delays averaged
    assert {"sweep_steps_per_s_vs_rate_bps_delay_s-0.0.pdf", "sweep_steps_per_s_vs_rate_bps_delay_s-0.001.pdf",
            "sweep_steps_per_s_vs_delay_s_rate_bps-20000000.0.pdf"} <= figs, figs
    assert "sweep_steps_per_s_vs_rate_bps.pdf" not in figs
