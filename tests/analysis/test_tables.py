"""Tidy tables: shapes, definitions of the per-step breakdown, damage tolerance."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from testbed.analysis import tables as T
from tests.analysis.fakes import truncate_run, write_run

MS = 1_000_000


def _span(ts_ms: float, dur_ms: float, phase: str, step: int | None, role: str = "worker",
          rank: int = 0, **extra: object) -> dict:
    rec = {"ts": int(ts_ms * MS), "dur": int(dur_ms * MS), "host": f"h{rank}", "dc": "dc1",
           "rank": rank, "role": role, "phase": phase, "step": step}
    rec.update(extra)
    return rec


def _trial(tmp: Path, spans: list[dict], name: str = "pgcs-r0") -> Path:
    d = tmp / "trials" / name
    (d / "events").mkdir(parents=True)
    by: dict[str, list[dict]] = {}
    for s in spans:
        by.setdefault(f"{s['host']}.{s['role']}.{s['rank']}", []).append(s)
    for k, v in by.items():
        (d / "events" / f"{k}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in v))
    return d


def test_interval_helpers() -> None:
    u = T._union(np.array([0.0, 1.0, 5.0]), np.array([2.0, 3.0, 6.0]))
    assert u[0].tolist() == [0.0, 5.0] and u[1].tolist() == [3.0, 6.0]
    a = (np.array([0.0, 5.0]), np.array([3.0, 6.0]))
    b = (np.array([1.0]), np.array([5.5]))
    assert T._intersect(a, b)[0].tolist() == [1.0, 5.0]
    assert T._intersect(a, b)[1].tolist() == [3.0, 5.5]
    d = T._subtract(a, b)
    assert d[0].tolist() == [0.0, 5.5] and d[1].tolist() == [1.0, 6.0]
    m = T._measure_in(a, np.array([0.0, 2.0, 4.0]), np.array([10.0, 5.5, 4.5]))
    assert m.tolist() == pytest.approx([4.0, 1.5, 0.0])


def test_step_breakdown_definitions(tmp_path: Path) -> None:
    """PGCS-like rank: wait on the comm thread is exposed sync; overlap with compute is hidden."""
    spans = [
        _span(0, 40, "compute", 0),
        _span(40, 30, "wan_sync", 0, role="comm"),        # fully hidden behind step 1 compute
        _span(40, 40, "compute", 1),                        # step 1 compute
        _span(80, 20, "wan_sync", 1, role="comm"),
        _span(80, 20, "wait", 2),                          # blocked on comm: exposed sync
        _span(100, 10, "wait", 2),                         # comm idle: plain waiting
        _span(110, 40, "compute", 2),
    ]
    t = T.load(_trial(tmp_path, spans))
    st = T.step_breakdown(t.spans).set_index("step")
    assert st.loc[0, "step_s"] == pytest.approx(0.040)
    assert st.loc[0, "compute_s"] == pytest.approx(0.040)
    assert st.loc[1, "hidden_sync_s"] == pytest.approx(0.030)
    assert st.loc[1, "exposed_sync_s"] == pytest.approx(0.0)
    assert st.loc[2, "exposed_sync_s"] == pytest.approx(0.020)
    assert st.loc[2, "wait_s"] == pytest.approx(0.010)
    assert st.loc[2, "compute_s"] == pytest.approx(0.040)
    assert (st["other_s"] >= 0).all()


def test_compute_utilization_counts_time_outside_steps_as_idle() -> None:
    """Two workers over a 1 s trial: one computes 0.6 s, the other 0.2 s and then sits idle (no step
    spans): utilization is (0.6 + 0.2) / (2 x 1 s) = 0.4, while the per-step compute share would
    read the second worker's steps only."""
    steps = pd.DataFrame({"rank": [0, 0, 1], "step": [0, 1, 0], "compute_s": [0.3, 0.3, 0.2]})
    assert T.compute_utilization(steps, 1.0) == pytest.approx(0.4)
    assert math.isnan(T.compute_utilization(steps, 0.0))
    assert math.isnan(T.compute_utilization(steps.iloc[0:0], 1.0))


def test_run_tables(run_dir: Path) -> None:
    t = T.load(run_dir)
    assert t.problems == []
    assert t.kind == "run"
    assert set(t.trials["scheme"]) >= {"bsp-ring", "asp", "gsyn", "pgcs-blp"}
    assert {"run", "trial", "scheme", "rep", "ts", "dur", "phase", "start_s"} <= set(t.spans.columns)
    tabs = T.all_tables(t)
    trials = tabs["trials"]
    assert len(trials) == len(t.trials)
    assert trials["steps_per_s"].gt(0).all()
    stale = trials.set_index("trial")["mean_staleness"]
    assert stale["asp-r0"] >= 0 and math.isnan(stale["bsp-ring-r0"])
    assert trials["wan_bytes"].gt(0).all()
    lr = tabs["link_rates"]
    assert set(lr["direction"]) == {"dc1->dc2", "dc2->dc1"}
    # each direction measured on its own egress: rx-derived duplicates dropped
    per = lr.groupby(["trial", "direction", "t_s"]).size()
    assert (per == 1).all()
    summ = tabs["summary"]
    assert {"time_to_target_s", "time_to_target_s_ci95", "exposed_sync_share",
            "compute_utilization", "compute_utilization_ci95"} <= set(summ.columns)
    util = trials["compute_utilization"]
    assert util.between(0, 1).all() and util.gt(0).all(), util
    skew = trials["start_skew_s"]
    assert skew.ge(0).all() and skew.lt(trials["duration_s"]).all(), skew
    # below the per-step compute share: the trial's wall time includes time outside any step
    assert (util <= trials["compute_share"] + 1e-9).all()


def test_link_rates_from_counters() -> None:
    links = pd.DataFrame([
        {"trial": "x", "ts": 0, "node": "r1", "ifname": "e1", "link": "a->b", "tx_bytes": 0,
         "rx_bytes": 0, "qdisc_backlog_bytes": 10, "qdisc_drops": 0},
        {"trial": "x", "ts": 100 * MS, "node": "r1", "ifname": "e1", "link": "a->b",
         "tx_bytes": 1_250_000, "rx_bytes": 125_000, "qdisc_backlog_bytes": 0, "qdisc_drops": 1},
    ])
    lr = T.link_rates(links).set_index("direction")
    assert lr.loc["a->b", "rate_bps"] == pytest.approx(100e6)
    assert lr.loc["b->a", "rate_bps"] == pytest.approx(10e6)   # only one end sampled: rx kept
    assert lr.loc["a->b", "backlog_bytes"] == 10
    assert math.isnan(lr.loc["b->a", "backlog_bytes"])


def test_truncated_run_reports_problems(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", schemes=("bsp-ring", "asp", "gsyn"), reps=2, steps=6)
    truncate_run(run)
    t = T.load(run)
    text = "\n".join(t.problems)
    assert "last line truncated" in text
    assert "metrics.csv: missing" in text
    assert "procs.jsonl: missing" in text
    assert "manifest.json: unreadable" in text
    tabs = T.all_tables(t)
    assert len(tabs["trials"]) == 6
    # the trial without metrics has no time to target, but still a throughput
    row = tabs["trials"].set_index("trial").loc["asp-r1"]
    assert math.isnan(row["time_to_target_s"]) and row["steps_per_s"] > 0


def test_empty_and_unknown_dirs(tmp_path: Path) -> None:
    t = T.load(tmp_path)
    assert t.kind == "unknown" and t.problems
    (tmp_path / "run" / "trials" / "asp-r0").mkdir(parents=True)
    t = T.load(tmp_path / "run")
    assert any("events/*.jsonl: missing" in p for p in t.problems)
    tabs = T.all_tables(t)  # nothing to compute, but no exception
    assert tabs["steps"].empty and len(tabs["trials"]) == 1


def test_experiment_tables_and_write(sweep_experiment: Path, tmp_path: Path) -> None:
    t = T.load(sweep_experiment)
    assert t.kind == "experiment"
    assert set(t.trials["run"]) == {"g1", "g2", "g4"}
    assert set(t.trials["sweep_groups"]) == {1, 2, 4}
    tabs = T.all_tables(t)
    paths, problems = T.write_tables(tabs, tmp_path / "tables")
    assert problems == []
    names = {p.name for p in paths}
    assert {"spans.csv", "spans.parquet", "summary.csv", "steps.parquet"} <= names
    back = pd.read_parquet(tmp_path / "tables" / "trials.parquet")
    assert len(back) == len(tabs["trials"])


def test_ci95() -> None:
    mean, hw, n = T.ci95([1.0, 2.0, 3.0])
    assert (mean, n) == (2.0, 3)
    assert hw == pytest.approx(4.303 * 1.0 / math.sqrt(3), rel=1e-4)
    assert math.isnan(T.ci95([5.0])[1])
    assert T.ci95([])[2] == 0


@pytest.mark.parametrize("df,quantile", [(1, 12.706), (4, 2.776), (11, 2.201), (25, 2.060), (40, 2.021),
                                         (200, 1.972)])
def test_t_quantile_is_exact_for_every_degree_of_freedom(df: int, quantile: float) -> None:
    """The old table gave df 11 the value of 12 (2.179) and everything past 30 the normal 1.96: too narrow."""
    assert T.t95(df) == pytest.approx(quantile, abs=5e-4)


def test_ci95_ignores_what_is_not_a_number() -> None:
    vals = [1.0, 2.5, 2.0, 4.0, 3.0, 2.2, 1.9, 2.8, 3.3, 2.1, 2.6, 3.1]  # n = 12, df = 11
    mean, hw, n = T.ci95(vals + [float("nan"), None, "x"])
    assert n == 12
    assert hw == pytest.approx(2.201 * float(np.std(vals, ddof=1)) / math.sqrt(12), rel=1e-3)


def test_time_to_target_is_the_first_evaluation_reaching_it() -> None:
    m = pd.DataFrame({"wall_s": [3.0, 1.0, 2.0, 4.0], "loss": [0.5, 2.0, 0.9, 0.4], "acc": [0.8, 0.1, 0.6, 0.9]})
    assert T.time_to_target(m, 1.0, None) == 2.0  # sorted by time: 1.0 -> 2.0, first <= 1.0 at 2 s
    assert T.time_to_target(m, None, 0.85) == 4.0
    assert math.isnan(T.time_to_target(m, 0.1, None)) and math.isnan(T.time_to_target(m.iloc[:0], 1.0, None))
