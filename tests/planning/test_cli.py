"""``testbed blp-plan`` on the bundled topologies: text, JSON, --out/--check, bad input -> exit 2."""

from __future__ import annotations

import argparse
import json

import pytest

from testbed.planning import cli
from testbed.planning.model import Plan

topologies = pytest.importorskip("topologies")


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="testbed")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.register(sub)
    args = parser.parse_args(list(argv))
    return args.func(args)


@pytest.mark.parametrize("topo", ["two_dc", "three_dc_triangle", "geo_wan", "star"])
def test_text_report_on_bundled_topologies(topo, capsys):
    assert _run("blp-plan", topo, "--size", "100MB") == 0
    out = capsys.readouterr().out
    assert f"BLP plan for {topo}" in out and "predicted:" in out
    for scheme in ("blp", "ring", "ring_best", "ring_relay", "tree_best", "blink", "hierarchical", "star"):
        assert f"\n  {scheme} " in out
    assert "best baseline: " in out


def test_json_on_triangle_beats_ring_and_spares_slow_link(capsys):
    assert _run("blp-plan", "three_dc_triangle", "--size", "100MB", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    plan = Plan.from_dict(data["plan"])
    topo = topologies.load("three_dc_triangle")
    slow = min(topo.links, key=lambda lk: lk.forward.rate_bps)
    loads = plan.link_bytes()
    fast = [loads[(lk.a, lk.b)] for lk in topo.links if lk is not slow]
    assert loads[(slow.a, slow.b)] < min(fast)
    assert plan.predicted_time_s < data["baselines"]["ring"]["time_s"]
    assert plan.predicted_time_s <= 0.75 * data["baselines"]["ring"]["time_s"]


def test_json_reports_every_baseline_with_detail(capsys):
    assert _run("blp-plan", "three_dc_triangle", "--size", "8MB", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    base = data["baselines"]
    assert set(base) == {"ring_relay", "tree_best", "blink", "hierarchical", "star", "ring_best", "ring"}
    for name, c in base.items():
        assert c["name"] == name and c["time_s"] > 0 and c["detail"], name
        assert c["time_s"] == pytest.approx(c["bandwidth_time_s"] + c["latency_time_s"])
    assert base["ring_relay"]["routes"]["west->east"] == ["west", "central", "east"]
    assert base["tree_best"]["trees"][0]["root"] == "central"
    assert base["blink"]["executor"] == "BlpAllReduce" and base["ring"]["executor"] == "dist.all_reduce"
    assert data["plan"]["predicted_time_s"] <= min(c["time_s"] for c in base.values()) * (1 + 1e-9)


def test_mip_and_chunks(capsys):
    assert _run("blp-plan", "geo_wan", "--size", "64MiB", "--mip", "--chunks", "40", "--json") == 0
    plan = Plan.from_dict(json.loads(capsys.readouterr().out)["plan"])
    assert plan.solver.startswith("mip") and sum(t.chunks for t in plan.trees) == 40


def test_out_then_check_round_trip(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert _run("blp-plan", "three_dc_triangle", "--size", "10MB", "--out", str(out)) == 0
    capsys.readouterr()
    assert _run("blp-plan", "three_dc_triangle", "--size", "10MB", "--check", str(out)) == 0
    assert "checked against three_dc_triangle" in capsys.readouterr().out


def test_plan_naming_missing_link_exits_2(tmp_path, capsys):
    topo = tmp_path / "vee.yaml"  # east-central and east-west; no central-west link
    topo.write_text("name: vee\ndcs: [east, central, west]\nlinks:\n"
                    "  - {a: east, b: central, rate: 100Mbit, delay: 5ms}\n"
                    "  - {a: east, b: west, rate: 100Mbit, delay: 5ms}\n")
    plan = {"format": "blp-plan/1", "dcs": ["east", "central", "west"], "size_bytes": 1000000, "chunks": 4,
            "trees": [{"root": "east", "parents": {"central": "west", "west": "east"}, "share": 1.0, "chunks": 4}]}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(plan))
    assert _run("blp-plan", str(topo), "--size", "1MB", "--check", str(bad)) == 2
    err = capsys.readouterr().err
    assert "plan.trees[0].parents.central" in err and "central->west" in err and "lacks" in err


@pytest.mark.parametrize("argv, field", [
    (["two_dc", "--size", "0"], "size"),
    (["two_dc", "--size", "-3"], "size"),
    (["two_dc", "--size", "lots"], "size"),
    (["two_dc", "--size", "1MB", "--chunks", "0"], "chunks"),
    (["no_such_topology", "--size", "1MB"], "topology"),
])
def test_bad_input_exits_2_naming_field(argv, field, capsys):
    assert _run("blp-plan", *argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {field}")


def test_disconnected_topology_exits_2(tmp_path, capsys):
    p = tmp_path / "split.yaml"
    p.write_text("name: split\ndcs: [aa, bb, cc, dd]\nlinks:\n"
                 "  - {a: aa, b: bb, rate: 100Mbit, delay: 5ms}\n"
                 "  - {a: cc, b: dd, rate: 100Mbit, delay: 5ms}\n")
    assert _run("blp-plan", str(p), "--size", "1MB") == 2
    assert "disconnected" in capsys.readouterr().err


def test_wired_into_testbed_cli(capsys):
    main = pytest.importorskip("testbed.cli").main
    assert main(["blp-plan", "two_dc", "--size", "1MB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["dcs"] == ["east", "west"]


def test_allreduce_schemes_benchmark_imports_and_renders():
    """The benchmark needs root to run; its module, --help and table must work without."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    from testbed.planning.baselines import baselines
    from testbed.planning.bench import executable_specs
    from testbed.planning.solver import plan_blp

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "allreduce_schemes.py"
    spec = importlib.util.spec_from_file_location("allreduce_schemes", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    help_out = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=60)
    assert help_out.returncode == 0 and "ring_relay" in help_out.stdout
    topo = topologies.load("three_dc_triangle")
    g = topo.dc_graph()
    plan = plan_blp(g, 8_000_000, path=topo.path)
    base = baselines(g, 8_000_000, path=topo.path, chunks=plan.chunks)
    specs = executable_specs(base, 0.1)
    assert "ring_best" not in specs and {"ring_relay", "tree_best", "blink", "hierarchical", "star", "ring"} <= set(specs)
    res = {k: {"median_s": s["predicted_s"] * 1.05, "predicted_s": s["predicted_s"], "measured_over_predicted": 1.05,
               "over_blp": 1.0} for k, s in {"blp": {"predicted_s": plan.predicted_time_s + 0.1}, **specs}.items()}
    table = mod.render("three_dc_triangle", 1.0, 6, 8_000_000, "netem", res, plan.predicted_time_s, 0.1, base)
    for name in ("blp", "tree_best", "blink", "ring_relay", "star", "hierarchical", "ring", "ring_best"):
        assert f"\n{name} " in table
    assert "predicted only" in table and "ok" in table
