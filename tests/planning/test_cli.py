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
    for scheme in ("blp", "ring", "ring_best", "hierarchical", "star"):
        assert f"\n  {scheme} " in out


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
